// The GPU model's benchmark (CUDA builds only; scripts/gpu-check.sh runs it). One process, one
// device; reports and asserts nothing. The model: the `mid` preset with 128 routed experts (3 KDA
// : 1 gated DSA, d 1024, 8 layers, MoE top-8), 1.5B parameters = 3.1 GB of bf16 weights, random
// values (uniform with the init's std; the small tensors by their init rule). Figures:
//   bandwidth  device-to-device copy of 2 GiB: GB/s counted as bytes read + written
//   prefill    8 prompts of 512 tokens in one forward (4096 rows): tokens/s
//   decode     one token for each of B sequences with 128 tokens of context, B = 1, 32, 256,
//              with the decode graphs (DeviceModelOptions::graphs) and eagerly (the same model
//              with them switched off): tokens/s, and the bytes a step must move / its time
//              against the copy bandwidth. When no step of the model replays a graph (its DSA
//              layers' decode does not qualify yet), only the eager line, then the same figures
//              for the model with its DSA layers as MLA (a second upload), whose steps do.
//              Bytes = every weight read once (bf16 matrices, fp32 router and vectors), the routed
//              experts the step touched (counted on one extra step), the embedding rows, each
//              sequence's KDA state read and written and its attention keys read once.
// A forward ends with its logits on the host (DeviceModel::forward), so the wall time between
// calls is the step's time, host work included (eager: every launch; graphs: one launch).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hymoe/backend/cuda_arena.h"
#include "hymoe/backend/cuda_model_ops.h"
#include "hymoe/core/rng.h"
#include "hymoe/core/timer.h"
#include "hymoe/model/device_model.h"
#include "hymoe/model/kv_cache.h"
#include "hymoe/model/model.h"
#include "hymoe/parallel/device_select.h"
#include "hymoe/parallel/mpi_env.h"

using namespace hymoe;
namespace cu = hymoe::backend::cuda;

namespace {

constexpr int kPageTokens = 64;
constexpr int64_t kContext = 128;  // tokens of context per sequence before the decode steps
constexpr int kDecodeSteps = 5;

model::ModelConfig bench_config() {
    model::ModelConfig c = model::preset_config("mid");
    c.moe.n_routed_experts = 128;
    return c;
}

// Every tensor: big ones uniform in ±√3·std (xorshift, fast), small ones (norms, gates, biases,
// KDA decay parameters) by their init rule.
void fill_weights(model::Model& m) {
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (const model::TensorSpec& spec : model::model_tensors(m)) {
        if (shape_numel(spec.shape) < (int64_t{1} << 20) || spec.init != model::Init::normal) {
            model::init_tensors_random({spec}, m.shard, 1);
            continue;
        }
        *spec.dest = Buffer(DType::f32, spec.shape);
        const float a = 1.7320508f * spec.std;
        float* p = spec.dest->ptr<float>();
        for (int64_t i = 0; i < spec.dest->view().numel(); ++i) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            p[i] = a * (static_cast<float>(x >> 40) * (2.0f / 16777216.0f) - 1.0f);
        }
    }
}

// Bytes a decode step reads once whatever it touches (weights but the embedding table and the
// routed experts), and one routed expert's bytes, as the GPU model stores them.
struct WeightBytes {
    double fixed = 0, per_expert = 0;
};
WeightBytes weight_bytes(model::Model& m) {
    WeightBytes b;
    const int64_t n_moe = count_layers(m.cfg, model::Ffn::moe);
    for (const model::TensorSpec& spec : model::model_tensors(m)) {
        const std::string& n = spec.name;
        const bool f32 = spec.shape.size() == 1 || n.find("conv1d") != std::string::npos ||
                         n.ends_with(".gate.weight");  // vectors, conv taps, routers
        const double bytes = static_cast<double>(shape_numel(spec.shape)) * (f32 ? 4 : 2);
        if (n.find(".experts.") != std::string::npos)
            b.per_expert += bytes / static_cast<double>(m.cfg.moe.n_routed_experts * n_moe);
        else if (n != "model.embed_tokens.weight")
            b.fixed += bytes;
    }
    return b;
}

// The runs share one pool and a set of sequences; each run starts them afresh.
struct Runner {
    model::Model& m;
    model::DeviceModel& dev;
    model::KvPool pool;
    std::vector<model::SequenceState> seqs;
    Philox rng{5, 0, 0};

    Runner(model::Model& host, model::DeviceModel& d, int64_t pages)
        : m(host),
          dev(d),
          pool(host.local, host.shard, kPageTokens, pages, [&d](const model::KvLayout& l) {
              return d.kv_store(l);
          }) {}

    void reset(int64_t n) {
        for (model::SequenceState& s : seqs)
            pool.release(s.pages);
        seqs.clear();
        for (int64_t i = 0; i < n; ++i)
            seqs.push_back(dev.new_sequence());
        for (model::SequenceState& s : seqs)
            model::attach_kv_pool(m, s, pool);
    }
    // One forward: `len` new tokens for each of sequences [first, first + count).
    void step(int64_t first, int64_t count, int64_t len, model::ForwardStats* stats = nullptr) {
        std::vector<int64_t> tokens;
        model::SeqBatch batch{{0}, {}, {}};
        std::vector<model::SequenceState*> states;
        for (int64_t i = first; i < first + count; ++i) {
            model::SequenceState& s = seqs[static_cast<size_t>(i)];
            if (!pool.reserve(s.pages, s.n_tokens + len)) {
                std::printf("bench_cuda_model: out of KV pages\n");
                std::exit(1);
            }
            for (int64_t t = 0; t < len; ++t)
                tokens.push_back(3 + rng.next_u32() % (m.cfg.vocab_size - 3));
            batch.pos0.push_back(s.n_tokens);
            batch.offsets.push_back(static_cast<int64_t>(tokens.size()));
            states.push_back(&s);
        }
        model::ForwardOptions fo;
        fo.logits = model::Logits::last;
        fo.stats = stats;
        Buffer logits;
        dev.forward(tokens, batch, states, logits, fo, nullptr);
    }
};

double copy_bandwidth() {
    const size_t bytes = size_t{2} << 30;
    cu::Stream s;
    cu::DeviceArena arena(2 * bytes + (size_t{1} << 20));
    void* src = arena.allocate(bytes);
    void* dst = arena.allocate(bytes);
    cu::zero(src, bytes, s);
    double best = 1e30;
    for (int r = 0; r < 6; ++r) {
        s.synchronize();
        const double t0 = wall_seconds();
        cu::copy_on_device(dst, src, bytes, s);
        s.synchronize();
        best = std::min(best, r == 0 ? 1e30 : wall_seconds() - t0);  // run 0 warms up
    }
    return 2.0 * static_cast<double>(bytes) / best / 1e9;
}

// Decode figures at B = 1, 32, 256 sequences of kContext tokens: each B's steps with the decode
// graphs, then eagerly (the same model, graphs switched off), one line each; only the eager line
// when no step replayed a graph. Returns whether any step did.
bool decode(model::Model& m,
            model::DeviceModel& dev,
            Runner& run,
            const WeightBytes& wb,
            double bw,
            const char* label) {
    const model::ModelConfig& c = m.cfg;
    const double kv_row = 4.0 * (c.mla.kv_lora_rank + c.mla.qk_rope_head_dim);
    const double state = 4.0 * c.kda.n_head * c.kda.head_dim * c.kda.head_dim;
    const int64_t graph_steps = dev.graph_counters().graph_steps;
    for (int64_t B : {1, 32, 256}) {
        run.reset(B);
        for (int64_t first = 0; first < B; first += 32)  // contexts, 32 prompts a forward
            run.step(first, std::min<int64_t>(32, B - first), kContext);
        double step_s[2] = {0, 0};  // graphs, eager
        bool replayed = true;       // whether the graph steps were graphs (else eager already)
        for (int eager = 0; eager < 2 && replayed; ++eager) {
            const int64_t before = dev.graph_counters().graph_steps;
            dev.set_graphs(eager == 0);
            run.step(0, B, 1);  // warm-up (graphs: the first use warms up and captures)
            const double t = wall_seconds();
            for (int k = 0; k < kDecodeSteps; ++k)
                run.step(0, B, 1);
            step_s[eager] = (wall_seconds() - t) / kDecodeSteps;
            replayed = dev.graph_counters().graph_steps > before;
        }
        if (!replayed)  // no graph qualified: the steps above ran eagerly
            std::swap(step_s[0], step_s[1]);
        dev.set_graphs(true);
        model::ForwardStats stats;  // one more step (eager: timed): the experts a step touches
        run.step(0, B, 1, &stats);
        double experts = 0;
        for (const model::MoeCommStats& s : stats.moe)
            for (int64_t n : s.tokens_per_expert)
                experts += n > 0;
        const double ctx = static_cast<double>(kContext + 2 * (kDecodeSteps + 1) + 1);
        double kv = 0;  // keys read once per sequence
        for (const model::LayerSpec& l : c.layers)
            if (l.mixer == model::Mixer::mla)
                kv += ctx * kv_row;
            else if (l.mixer == model::Mixer::dsa)
                kv += ctx * 4.0 * c.indexer.head_dim +
                      std::min<double>(c.indexer.top_k, ctx) * kv_row;
        const double bytes =
            wb.fixed + experts * wb.per_expert +
            static_cast<double>(B) *
                (2.0 * c.hidden_size + kv + 2.0 * state * count_layers(c, model::Mixer::kda));
        for (int eager = replayed ? 0 : 1; eager < 2; ++eager)
            std::printf(
                "  decode%s batch %3lld %s: %8.0f tokens/s (%.2f ms a step), %.0f GB/s moved = "
                "%.2f of the copy bandwidth (%.0f experts of %lld touched)\n",
                label,
                static_cast<long long>(B),
                eager ? "eager " : "graphs",
                static_cast<double>(B) / step_s[eager],
                step_s[eager] * 1e3,
                bytes / step_s[eager] / 1e9,
                bytes / step_s[eager] / 1e9 / bw,
                experts,
                static_cast<long long>(c.moe.n_routed_experts * count_layers(c, model::Ffn::moe)));
        std::fflush(stdout);
    }
    return dev.graph_counters().graph_steps > graph_steps;
}

}  // namespace

int main(int argc, char** argv) {
    parallel::MpiEnv mpi(&argc, &argv);
    const backend::DeviceInfo info = parallel::select_device(true);
    if (!info.cuda_available) {
        std::printf("bench_cuda_model: no CUDA device: skipped\n");
        return 0;
    }
    std::printf("bench_cuda_model: %s, %.1f GB\n", info.name.c_str(), info.memory_gb);
    const double bw = copy_bandwidth();
    std::printf("  bandwidth device-to-device copy of 2 GiB: %.0f GB/s (read + write)\n", bw);

    double t0 = wall_seconds();
    model::Model m = model::make_model(bench_config());
    fill_weights(m);
    const WeightBytes wb = weight_bytes(m);
    const double host_s = wall_seconds() - t0;
    model::DeviceModelOptions o;
    o.dtype = DType::bf16;
    o.max_tokens = 4096;
    o.max_seqs = 256;
    t0 = wall_seconds();
    std::unique_ptr<model::DeviceModel> dev = model::make_device_model(m, o);
    std::printf(
        "  model     mid with 128 experts, %.2f B parameters: %s (host init %.1f s, upload "
        "%.1f s)\n",
        static_cast<double>(count_params(m.cfg).total) / 1e9,
        dev->describe().c_str(),
        host_s,
        wall_seconds() - t0);
    std::fflush(stdout);
    auto run = std::make_unique<Runner>(m, *dev, 1024);

    // ---- prefill ---------------------------------------------------------------------------
    const int64_t n_prompt = 8, prompt = 512;
    double best = 1e30;
    for (int r = 0; r < 3; ++r) {
        run->reset(n_prompt);
        const double t = wall_seconds();
        run->step(0, n_prompt, prompt);
        best = std::min(best, wall_seconds() - t);
    }
    std::printf("  prefill   %lld prompts x %lld tokens in one forward: %.0f tokens/s (%.1f ms)\n",
                static_cast<long long>(n_prompt),
                static_cast<long long>(prompt),
                static_cast<double>(n_prompt * prompt) / best,
                best * 1e3);
    std::fflush(stdout);

    // ---- decode ----------------------------------------------------------------------------
    const bool graphed = decode(m, *dev, *run, wb, bw, "");
    if (!graphed) {  // the model's decode steps replay no graph: the figures of a variant that does
        std::printf("  decode    no step replayed a graph (DSA decode): again with MLA for DSA\n");
        run.reset();  // its pool before the model that holds its pages
        dev.reset();
        for (size_t i = 0; i < m.cfg.layers.size(); ++i)
            if (m.cfg.layers[i].mixer == model::Mixer::dsa)
                m.cfg.layers[i].mixer = m.local.layers[i].mixer = model::Mixer::mla;
        dev = model::make_device_model(m, o);
        run = std::make_unique<Runner>(m, *dev, 1024);
        decode(m, *dev, *run, weight_bytes(m), bw, " mla");
    }
    run->reset(0);
    return 0;
}
