// model::kda_forward on a CUDA context against the same forward on the CPU context: a packed
// prefill of three sequences (7, 1 and 30 tokens, fresh states), then a decode step of each that
// continues the carried states and conv tails; outputs and states within 1e-5 in fp32, in both
// forms of the decay gate, and within 1e-2 with bf16 matrices (as a bf16 model stores them). And
// the same steps against the GPU model's own KDA block (device_kda.cpp's kda_block, until it is
// folded into kda_forward) on the same weights, fp32.
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "../../src/model/cuda/device_blocks.h"
#include "cuda_test.h"
#include "hymoe/backend/cuda_gemm.h"
#include "hymoe/core/rng.h"
#include "hymoe/model/kda_views.h"
#include "hymoe/model/weights.h"

namespace utf = boost::unit_test;
using namespace hymoe;
using namespace hymoe::cuda_test;
using hymoe::model::KdaMode;

namespace {

// The tiny config's KDA sizes (d 64, H 4, K = V 16, W 4) and random weights at the scales of
// tests/unit/model/test_kda.cpp (fan-in^{-1/2} for the projections, 0.5 for the rest), the
// matrices held at `storage`.
struct Layer {
    model::ModelConfig cfg;
    model::KdaWeights w;
    Layer(std::optional<double> lower_bound, DType storage) {
        cfg.hidden_size = 64;
        cfg.rms_norm_eps = 1e-5;
        cfg.kda.n_head = 4;
        cfg.kda.head_dim = 16;
        cfg.kda.conv_kernel = 4;
        cfg.kda.gate_lower_bound = lower_bound;
        model::TensorList list = model::with_storage(model::kda_tensors(cfg, w), storage);
        for (model::TensorSpec& s : list) {
            const bool up = s.name == "f_b_proj.weight" || s.name == "g_b_proj.weight";
            s.std = s.shape.size() == 2 && !up ? 1.0f / std::sqrt(static_cast<float>(s.shape[1]))
                                               : 0.5f;
        }
        Philox rng(7, 0, 0);
        model::init_random(list, rng);
    }
};

// A CUDA context over a test's stream and arena.
struct GpuCtx {
    Gpu g;
    cu::Blas blas{g.s, g.arena};
    backend::Ctx ctx;
    GpuCtx() {
        ctx.device = Device::cuda;
        ctx.stream = &g.s;
        ctx.arena = &g.arena;
        ctx.blas = &blas;
    }
    Tensor up(const Buffer& host) { return to_device(host.view(), DType::f32, g.arena, g.s); }
    // A host weight's device copy at its own dtype.
    Tensor weight(const Buffer& host) {
        Tensor dev = g.arena.tensor(host.view().dtype, host.view().shape);
        cu::upload(host.view(), dev, g.s);
        g.s.synchronize();
        return dev;
    }
};

// The host weights' device copies, at the weight list's shapes.
model::KdaWeightViews upload(GpuCtx& gc, const model::KdaWeights& w) {
    return {gc.weight(w.q_proj),
            gc.weight(w.k_proj),
            gc.weight(w.v_proj),
            gc.weight(w.q_conv1d),
            gc.weight(w.k_conv1d),
            gc.weight(w.v_conv1d),
            gc.weight(w.f_a_proj),
            gc.weight(w.f_b_proj),
            gc.weight(w.dt_bias),
            gc.weight(w.a_log),
            gc.weight(w.b_proj),
            gc.weight(w.g_a_proj),
            gc.weight(w.g_b_proj),
            gc.weight(w.o_norm),
            gc.weight(w.o_proj),
            nullptr};
}

// The rows of several host buffers stacked, [Σ rows, cols].
Buffer stacked(const std::vector<const Buffer*>& parts) {
    const int64_t cols = parts.front()->view().numel() / parts.front()->view().dim(0);
    int64_t rows = 0;
    for (const Buffer* b : parts)
        rows += b->view().numel() / cols;
    Buffer out(DType::f32, {rows, cols});
    float* p = out.ptr<float>();
    for (const Buffer* b : parts)
        for (int64_t i = 0; i < b->view().numel(); ++i)
            *p++ = b->ptr<float>()[i];
    return out;
}

// The prefill batch (7, 1, 30 tokens) and the decode step after it (one token each).
const model::SeqBatch kPrefill{{0, 7, 8, 38}, {0, 0, 0}, {}};
const model::SeqBatch kDecode{{0, 1, 2, 3}, {7, 1, 30}, {}};

// The device result against the CPU's within `tol` (normalised error).
void close(
    const char* what, const Tensor& dev, const Buffer& want, const cu::Stream& s, double tol) {
    Buffer got = to_host(dev, s);
    const double err = rel_error(got.ptr<float>(), want.ptr<float>(), want.view().numel());
    BOOST_TEST_INFO(what << ": normalised error " << err);
    BOOST_TEST(err < tol);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_kda_forward, *utf::label("cuda"))

BOOST_AUTO_TEST_CASE(kda_forward_on_a_cuda_ctx_matches_the_cpu, *utf::precondition(need_gpu)) {
    struct Case {
        std::optional<double> lb;
        DType storage;
    };
    for (const Case c : {Case{std::nullopt, DType::f32},
                         Case{-5.0, DType::f32},
                         Case{std::nullopt, DType::bf16}}) {
        BOOST_TEST_CONTEXT((c.lb ? "lower-bounded gate, " : "softplus gate, ")
                           << to_string(c.storage) << " matrices") {
            const Layer layer(c.lb, c.storage);
            const double tol = tolerance(c.storage);
            const int64_t d = layer.cfg.hidden_size;
            GpuCtx gc;
            const model::KdaWeightViews dw = upload(gc, layer.w);
            std::vector<model::KdaState> host;
            std::vector<model::KdaStateViews> dev;
            for (int s = 0; s < 3; ++s) {
                model::KdaState& st = host.emplace_back(model::make_kda_state(layer.cfg));
                dev.push_back({gc.up(st.S), gc.up(st.q_tail), gc.up(st.k_tail), gc.up(st.v_tail)});
            }
            std::vector<model::KdaState*> ptrs = {&host[0], &host[1], &host[2]};
            uint32_t stream = 60;
            for (const model::SeqBatch* b : {&kPrefill, &kDecode}) {
                const int64_t n = b->n_tok();
                Buffer x = random({n, d}, stream++, DType::f32), y(DType::f32, {n, d});
                Tensor dy = gc.g.arena.tensor(DType::f32, {n, d});
                model::kda_forward(
                    backend::cpu_ctx(), layer.cfg, layer.w, x.view(), *b, ptrs, y.view());
                model::kda_forward(gc.ctx, layer.cfg, dw, gc.up(x), *b, dev, dy);
                close(n > 3 ? "prefill y" : "decode y", dy, y, gc.g.s, tol);
            }
            for (int s = 0; s < 3; ++s) {
                close("state S", dev[s].S, host[s].S, gc.g.s, tol);
                close("q tail", dev[s].q_tail, host[s].q_tail, gc.g.s, tol);
                close("v tail", dev[s].v_tail, host[s].v_tail, gc.g.s, tol);
            }
        }
    }
}

// The GPU model's KDA block (device_blocks.h kda_block: stacked weights, one launch over the
// batch) against kda_forward on a CUDA context, both fp32, over the same two steps.
BOOST_AUTO_TEST_CASE(kda_forward_matches_the_gpu_models_kda_block, *utf::precondition(need_gpu)) {
    const Layer layer(std::nullopt, DType::f32);
    const model::ModelConfig& cfg = layer.cfg;
    const model::KdaWeights& w = layer.w;
    const int64_t d = cfg.hidden_size, H = cfg.kda.n_head, K = cfg.kda.head_dim, D = H * K;
    const int64_t W = cfg.kda.conv_kernel;
    GpuCtx gc;
    const model::KdaWeightViews dw = upload(gc, w);
    model::gpu::Gpu g(size_t{256} << 20, 16);
    auto up = [&](const Buffer& b) { return to_device(b.view(), DType::f32, g.arena, g.stream); };
    model::gpu::KdaW kw;
    kw.qkv = up(stacked({&w.q_proj, &w.k_proj, &w.v_proj}));
    kw.conv = up(stacked({&w.q_conv1d, &w.k_conv1d, &w.v_conv1d}));
    kw.low = up(stacked({&w.f_a_proj, &w.g_a_proj, &w.b_proj}));
    kw.f_b = up(w.f_b_proj);
    kw.g_b = up(w.g_b_proj);
    kw.dt_bias = up(w.dt_bias);
    kw.a_log = to_device(
        Tensor{w.a_log.view().data, DType::f32, Device::cpu, {H}}, DType::f32, g.arena, g.stream);
    kw.o_norm = up(w.o_norm);
    kw.o_proj = up(w.o_proj);

    // Per sequence: the block's S [H, K, K] and tail [W−1, 3D]; kda_forward's views.
    std::vector<float*> ptrs;  // [2, 1, n_seq]: the S, then the tails
    std::vector<Tensor> block_S;
    std::vector<model::KdaStateViews> dev;
    for (int s = 0; s < 3; ++s) {
        block_S.push_back(up(Buffer(DType::f32, {H, K, K})));
        ptrs.push_back(block_S.back().ptr<float>());
        const model::KdaState st = model::make_kda_state(cfg);
        dev.push_back({gc.up(st.S), gc.up(st.q_tail), gc.up(st.k_tail), gc.up(st.v_tail)});
    }
    for (int s = 0; s < 3; ++s)
        ptrs.push_back(up(Buffer(DType::f32, {W - 1, 3 * D})).ptr<float>());
    Tensor state_ptrs = g.arena.tensor(DType::i64, {static_cast<int64_t>(ptrs.size())});
    cu::copy_to_device(state_ptrs.data, ptrs.data(), ptrs.size() * sizeof(float*), g.stream);

    uint32_t stream = 70;
    for (const model::SeqBatch* b : {&kPrefill, &kDecode}) {
        const int64_t n = b->n_tok();
        std::vector<int32_t> row_seq;
        for (int s = 0; s < 3; ++s)
            row_seq.insert(row_seq.end(), static_cast<size_t>(b->length(s)), s);
        model::gpu::StepBatch step;
        step.batch = b;
        step.n_tok = n;
        step.n_seq = 3;
        step.offsets = to_device_i64(b->offsets, g.arena, g.stream);
        step.row_seq = to_device_i32(row_seq, g.arena, g.stream);
        step.n_kda = 1;
        step.kda_states = state_ptrs;
        Buffer x = random({n, d}, stream++, DType::f32);
        Tensor x_block = up(x), y_block = g.arena.tensor(DType::f32, {n, d});
        Tensor y_fwd = gc.g.arena.tensor(DType::f32, {n, d});
        model::gpu::kda_block(g, cfg, kw, x_block, step, 0, DType::f32, y_block);
        model::kda_forward(gc.ctx, cfg, dw, gc.up(x), *b, dev, y_fwd, KdaMode::automatic);
        const Buffer want = to_host(y_block, g.stream);
        expect_close(n > 3 ? "prefill y" : "decode y", y_fwd, want, gc.g.s);
    }
    for (int s = 0; s < 3; ++s)
        expect_close("state S", dev[s].S, to_host(block_S[s], g.stream), gc.g.s);
}

BOOST_AUTO_TEST_SUITE_END()
