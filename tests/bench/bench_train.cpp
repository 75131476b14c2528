// make bench: LoRA training speed on the CPU. One process, no MPI; reports, asserts nothing.
// The `mid` preset (random weights, seed 1234) with rank-16 adapters on q/k/v/o_proj and the
// routed experts (one per layer); one packed batch of HYMOE_BENCH_SEQS (default 2) sequences of
// HYMOE_BENCH_LEN (default 256) tokens, every next token a target. Figures, best of 3:
//   forward    evaluate_loss: tokens/s
//   training   train_forward_backward (forward, loss, backward, adapter gradients): tokens/s,
//              and the backward/forward time ratio (train − forward) / forward
//   GEMM       the training pass's GEMM rate (ops::gemm_counter) as a fraction of the BLAS peak
//              (sgemm 2048³ through ops::gemm, best of 4, measured in the same run)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "hymoe/backend/ops.h"
#include "hymoe/core/timer.h"
#include "hymoe/model/lora_model.h"
#include "hymoe/model/train.h"

using namespace hymoe;

namespace {

int64_t env_or(const char* name, int64_t fallback) {
    const char* v = std::getenv(name);
    return v ? std::atoll(v) : fallback;
}

double blas_peak_gflops() {
    const int64_t n = 2048;
    std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
    double best = 0;
    for (int r = 0; r < 4; ++r) {
        const double t0 = wall_seconds();
        ops::gemm(false, true, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
        best = std::max(best, 2.0 * n * n * n / (wall_seconds() - t0) / 1e9);
    }
    return best;
}

}  // namespace

int main() {
    const int64_t seqs = env_or("HYMOE_BENCH_SEQS", 2), len = env_or("HYMOE_BENCH_LEN", 256);
    model::Model m = model::make_model(model::preset_config("mid"));
    model::init_model_random(m, 1234);
    model::LoraModel lm =
        model::attach_lora(m, {"q_proj", "k_proj", "v_proj", "o_proj", "experts"}, false);
    model::add_lora_adapter(lm, m.shard, 16, 2.0f, 1, true);
    model::TrainBatch b;
    b.batch.offsets = {0};
    for (int64_t s = 0; s < seqs; ++s) {
        for (int64_t t = 0; t < len; ++t)
            b.tokens.push_back((s * 7919 + t * 104729) % m.cfg.vocab_size);
        for (int64_t t = 0; t < len; ++t)
            b.targets.push_back(t + 1 < len ? b.tokens[s * len + t + 1] : -1);
        b.batch.offsets.push_back((s + 1) * len);
        b.batch.pos0.push_back(0);
    }
    const double peak = blas_peak_gflops();
    double fwd = 1e30, train = 1e30, gemm_rate = 0;
    for (int r = 0; r < 3; ++r) {
        double t0 = wall_seconds();
        model::evaluate_loss(m, b);
        fwd = std::min(fwd, wall_seconds() - t0);
        const ops::GemmCounter before = ops::gemm_counter();
        t0 = wall_seconds();
        model::train_forward_backward(m, b, {});
        const double t = wall_seconds() - t0;
        if (t < train) {
            train = t;
            gemm_rate = (ops::gemm_counter().flops - before.flops) / t / 1e9;
        }
    }
    const double tokens = static_cast<double>(seqs * len);
    std::printf("bench_train: mid preset, %lld x %lld tokens, %lld adapter parameters\n",
                static_cast<long long>(seqs),
                static_cast<long long>(len),
                static_cast<long long>(model::lora_local_params(lm)));
    std::printf("  forward   %8.1f tokens/s (%.3f s)\n", tokens / fwd, fwd);
    std::printf("  training  %8.1f tokens/s (%.3f s), backward/forward %.2f\n",
                tokens / train,
                train,
                (train - fwd) / fwd);
    std::printf("  GEMM      %.1f GFLOP/s in training = %.2f of the BLAS peak %.1f GFLOP/s\n",
                gemm_rate,
                gemm_rate / peak,
                peak);
    return 0;
}
