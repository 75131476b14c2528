// model::kda_backward on views (model/kda_backward_views.h) on a CUDA context against the same
// backward on the CPU context: three fresh packed sequences (7, 1 and 30 tokens, chunks of 16),
// fp32, both forms of the decay gate, with rank-4 adapters as factor views with gradient views on
// q and o (adapter 0's rows the whole batch): dx and the adapters' dA, dB within the fp32 bound;
// then without adapters and without a table (the backward builds the batch's on the device).
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "cuda_test.h"
#include "hymoe/backend/cuda_gemm.h"
#include "hymoe/core/rng.h"
#include "hymoe/model/kda_backward_views.h"
#include "hymoe/model/weights.h"

namespace utf = boost::unit_test;
using namespace hymoe;
using namespace hymoe::cuda_test;

namespace {

// The tiny config's KDA sizes (d 64, H 4, K = V 16, W 4), random weights as
// tests/cuda/test_kda_forward.cpp's.
struct Layer {
    model::ModelConfig cfg;
    model::KdaWeights w;
    explicit Layer(std::optional<double> lower_bound) {
        cfg.hidden_size = 64;
        cfg.rms_norm_eps = 1e-5;
        cfg.kda.n_head = 4;
        cfg.kda.head_dim = 16;
        cfg.kda.conv_kernel = 4;
        cfg.kda.gate_lower_bound = lower_bound;
        model::TensorList list = model::kda_tensors(cfg, w);
        for (model::TensorSpec& s : list) {
            const bool up = s.name == "f_b_proj.weight" || s.name == "g_b_proj.weight";
            s.std = s.shape.size() == 2 && !up ? 1.0f / std::sqrt(static_cast<float>(s.shape[1]))
                                               : 0.5f;
        }
        Philox rng(7, 0, 0);
        model::init_random(list, rng);
    }
};

model::KdaWeightViews upload(GpuCtx& gc, const model::KdaWeightViews& h) {
    return {gc.up(h.q_proj),
            gc.up(h.k_proj),
            gc.up(h.v_proj),
            gc.up(h.q_conv1d),
            gc.up(h.k_conv1d),
            gc.up(h.v_conv1d),
            gc.up(h.f_a_proj),
            gc.up(h.f_b_proj),
            gc.up(h.dt_bias),
            gc.up(h.a_log),
            gc.up(h.b_proj),
            gc.up(h.g_a_proj),
            gc.up(h.g_b_proj),
            gc.up(h.o_norm),
            gc.up(h.o_proj),
            nullptr,
            {}};
}

}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_kda_backward, *utf::label("cuda"))

BOOST_AUTO_TEST_CASE(kda_backward_on_a_cuda_ctx_matches_the_cpu, *utf::precondition(need_gpu)) {
    const DType f = DType::f32;
    const model::SeqBatch batch{{0, 7, 8, 38}, {0, 0, 0}, {}};
    const std::vector<int64_t> offsets = batch.offsets;
    std::vector<int32_t> row_seq(38);
    for (int32_t s = 0; s < 3; ++s)
        for (int64_t r = offsets[s]; r < offsets[s + 1]; ++r)
            row_seq[static_cast<size_t>(r)] = s;
    std::vector<int64_t> all(38);
    for (int64_t r = 0; r < 38; ++r)
        all[static_cast<size_t>(r)] = r;
    for (std::optional<double> lb : {std::optional<double>{}, std::optional<double>{-5.0}}) {
        GpuCtx gc;
        const Layer layer(lb);
        const int64_t d = 64, D = 64, r = 4;
        const Buffer x = random({38, d}, 1, f), dy = random({38, d}, 2, f);
        const Buffer Aq = random({r, d}, 3, f, 0.2f), Bq = random({D, r}, 4, f, 0.2f),
                     Ao = random({r, D}, 5, f, 0.2f), Bo = random({d, r}, 6, f, 0.2f);
        Buffer gAq(f, {r, d}), gBq(f, {D, r}), gAo(f, {r, D}), gBo(f, {d, r}), dx(f, {38, d});
        Tensor dgAq = gc.up(gAq), dgBq = gc.up(gBq), dgAo = gc.up(gAo), dgBo = gc.up(gBo),
               ddx = gc.up(dx);

        model::KdaWeightViews hw = model::kda_views(layer.w);
        hw.lora = nullptr;
        hw.lora_views.q = {{Aq.view(), Bq.view(), 0.5f, gAq.view(), gBq.view()}};
        hw.lora_views.o = {{Ao.view(), Bo.view(), 1.5f, gAo.view(), gBo.view()}};
        model::KdaWeightViews dw = upload(gc, hw);
        dw.lora_views.q = {{gc.up(Aq), gc.up(Bq), 0.5f, dgAq, dgBq}};
        dw.lora_views.o = {{gc.up(Ao), gc.up(Bo), 1.5f, dgAo, dgBo}};

        const std::vector<model::LoraRowsView> hrows = {
            {0, Tensor{all.data(), DType::i64, Device::cpu, {38}}}};
        const std::vector<model::LoraRowsView> drows = {
            {0, to_device_i64(all, gc.g.arena, gc.g.s)}};
        ops::KdaSeqTable ht;
        ht.n_tok = 38;
        ht.n_seq = 3;
        ht.max_len = 30;
        ht.offsets = offsets.data();
        ops::KdaSeqTable dt = ht;
        dt.offsets = to_device_i64(offsets, gc.g.arena, gc.g.s).ptr<int64_t>();
        dt.row_seq = to_device_i32(row_seq, gc.g.arena, gc.g.s).ptr<int32_t>();

        Tensor hdx = dx.view();
        model::kda_backward(backend::cpu_ctx(),
                            layer.cfg,
                            hw,
                            x.view(),
                            model::KdaBatchViews{&batch, ht, &hrows},
                            dy.view(),
                            hdx,
                            16);
        model::kda_backward(gc.ctx,
                            layer.cfg,
                            dw,
                            gc.up(x),
                            model::KdaBatchViews{&batch, dt, &drows},
                            gc.up(dy),
                            ddx,
                            16);
        expect_close("kda_backward dx", ddx, dx, gc.g.s);
        expect_close("q adapter dA", dgAq, gAq, gc.g.s);
        expect_close("q adapter dB", dgBq, gBq, gc.g.s);
        expect_close("o adapter dA", dgAo, gAo, gc.g.s);
        expect_close("o adapter dB", dgBo, gBo, gc.g.s);

        // no table given: the backward builds the batch's on the device (dx only, adapters off)
        model::KdaWeightViews bare = dw;
        bare.lora_views = {};
        hw.lora_views = {};
        Tensor hdx2 = dx.view(), ddx2 = gc.up(dx);
        model::kda_backward(backend::cpu_ctx(),
                            layer.cfg,
                            hw,
                            x.view(),
                            model::KdaBatchViews{&batch, {}, nullptr},
                            dy.view(),
                            hdx2,
                            16);
        model::kda_backward(gc.ctx,
                            layer.cfg,
                            bare,
                            gc.up(x),
                            model::KdaBatchViews{&batch, {}, nullptr},
                            gc.up(dy),
                            ddx2,
                            16);
        expect_close("kda_backward dx, table built", ddx2, dx, gc.g.s);
    }
}

BOOST_AUTO_TEST_SUITE_END()
