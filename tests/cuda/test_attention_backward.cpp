// The MLA/DSA block's backward and training forward on views (model/attention_backward_views.h) on
// a CUDA context against the same calls on the CPU context. First the strided ops they run on
// (backend/ops_strided.h: gemm over sub-blocks with every transpose, copy_block, causal_softmax
// with and without a top-k mask); then attention_backward for three fresh packed sequences (7, 1
// and 300 tokens: the last over two query blocks), MLA with the query latent, MLA without it and
// gated, DSA (top-4) gated, with rank-4 adapters on q, kv and o as factor views with gradient
// views (adapter 0's rows the whole batch): dx and every dA, dB within the fp32 bound; then the
// training forward, through attention_forward on views without caches or DeviceAttnRows and
// through the AttnBatchViews entry with positions on the device, against the CPU's
// attention_forward. Never run on a GPU yet; each case skips without one.
#include <cmath>
#include <cstdint>
#include <numeric>
#include <tuple>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "cuda_test.h"
#include "hymoe/backend/ops_strided.h"
#include "hymoe/core/rng.h"
#include "hymoe/model/attention_backward_views.h"
#include "hymoe/model/lora.h"
#include "hymoe/model/weights.h"

namespace utf = boost::unit_test;
using namespace hymoe;
using namespace hymoe::cuda_test;

namespace {

// One layer of preset tiny (top-4 DSA), projections N(0, fan_in^{-1/2}), and rank-4 factors on
// q, kv and o with B nonzero.
struct Layer {
    model::ModelConfig cfg;
    model::LayerSpec spec;
    model::MlaWeights w;
    std::vector<Buffer> factors;  // A, B of q, kv, o
    Layer(int q_lora_rank, model::Mixer mixer, bool gated)
        : cfg(model::preset_config("tiny")), spec{mixer, gated, model::Ffn::moe} {
        cfg.mla.q_lora_rank = q_lora_rank;
        cfg.indexer.top_k = 4;
        model::TensorList list = model::attention_tensors(cfg, spec, w);
        for (model::TensorSpec& t : list)
            t.std = 1.0f / std::sqrt(static_cast<float>(t.shape.back()));
        Philox rng(7, 0, 0);
        model::init_random(list, rng);
        const model::MlaConfig& m = cfg.mla;
        const int64_t d = cfg.hidden_size, q_in = q_lora_rank > 0 ? q_lora_rank : d;
        const int64_t q_out = m.n_head * (m.qk_nope_head_dim + m.qk_rope_head_dim);
        const int64_t shapes[3][2] = {
            {q_out, q_in}, {m.kv_lora_rank + m.qk_rope_head_dim, d}, {d, m.n_head * m.v_head_dim}};
        for (uint32_t i = 0; i < 3; ++i) {
            factors.push_back(random({4, shapes[i][1]}, 40 + i, DType::f32, 0.2f));
            factors.push_back(random({shapes[i][0], 4}, 50 + i, DType::f32, 0.3f));
        }
    }
};

model::MlaWeightViews upload(GpuCtx& gc, const model::MlaWeights& w) {
    const model::IndexerWeights& x = w.indexer;
    return {gc.weight(w.q_a_proj),
            gc.weight(w.q_a_layernorm),
            gc.weight(w.q_b_proj),
            gc.weight(w.q_proj),
            gc.weight(w.kv_a_proj_with_mqa),
            gc.weight(w.kv_a_layernorm),
            gc.weight(w.kv_b_proj),
            gc.weight(w.o_proj),
            gc.weight(w.g_proj),
            {gc.weight(x.wq_b),
             gc.weight(x.wk),
             gc.weight(x.k_norm_weight),
             gc.weight(x.k_norm_bias),
             gc.weight(x.weights_proj)},
            nullptr,
            {},
            nullptr};
}

const model::SeqBatch batch{{0, 7, 8, 308}, {0, 0, 0}, {}};

std::vector<int64_t> positions() {
    std::vector<int64_t> pos;
    for (int64_t s = 0; s < batch.n_seq(); ++s)
        for (int64_t i = 0; i < batch.length(s); ++i)
            pos.push_back(i);
    return pos;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_attention_backward, *utf::label("cuda"))

BOOST_AUTO_TEST_CASE(strided_ops_match_the_cpu, *utf::precondition(need_gpu)) {
    GpuCtx gc;
    const backend::Ctx cpu = backend::cpu_ctx();
    const DType f = DType::f32;
    for (bool ta : {false, true})
        for (bool tb : {false, true}) {
            const Buffer a = random({40, 50}, 1, f), b = random({40, 50}, 2, f);
            Buffer c = random({30, 60}, 3, f);
            Tensor dc = gc.up(c);
            const int64_t m = 17, n = 23, k = 31;
            ops::gemm(cpu,
                      ta,
                      tb,
                      m,
                      n,
                      k,
                      0.5f,
                      {a.view(), 52, 50},
                      {b.view(), 3, 50},
                      1.0f,
                      {c.view(), 65, 60});
            ops::gemm(gc.ctx,
                      ta,
                      tb,
                      m,
                      n,
                      k,
                      0.5f,
                      {gc.up(a), 52, 50},
                      {gc.up(b), 3, 50},
                      1.0f,
                      {dc, 65, 60});
            expect_close(
                ta ? (tb ? "gemm TT" : "gemm TN") : (tb ? "gemm NT" : "gemm NN"), dc, c, gc.g.s);
        }
    const Buffer src = random({20, 30}, 4, f);
    Buffer dst = random({25, 40}, 5, f);
    Tensor ddst = gc.up(dst);
    ops::copy_block(cpu, 18, 11, {src.view(), 33, 30}, {dst.view(), 87, 40});
    ops::copy_block(gc.ctx, 18, 11, {gc.up(src), 33, 30}, {ddst, 87, 40});
    expect_close("copy_block", ddst, dst, gc.g.s);
    const int64_t n_q = 9, n_k = 300, pos_first = n_k - n_q;
    Buffer mask(f, {n_q, n_k});
    for (int64_t e = 0; e < n_q * n_k; ++e)
        mask.ptr<float>()[e] = e % 3 == 0 ? 0.0f : -INFINITY;
    for (bool with_mask : {false, true}) {
        Buffer s = random({n_q, n_k}, 6, f);
        Tensor ds = gc.up(s), dmask = gc.up(mask);
        ops::causal_softmax(cpu, s.view(), pos_first, with_mask ? &mask.view() : nullptr);
        ops::causal_softmax(gc.ctx, ds, pos_first, with_mask ? &dmask : nullptr);
        expect_close(with_mask ? "causal_softmax, mask" : "causal_softmax", ds, s, gc.g.s);
    }
}

BOOST_AUTO_TEST_CASE(attention_backward_on_a_cuda_ctx_matches_the_cpu,
                     *utf::precondition(need_gpu)) {
    const DType f = DType::f32;
    const int64_t n = batch.n_tok();
    std::vector<int64_t> all(static_cast<size_t>(n));
    std::iota(all.begin(), all.end(), 0);
    for (auto [q_lora, mixer, gated] : {std::tuple{32, model::Mixer::mla, false},
                                        {0, model::Mixer::mla, true},
                                        {32, model::Mixer::dsa, true}}) {
        GpuCtx gc;
        const Layer layer(q_lora, mixer, gated);
        const int64_t d = layer.cfg.hidden_size;
        const Buffer x = random({n, d}, 1, f), dy = random({n, d}, 2, f);
        std::vector<Buffer> grads;  // dA, dB of q, kv, o on the host
        std::vector<Tensor> dgrads;
        for (const Buffer& fb : layer.factors) {
            grads.emplace_back(f, fb.view().shape);
            dgrads.push_back(gc.up(grads.back()));
        }
        model::MlaWeightViews hw = model::attention_views(layer.w);
        hw.lora = nullptr;
        model::MlaWeightViews dw = upload(gc, layer.w);
        model::LoraSlotView* hs[3] = {&hw.lora_views.q, &hw.lora_views.kv, &hw.lora_views.o};
        model::LoraSlotView* ds[3] = {&dw.lora_views.q, &dw.lora_views.kv, &dw.lora_views.o};
        for (size_t i = 0; i < 3; ++i) {
            const Buffer& A = layer.factors[2 * i];
            const Buffer& B = layer.factors[2 * i + 1];
            *hs[i] = {{A.view(), B.view(), 0.75f, grads[2 * i].view(), grads[2 * i + 1].view()}};
            *ds[i] = {{gc.up(A), gc.up(B), 0.75f, dgrads[2 * i], dgrads[2 * i + 1]}};
        }
        const std::vector<model::LoraRowsView> hrows{
            {0, Tensor{all.data(), DType::i64, Device::cpu, {n}}}};
        const std::vector<model::LoraRowsView> drows{{0, to_device_i64(all, gc.g.arena, gc.g.s)}};
        hw.lora_rows = &hrows;
        dw.lora_rows = &drows;

        Buffer dx(f, {n, d});
        Tensor ddx = gc.up(dx), hdx = dx.view();
        model::attention_backward(backend::cpu_ctx(),
                                  layer.cfg,
                                  layer.spec,
                                  hw,
                                  x.view(),
                                  model::AttnBatchViews{&batch, {}},
                                  dy.view(),
                                  hdx);
        model::attention_backward(gc.ctx,
                                  layer.cfg,
                                  layer.spec,
                                  dw,
                                  gc.up(x),
                                  model::AttnBatchViews{&batch, {}},
                                  gc.up(dy),
                                  ddx);
        BOOST_TEST_CONTEXT("q_lora " << q_lora << " " << to_string(mixer) << " gated " << gated) {
            expect_close("attention_backward dx", ddx, dx, gc.g.s);
            const char* names[6] = {"q dA", "q dB", "kv dA", "kv dB", "o dA", "o dB"};
            for (size_t i = 0; i < 6; ++i)
                expect_close(names[i], dgrads[i], grads[i], gc.g.s);
        }
    }
}

BOOST_AUTO_TEST_CASE(training_forward_on_a_cuda_ctx_matches_the_cpu, *utf::precondition(need_gpu)) {
    const DType f = DType::f32;
    const int64_t n = batch.n_tok();
    for (auto [q_lora, mixer, gated] : {std::tuple{32, model::Mixer::mla, true},
                                        {0, model::Mixer::mla, false},
                                        {32, model::Mixer::dsa, true}}) {
        GpuCtx gc;
        const Layer layer(q_lora, mixer, gated);
        const int64_t d = layer.cfg.hidden_size;
        const Buffer x = random({n, d}, 3, f);
        Buffer y(f, {n, d});
        Tensor hy = y.view(), dy1 = gc.up(y), dy2 = gc.up(y);
        model::attention_forward(
            backend::cpu_ctx(), layer.cfg, layer.spec, layer.w, x.view(), batch, {}, hy);
        const model::MlaWeightViews dw = upload(gc, layer.w);
        const Tensor dx = gc.up(x);
        model::attention_forward(gc.ctx, layer.cfg, layer.spec, dw, dx, batch, {}, dy1);
        model::attention_forward(
            gc.ctx,
            layer.cfg,
            layer.spec,
            dw,
            dx,
            model::AttnBatchViews{&batch, to_device_i64(positions(), gc.g.arena, gc.g.s)},
            dy2);
        BOOST_TEST_CONTEXT("q_lora " << q_lora << " " << to_string(mixer) << " gated " << gated) {
            expect_close("attention_forward, no cache", dy1, y, gc.g.s);
            expect_close("attention_forward, AttnBatchViews", dy2, y, gc.g.s);
        }
    }
}

BOOST_AUTO_TEST_SUITE_END()
