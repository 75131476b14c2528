// Per-layer profile: the log table and profile.h5 (see runtime/profile.h).
#include "hymoe/runtime/profile.h"

#include <cstdio>
#include <vector>

#include "hymoe/core/log.h"
#include "hymoe/io/h5.h"
#include "hymoe/io/meta.h"

namespace hymoe::runtime {

std::string profile_table(const model::ModelConfig& cfg, const model::ForwardStats& stats) {
    double total = stats.head_seconds;
    for (size_t i = 0; i < stats.mixer_seconds.size(); ++i)
        total += stats.mixer_seconds[i] + stats.ffn_seconds[i];
    char line[160];
    std::string out = "per-layer wall time (all forward steps):\n";
    std::snprintf(line,
                  sizeof line,
                  "  %5s  %-5s %10s  %-10s %10s  %7s\n",
                  "layer",
                  "mixer",
                  "seconds",
                  "ffn",
                  "seconds",
                  "share");
    out += line;
    for (size_t i = 0; i < stats.mixer_seconds.size(); ++i) {
        const model::LayerSpec& spec = cfg.layers[i];
        const double s = stats.mixer_seconds[i] + stats.ffn_seconds[i];
        std::snprintf(line,
                      sizeof line,
                      "  %5zu  %-5s %10.4f  %-10s %10.4f  %6.1f%%\n",
                      i,
                      model::to_string(spec.mixer),
                      stats.mixer_seconds[i],
                      model::to_string(spec.ffn),
                      stats.ffn_seconds[i],
                      total > 0 ? 100 * s / total : 0.0);
        out += line;
    }
    std::snprintf(line,
                  sizeof line,
                  "  embedding + head %.4f s; attention layers: indexer %.4f s, rest %.4f s\n",
                  stats.head_seconds,
                  stats.attn.indexer_seconds,
                  stats.attn.attention_seconds);
    return out + line;
}

void write_profile(const Job& job, const parallel::Grid& grid, const model::ForwardStats& stats) {
    const std::string path = job.deck.job.output + "/profile.h5";
    io::H5Writer file(path, grid.comms.world);
    io::write_meta(file, {&job.deck, job.layout, model::describe(job.model), log::utc_timestamp()});
    std::vector<std::string> mixer, ffn;
    for (const model::LayerSpec& spec : job.model.layers) {
        mixer.emplace_back(model::to_string(spec.mixer));
        ffn.emplace_back(model::to_string(spec.ffn));
    }
    file.strings("/layers/mixer", mixer);
    file.strings("/layers/ffn", ffn);
    auto seconds = [&](const std::string& name, std::vector<double> v) {
        std::vector<float> f(v.begin(), v.end());
        file.array(name,
                   Tensor{f.data(), DType::f32, Device::cpu, {static_cast<int64_t>(f.size())}});
        file.attr(name, "unit", "s");
    };
    seconds("/layers/mixer_seconds", stats.mixer_seconds);
    seconds("/layers/ffn_seconds", stats.ffn_seconds);
    seconds("/attention/indexer_seconds", {stats.attn.indexer_seconds});
    seconds("/attention/other_seconds", {stats.attn.attention_seconds});
    seconds("/head_seconds", {stats.head_seconds});
    file.commit();
}

}  // namespace hymoe::runtime
