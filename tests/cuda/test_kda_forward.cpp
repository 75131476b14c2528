// model::kda_forward on a CUDA context against the same forward on the CPU context: a packed
// prefill of three sequences (7, 1 and 30 tokens, fresh states), then a decode step of each that
// continues the carried states and conv tails; outputs and states within 1e-5 in fp32, in both
// forms of the decay gate, and within 1e-2 with bf16 matrices (as a bf16 model stores them). Then
// the same steps over the sequence table the GPU model builds (pool slots, tail planes, LoRA
// factor views), which lets the backend pick its fused kernels.
#include <cmath>
#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "../../src/model/device/device_runtime.h"
#include "cuda_test.h"
#include "hymoe/backend/cuda_gemm.h"
#include "hymoe/core/rng.h"
#include "hymoe/model/kda_views.h"
#include "hymoe/model/lora.h"
#include "hymoe/model/weights.h"

namespace utf = boost::unit_test;
using namespace hymoe;
using namespace hymoe::cuda_test;

namespace {

// The tiny config's KDA sizes (d 64, H 4, K = V 16, W 4) and random weights at the scales of
// tests/unit/model/test_kda.cpp (fan-in^{-1/2} for the projections, 0.5 for the rest), the
// matrices held at `storage`.
struct Layer {
    model::ModelConfig cfg;
    model::KdaWeights w;
    Layer(std::optional<double> lower_bound, DType storage, int n_head = 4, int head_dim = 16) {
        cfg.hidden_size = 64;
        cfg.rms_norm_eps = 1e-5;
        cfg.kda.n_head = n_head;
        cfg.kda.head_dim = head_dim;
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
            nullptr,
            {}};
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

// The table as the GPU model builds it (device_step.cpp kda_batch over a StepBatch): each state
// a slot of one pool, each sequence's tails the planes q, k, v of one block, so that the CUDA
// backend runs its fused kernels (the decode step; with bf16 matrices and K = V = 32 the chunked
// prefill); LoRA adapters on q and o as factor views on row lists against the host adapters. The
// same two steps as above against the CPU, fp32 1e-5 and bf16 1e-2.
BOOST_AUTO_TEST_CASE(kda_forward_on_the_gpu_models_table_matches_the_cpu,
                     *utf::precondition(need_gpu)) {
    for (const DType storage : {DType::f32, DType::bf16}) {
        BOOST_TEST_CONTEXT(to_string(storage) << " matrices") {
            Layer layer(std::nullopt, storage, 2, 32);
            const model::ModelConfig& cfg = layer.cfg;
            const int64_t d = cfg.hidden_size, H = cfg.kda.n_head, K = cfg.kda.head_dim;
            const int64_t D = H * K, W = cfg.kda.conv_kernel, n_seq = 3;
            GpuCtx gc;
            model::KdaWeightViews dw = upload(gc, layer.w);

            // one adapter (id 0, rank 4) on q and on o: host slots and their device factors
            model::LoraSlot slot_q, slot_o;
            uint32_t lstream = 90;
            for (auto [slot, out, in] : {std::tuple{&slot_q, D, d}, std::tuple{&slot_o, d, D}}) {
                model::LoraPair& pr = slot->adapters.emplace_back(
                    model::make_lora_pair(out, in, 4, 0.5f, 11, lstream++, false));
                Philox(5, lstream++, 0).fill_normal(pr.B.ptr<float>(), out * 4, 0.0f, 0.3f);
            }
            layer.w.lora.q = &slot_q;
            layer.w.lora.o = &slot_o;
            dw.lora_views.q = {{gc.up(slot_q.adapters[0].A), gc.up(slot_q.adapters[0].B), 0.5f}};
            dw.lora_views.o = {{gc.up(slot_o.adapters[0].A), gc.up(slot_o.adapters[0].B), 0.5f}};

            // the states: a pool of S slots [n_seq, H, K, K] and tail blocks [n_seq, 3, W−1, D]
            const int64_t plane = (W - 1) * D;
            Tensor pool = gc.up(Buffer(DType::f32, {n_seq, H, K, K}));
            Tensor tails = gc.up(Buffer(DType::f32, {n_seq, 3, W - 1, D}));
            std::vector<float*> ptrs(static_cast<size_t>(4 * n_seq));  // [4, 1, n_seq]
            for (int64_t s = 0; s < n_seq; ++s) {
                ptrs[s] = pool.ptr<float>() + s * H * K * K;
                for (int64_t p = 0; p < 3; ++p)
                    ptrs[(p + 1) * n_seq + s] = tails.ptr<float>() + (s * 3 + p) * plane;
            }
            Tensor dptrs = gc.g.arena.tensor(DType::i64, {4 * n_seq});
            cu::copy_to_device(dptrs.data, ptrs.data(), ptrs.size() * sizeof(float*), gc.g.s);
            const Tensor slots = to_device_i32({0, 1, 2}, gc.g.arena, gc.g.s);

            std::vector<model::KdaState> host;
            std::vector<model::KdaState*> hptrs;
            for (int64_t s = 0; s < n_seq; ++s)
                host.push_back(model::make_kda_state(cfg));
            for (model::KdaState& st : host)
                hptrs.push_back(&st);
            uint32_t stream = 80;
            for (const model::SeqBatch* b : {&kPrefill, &kDecode}) {
                const int64_t n = b->n_tok();
                std::vector<int32_t> row_seq;
                std::vector<int64_t> all_rows;
                for (int32_t s = 0; s < n_seq; ++s)
                    row_seq.insert(row_seq.end(), static_cast<size_t>(b->length(s)), s);
                for (int64_t r = 0; r < n; ++r)
                    all_rows.push_back(r);
                model::dev::StepBatch step;
                step.batch = b;
                step.n_tok = n;
                step.n_seq = n_seq;
                step.offsets = to_device_i64(b->offsets, gc.g.arena, gc.g.s);
                step.row_seq = to_device_i32(row_seq, gc.g.arena, gc.g.s);
                step.n_kda = 1;
                step.kda_states = dptrs;
                step.kda_pool = pool.ptr<float>();
                step.kda_slots = slots;
                step.fused = true;
                step.lora.n_adapters = 1;
                step.lora.rows = {{0, to_device_i64(all_rows, gc.g.arena, gc.g.s)}};
                Buffer x = random({n, d}, stream++, DType::f32), y(DType::f32, {n, d});
                Tensor dy = gc.g.arena.tensor(DType::f32, {n, d});
                model::kda_forward(backend::cpu_ctx(), cfg, layer.w, x.view(), *b, hptrs, y.view());
                model::kda_forward(gc.ctx, cfg, dw, gc.up(x), model::dev::kda_batch(step, 0), dy);
                close(n > 3 ? "prefill y" : "decode y", dy, y, gc.g.s, tolerance(storage));
            }
            for (int64_t s = 0; s < n_seq; ++s) {
                const Tensor S{ptrs[s], DType::f32, Device::cuda, {H, K, K}};
                close("state S", S, host[s].S, gc.g.s, tolerance(storage));
                const Tensor v_tail{ptrs[3 * n_seq + s], DType::f32, Device::cuda, {W - 1, D}};
                close("v tail", v_tail, host[s].v_tail, gc.g.s, tolerance(storage));
            }
        }
    }
}

BOOST_AUTO_TEST_SUITE_END()
