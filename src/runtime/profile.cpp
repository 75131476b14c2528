// Per-layer and per-expert profile: combined over ranks, the log tables and profile.h5 (see
// runtime/profile.h).
#include "hymoe/runtime/profile.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <vector>

#include "host_view.h"
#include "hymoe/backend/ops.h"
#include "hymoe/core/log.h"
#include "hymoe/core/timer.h"
#include "hymoe/io/h5.h"
#include "hymoe/io/meta.h"
#include "hymoe/model/kda.h"
#include "hymoe/model/kv_cache.h"

namespace hymoe::runtime {

namespace {

bool any_moe(const model::ModelConfig& cfg) {
    return count_layers(cfg, model::Ffn::moe) + count_layers(cfg, model::Ffn::latent_moe) > 0;
}

// The vision encoder's figures: every first-stage rank encodes its replica's images (the tower is
// replicated over tp), so sums over the world are divided by tp.
void gather_vision(const Job& job,
                   const parallel::Grid& grid,
                   model::Model& model,
                   const model::VisionStats& mine,
                   JobProfile& p) {
    if (!job.model.vision.present)
        return;
    const comm::Comm& all = grid.comms.world;
    std::vector<float> sums{static_cast<float>(mine.seconds),
                            static_cast<float>(mine.flops),
                            static_cast<float>(mine.images),
                            static_cast<float>(mine.patches),
                            static_cast<float>(mine.tokens)};
    Tensor t = view_of(sums, DType::f32);
    comm::all_reduce(t, all);
    const auto tp = static_cast<float>(job.layout.tp);
    model::VisionStats& v = p.vision;
    v.seconds = sums[0] / tp, v.flops = sums[1] / tp;
    v.images = std::llround(sums[2] / tp), v.patches = std::llround(sums[3] / tp);
    v.tokens = std::llround(sums[4] / tp);
    v.peak_act_bytes = comm::all_reduce_value(mine.peak_act_bytes, all, comm::ReduceOp::max);
    int64_t bytes = 0;
    for (const model::TensorSpec& s : model::model_tensors(model))
        if (s.name.starts_with("vision_tower.") || s.name.starts_with("multi_modal_projector."))
            bytes += static_cast<int64_t>(s.dest->view().bytes());  // at its storage dtype
    p.vision_weight_bytes = comm::all_reduce_value(bytes, all, comm::ReduceOp::max);
}

}  // namespace

LayerMemory layer_memory(
    const model::Model& m, int page_tokens, DType kv_dtype, int64_t peak_pages, int64_t peak_seqs) {
    const size_t L = m.cfg.layers.size();
    LayerMemory out{std::vector<int64_t>(L, 0), std::vector<int64_t>(L, 0)};
    int64_t kda_bytes = 0;  // one sequence's state and conv tails in one KDA layer
    if (count_layers(m.local, model::Mixer::kda) > 0) {
        const model::KdaState st = model::make_kda_state(m.local);
        for (const Buffer* b : {&st.S, &st.q_tail, &st.k_tail, &st.v_tail})
            kda_bytes += b->view().bytes();
    }
    for (int i = m.shard.first_layer; i < m.shard.end_layer; ++i) {
        const model::Mixer mixer = m.cfg.layers[i].mixer;
        out.kv_bytes[i] = peak_pages * page_tokens * model::kv_row_floats(m.local, mixer) *
                          static_cast<int64_t>(dtype_size(kv_dtype));
        out.kda_state_bytes[i] = mixer == model::Mixer::kda ? peak_seqs * kda_bytes : 0;
    }
    return out;
}

Peaks measure_peaks() {
    Peaks p;
    const int64_t n = 512;
    std::vector<float> a(static_cast<size_t>(n * n), 1.0f), c(a.size());
    const int64_t bytes = int64_t{256} << 20;
    std::vector<char> zeros(static_cast<size_t>(bytes), 0);  // memchr scans it all: vector loads
    for (int rep = 0; rep < 3; ++rep) {
        double t0 = wall_seconds();
        ops::gemm(false, false, n, n, n, 1.0f, a.data(), n, a.data(), n, 0.0f, c.data(), n);
        p.gemm_gflops = std::max(p.gemm_gflops, 2.0 * n * n * n / (wall_seconds() - t0) / 1e9);
        t0 = wall_seconds();
        const void* volatile hit = std::memchr(zeros.data(), 1, zeros.size());
        static_cast<void>(hit);
        p.read_gb_s =
            std::max(p.read_gb_s, static_cast<double>(bytes) / (wall_seconds() - t0) / 1e9);
    }
    return p;
}

JobProfile gather_profile(const Job& job,
                          const parallel::Grid& grid,
                          model::Model& model,
                          const model::ForwardStats& mine,
                          const Peaks& peaks,
                          const LayerMemory& memory) {
    const auto L = static_cast<int64_t>(job.model.layers.size());
    const int64_t E = job.model.moe.n_routed_experts, world = job.layout.world();
    const comm::Comm& all = grid.comms.world;
    JobProfile p;
    // [L mixer, L ffn, L dispatch, L combine seconds, head, indexer, attention, pipeline seconds,
    // L GEMM FLOPs, L weight bytes, L GEMM seconds], summed over ranks
    std::vector<float> secs(static_cast<size_t>(7 * L + 4), 0.0f);
    for (int64_t i = 0; i < L && i < static_cast<int64_t>(mine.layer_flops.size()); ++i)
        secs[4 * L + 4 + i] = static_cast<float>(mine.layer_flops[i]);
    for (int64_t i = 0; i < L && i < static_cast<int64_t>(mine.layer_gemm_seconds.size()); ++i)
        secs[6 * L + 4 + i] = static_cast<float>(mine.layer_gemm_seconds[i]);
    const std::string layers = "model.layers.";
    for (const model::TensorSpec& t : model::model_tensors(model))
        if (t.name.starts_with(layers))
            secs[5 * L + 4 + std::stoll(t.name.substr(layers.size()))] +=
                static_cast<float>(t.dest->view().bytes());  // at its storage dtype
    for (int64_t i = 0; i < L && i < static_cast<int64_t>(mine.mixer_seconds.size()); ++i) {
        secs[i] = static_cast<float>(mine.mixer_seconds[i]);
        secs[L + i] = static_cast<float>(mine.ffn_seconds[i]);
        secs[2 * L + i] = static_cast<float>(mine.moe[i].dispatch_seconds);
        secs[3 * L + i] = static_cast<float>(mine.moe[i].combine_seconds);
    }
    secs[4 * L] = static_cast<float>(mine.head_seconds);
    secs[4 * L + 1] = static_cast<float>(mine.attn.indexer_seconds);
    secs[4 * L + 2] = static_cast<float>(mine.attn.attention_seconds);
    secs[4 * L + 3] = static_cast<float>(mine.pipeline_seconds);
    // every rank's own seconds in its row, the other rows 0: the sum over ranks is the table
    p.rank_layer_seconds.assign(static_cast<size_t>(world * 4 * L), 0.0f);
    p.rank_seconds.assign(static_cast<size_t>(world * 4), 0.0f);
    std::copy(secs.begin(), secs.begin() + 4 * L, p.rank_layer_seconds.begin() + grid.rank * 4 * L);
    std::copy(
        secs.begin() + 4 * L, secs.begin() + 4 * L + 4, p.rank_seconds.begin() + grid.rank * 4);
    Tensor rl = view_of(p.rank_layer_seconds, DType::f32), rs = view_of(p.rank_seconds, DType::f32);
    comm::all_reduce(rl, all);
    comm::all_reduce(rs, all);
    Tensor st = view_of(secs, DType::f32);
    comm::all_reduce(st, all);
    const float per_stage = static_cast<float>(job.layout.tp * job.layout.dp);
    for (float& s : secs)
        s /= per_stage;  // each layer runs on the tp·dp ranks of its stage
    model::ForwardStats& m = p.mean;
    m.mixer_seconds.assign(secs.begin(), secs.begin() + L);
    m.ffn_seconds.assign(secs.begin() + L, secs.begin() + 2 * L);
    m.layer_gemm_seconds.assign(secs.begin() + 6 * L + 4, secs.begin() + 7 * L + 4);
    p.dispatch_seconds.assign(secs.begin() + 2 * L, secs.begin() + 3 * L);
    p.combine_seconds.assign(secs.begin() + 3 * L, secs.begin() + 4 * L);
    m.head_seconds = secs[4 * L], m.attn.indexer_seconds = secs[4 * L + 1];
    m.attn.attention_seconds = secs[4 * L + 2];
    m.pipeline_seconds = secs[4 * L + 3];
    // roofline: GEMM FLOPs per weight byte read, against the machine's FLOP-per-byte ridge;
    // rank 0's peaks on every rank, so that all ranks agree on each layer's bound (a string of
    // another length would give the ranks different profile.h5 layouts)
    std::vector<float> peak{static_cast<float>(peaks.gemm_gflops),
                            static_cast<float>(peaks.read_gb_s)};
    Tensor pt = view_of(peak, DType::f32);
    comm::broadcast(pt, 0, all);
    p.peaks = {peak[0], peak[1]};
    const double steps =
        static_cast<double>(comm::all_reduce_value(mine.steps, all, comm::ReduceOp::max));
    const double ridge = p.peaks.gemm_gflops / std::max(p.peaks.read_gb_s, 1e-9);
    for (int64_t i = 0; i < L; ++i) {
        const double s = std::max(static_cast<double>(secs[i] + secs[L + i]), 1e-12);
        const double flops = static_cast<double>(secs[4 * L + 4 + i]);
        const double bytes = static_cast<double>(secs[5 * L + 4 + i]) * steps;
        p.gflops.push_back(static_cast<float>(flops / s / 1e9));
        p.weight_gb_s.push_back(static_cast<float>(bytes / s / 1e9));
        const bool comm_bound = static_cast<double>(secs[2 * L + i] + secs[3 * L + i]) / s > 0.5;
        p.bound.emplace_back(comm_bound                              ? "comm"
                             : flops / std::max(bytes, 1.0) >= ridge ? "compute"
                                                                     : "memory");
    }
    gather_vision(job, grid, model, mine.vision, p);
    p.memory = memory;
    p.memory.kv_bytes.resize(static_cast<size_t>(L), 0);
    p.memory.kda_state_bytes.resize(static_cast<size_t>(L), 0);
    Tensor kv = view_of(p.memory.kv_bytes, DType::i64, {L}),
           kda = view_of(p.memory.kda_state_bytes, DType::i64, {L});
    comm::all_reduce(kv, all, comm::ReduceOp::max);
    comm::all_reduce(kda, all, comm::ReduceOp::max);
    if (!any_moe(job.model))
        return p;

    // load: every rank adds its experts' assignments and fills its own column of the rank table;
    // an expert's etp parts compute the same assignments, so the expert sums are divided by etp
    p.tokens_per_expert.assign(static_cast<size_t>(L * E), 0);
    p.tokens_per_rank.assign(static_cast<size_t>(L * world), 0);
    for (int64_t i = 0; i < L && i < static_cast<int64_t>(mine.moe.size()); ++i) {
        const std::vector<int64_t>& t = mine.moe[i].tokens_per_expert;
        for (size_t e = 0; e < t.size() && static_cast<int64_t>(e) < E; ++e)
            p.tokens_per_expert[i * E + e] += t[e];
        p.tokens_per_rank[i * world + grid.rank] = std::accumulate(t.begin(), t.end(), int64_t{0});
    }
    p.remote_bytes.assign(static_cast<size_t>(L), 0);
    for (int64_t i = 0; i < L && i < static_cast<int64_t>(mine.moe.size()); ++i) {
        const model::MoeCommStats& s = mine.moe[i];
        if (s.dispatch_rows > 0)  // combine sends back as many rows as dispatch sent
            p.remote_bytes[i] =
                2 * (s.dispatch_rows - s.self_rows) * (s.dispatch_bytes / s.dispatch_rows);
    }
    Tensor te = view_of(p.tokens_per_expert, DType::i64, {L * E}),
           tr = view_of(p.tokens_per_rank, DType::i64, {L * world});
    Tensor tb = view_of(p.remote_bytes, DType::i64, {L});
    comm::all_reduce(te, all);
    comm::all_reduce(tr, all);
    comm::all_reduce(tb, all);
    for (int64_t& t : p.tokens_per_expert)
        t /= job.layout.etp;
    // imbalance: max/mean of the assignments the ranks of the layer's stage computed
    const int per_stage_ranks = job.layout.tp * job.layout.dp;
    p.imbalance.assign(static_cast<size_t>(L), 0.0f);
    for (int64_t i = 0; i < L; ++i) {
        const auto first = p.tokens_per_rank.begin() + i * world;
        for (int64_t r0 = 0; r0 < world; r0 += per_stage_ranks) {
            const int64_t total =
                std::accumulate(first + r0, first + r0 + per_stage_ranks, int64_t{0});
            if (total > 0)
                p.imbalance[i] = static_cast<float>(
                                     *std::max_element(first + r0, first + r0 + per_stage_ranks)) /
                                 (static_cast<float>(total) / static_cast<float>(per_stage_ranks));
        }
    }
    return p;
}

std::string profile_table(const model::ModelConfig& cfg, const JobProfile& p) {
    const model::ForwardStats& stats = p.mean;
    double total = stats.head_seconds;
    for (size_t i = 0; i < stats.mixer_seconds.size(); ++i)
        total += stats.mixer_seconds[i] + stats.ffn_seconds[i];
    char line[320];
    std::string out =
        "per-layer wall time (all forward steps, mean over the stage's ranks) and cache memory "
        "(the most at once on a rank):\n";
    std::snprintf(line,
                  sizeof line,
                  "  %5s  %-5s %10s  %-10s %10s  %7s %6s %9s %8s  %-7s %9s %9s\n",
                  "layer",
                  "mixer",
                  "seconds",
                  "ffn",
                  "seconds",
                  "share",
                  "GEMM",
                  "GFLOP/s",
                  "wt GB/s",
                  "bound",
                  "KV MB",
                  "KDA MB");
    out += line;
    for (size_t i = 0; i < stats.mixer_seconds.size(); ++i) {
        const model::LayerSpec& spec = cfg.layers[i];
        const double s = stats.mixer_seconds[i] + stats.ffn_seconds[i];
        std::snprintf(line,
                      sizeof line,
                      "  %5zu  %-5s %10.4f  %-10s %10.4f  %6.1f%% %5.0f%% %9.2f %8.2f  %-7s %9.3f "
                      "%9.3f\n",
                      i,
                      model::to_string(spec.mixer),
                      stats.mixer_seconds[i],
                      model::to_string(spec.ffn),
                      stats.ffn_seconds[i],
                      total > 0 ? 100 * s / total : 0.0,
                      s > 0 ? 100 * stats.layer_gemm_seconds[i] / s : 0.0,
                      static_cast<double>(p.gflops[i]),
                      static_cast<double>(p.weight_gb_s[i]),
                      p.bound[i].c_str(),
                      static_cast<double>(p.memory.kv_bytes[i]) / 1e6,
                      static_cast<double>(p.memory.kda_state_bytes[i]) / 1e6);
        out += line;
    }
    std::snprintf(line,
                  sizeof line,
                  "  embedding + head %.4f s; attention layers: indexer %.4f s, rest %.4f s; "
                  "waiting for the previous stage %.4f s; peaks: GEMM %.1f GFLOP/s, "
                  "read %.1f GB/s\n",
                  stats.head_seconds,
                  stats.attn.indexer_seconds,
                  stats.attn.attention_seconds,
                  stats.pipeline_seconds,
                  p.peaks.gemm_gflops,
                  p.peaks.read_gb_s);
    out += line;
    if (cfg.vision.present && p.vision.images > 0) {  // text jobs: no line
        const model::VisionStats& v = p.vision;
        std::snprintf(line,
                      sizeof line,
                      "vision encoder: %lld images, %lld patches -> %lld tokens in %.4f s "
                      "(%.2f GFLOP/s); weights %.2f MB, activations at most %.2f MB\n",
                      static_cast<long long>(v.images),
                      static_cast<long long>(v.patches),
                      static_cast<long long>(v.tokens),
                      v.seconds,
                      v.seconds > 0 ? v.flops / v.seconds / 1e9 : 0.0,
                      static_cast<double>(p.vision_weight_bytes) / 1e6,
                      static_cast<double>(v.peak_act_bytes) / 1e6);
        out += line;
    }
    if (p.imbalance.empty())
        return out;
    const int64_t E = cfg.moe.n_routed_experts;
    out +=
        "expert load (assignments over all steps; imbalance = max/mean over the stage's ranks):\n";
    std::snprintf(line,
                  sizeof line,
                  "  %5s %12s %8s %8s %9s %10s %10s\n",
                  "layer",
                  "assignments",
                  "hottest",
                  "coldest",
                  "imbalance",
                  "dispatch s",
                  "combine s");
    out += line;
    for (size_t i = 0; i < p.imbalance.size(); ++i) {
        if (cfg.layers[i].ffn == model::Ffn::dense)
            continue;
        const auto first = p.tokens_per_expert.begin() + static_cast<int64_t>(i) * E;
        std::snprintf(line,
                      sizeof line,
                      "  %5zu %12lld %8lld %8lld %9.3f %10.4f %10.4f\n",
                      i,
                      static_cast<long long>(std::accumulate(first, first + E, int64_t{0})),
                      static_cast<long long>(*std::max_element(first, first + E)),
                      static_cast<long long>(*std::min_element(first, first + E)),
                      static_cast<double>(p.imbalance[i]),
                      static_cast<double>(p.dispatch_seconds[i]),
                      static_cast<double>(p.combine_seconds[i]));
        out += line;
    }
    return out;
}

void write_profile(const Job& job,
                   const parallel::Grid& grid,
                   const JobProfile& p,
                   const RankMemory& memory) {
    const std::string path = job.deck.job.output + "/profile.h5";
    io::H5Writer file(path, grid.comms.world);
    io::write_meta(file, {&job.deck, job.layout, model::describe(job.model), log::utc_timestamp()});
    const auto L = static_cast<int64_t>(job.model.layers.size());
    std::vector<std::string> mixer, ffn;
    for (const model::LayerSpec& spec : job.model.layers) {
        mixer.emplace_back(model::to_string(spec.mixer));
        ffn.emplace_back(model::to_string(spec.ffn));
    }
    file.strings("/layers/mixer", mixer);
    file.strings("/layers/ffn", ffn);
    auto seconds = [&](const std::string& name, const std::vector<double>& v) {
        std::vector<float> f(v.begin(), v.end());
        file.array(name, view_of(f, DType::f32));
        file.attr(name, "unit", "s");
    };
    seconds("/layers/mixer_seconds", p.mean.mixer_seconds);
    seconds("/layers/ffn_seconds", p.mean.ffn_seconds);
    seconds("/layers/gemm_seconds", p.mean.layer_gemm_seconds);
    seconds("/attention/indexer_seconds", {p.mean.attn.indexer_seconds});
    seconds("/attention/other_seconds", {p.mean.attn.attention_seconds});
    seconds("/head_seconds", {p.mean.head_seconds});
    seconds("/pipeline_seconds", {p.mean.pipeline_seconds});
    std::vector<float> gflops = p.gflops, gb_s = p.weight_gb_s;
    file.array("/layers/gflops", view_of(gflops, DType::f32));
    file.attr("/layers/gflops", "unit", "GFLOP/s");
    file.array("/layers/weight_gb_s", view_of(gb_s, DType::f32));
    file.attr("/layers/weight_gb_s", "unit", "GB/s");
    file.strings("/layers/bound", p.bound);
    std::vector<int64_t> kv = p.memory.kv_bytes, kda = p.memory.kda_state_bytes;
    file.array("/layers/kv_bytes", view_of(kv, DType::i64, {L}));
    file.attr("/layers/kv_bytes", "unit", "bytes");
    file.array("/layers/kda_state_bytes", view_of(kda, DType::i64, {L}));
    file.attr("/layers/kda_state_bytes", "unit", "bytes");
    std::vector<float> peaks{static_cast<float>(p.peaks.gemm_gflops),
                             static_cast<float>(p.peaks.read_gb_s)};
    file.array("/peaks", view_of(peaks, DType::f32));
    file.attr("/peaks", "columns", "gemm_gflops read_gb_s");
    if (!p.imbalance.empty() && job.deck.profile.experts) {
        std::vector<int64_t> tpe = p.tokens_per_expert, tpr = p.tokens_per_rank;
        file.array("/experts/tokens_per_expert",
                   view_of(tpe, DType::i64, {L, static_cast<int64_t>(tpe.size()) / L}));
        file.array("/experts/tokens_per_rank", view_of(tpr, DType::i64, {L, job.layout.world()}));
        std::vector<int64_t> remote = p.remote_bytes;
        file.array("/experts/remote_bytes", view_of(remote, DType::i64, {L}));
        file.attr("/experts/remote_bytes", "unit", "bytes");
        std::vector<float> imb = p.imbalance, disp = p.dispatch_seconds, comb = p.combine_seconds;
        file.array("/experts/imbalance", view_of(imb, DType::f32));
        file.array("/experts/dispatch_seconds", view_of(disp, DType::f32));
        file.attr("/experts/dispatch_seconds", "unit", "s");
        file.array("/experts/combine_seconds", view_of(comb, DType::f32));
        file.attr("/experts/combine_seconds", "unit", "s");
    }
    std::vector<float> layer_secs = p.rank_layer_seconds, secs = p.rank_seconds;
    const int64_t world = job.layout.world();
    file.array("/ranks/layer_seconds",
               Tensor{layer_secs.data(), DType::f32, Device::cpu, {world, 4, L}});
    file.attr("/ranks/layer_seconds", "columns", "mixer ffn dispatch combine");
    file.attr("/ranks/layer_seconds", "unit", "s");
    file.array("/ranks/seconds", Tensor{secs.data(), DType::f32, Device::cpu, {world, 4}});
    file.attr("/ranks/seconds", "columns", "head indexer attention_other pipeline");
    file.attr("/ranks/seconds", "unit", "s");
    if (job.model.vision.present) {
        const model::VisionStats& v = p.vision;
        seconds("/vision/seconds", {v.seconds});
        std::vector<int64_t> counts{v.images, v.patches, v.tokens};
        const char* names[3] = {"/vision/images", "/vision/patches", "/vision/tokens"};
        for (int i = 0; i < 3; ++i)
            file.array(names[i], Tensor{&counts[i], DType::i64, Device::cpu, {1}});
        std::vector<float> gflop{static_cast<float>(v.flops / 1e9)};
        file.array("/vision/gflop", view_of(gflop, DType::f32));
        std::vector<int64_t> bytes{v.peak_act_bytes, p.vision_weight_bytes};
        file.array("/vision/activation_bytes", Tensor{&bytes[0], DType::i64, Device::cpu, {1}});
        file.attr("/vision/activation_bytes", "unit", "bytes");
        file.array("/vision/weight_bytes", Tensor{&bytes[1], DType::i64, Device::cpu, {1}});
        file.attr("/vision/weight_bytes", "unit", "bytes");
    }
    std::vector<float> mine(memory.begin(), memory.end());
    Tensor row{mine.data(), DType::f32, Device::cpu, {1, kMemoryColumns}};
    file.rows("/memory/ranks", row, grid.rank, job.layout.world());
    file.attr("/memory/ranks", "columns", kMemoryColumnNames);
    file.attr("/memory/ranks", "unit", "bytes");
    file.commit();
}

}  // namespace hymoe::runtime
