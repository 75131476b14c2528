// Unit tests of the attention block's backward and training forward on views
// (model/attention_backward_views.h) on the CPU context: rank-4 adapters on q, kv and o as factor
// views with gradient views (the GPU's form) give the dx, dA and dB of the same adapters as host
// slots (dropout 0), for MLA with and without the query latent and gated DSA, two packed sequences;
// the training forward (the expanded sweep) equals attention_forward without a cache; positions
// given on the device equal positions built; a sequence that does not start fresh is refused. The
// CUDA context against these: tests/cuda/test_attention_backward.cpp.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/core/error.h"
#include "hymoe/core/rng.h"
#include "hymoe/model/attention_backward_views.h"
#include "hymoe/model/lora.h"
#include "hymoe/model/weights.h"

using namespace hymoe;
using namespace hymoe::model;

namespace {

Buffer random(Shape shape, uint64_t seed) {
    Buffer b(DType::f32, std::move(shape));
    Philox rng(seed, 1, 0);
    rng.fill_normal(b.ptr<float>(), static_cast<size_t>(b.view().numel()), 0.0f, 1.0f);
    return b;
}

// ‖a − b‖₂ / ‖b‖₂
double rel(const Tensor& a, const Tensor& b) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < b.numel(); ++i) {
        const double want = static_cast<double>(b.ptr<float>()[i]);
        const double d = static_cast<double>(a.ptr<float>()[i]) - want;
        num += d * d;
        den += want * want;
    }
    return std::sqrt(num / den);
}

// One layer (preset tiny's sizes) with seeded weights and trainable rank-4 adapters on q, kv, o.
struct Layer {
    ModelConfig cfg;
    LayerSpec spec;
    MlaWeights w;
    LoraSlot q, kv, o;

    Layer(int q_lora_rank, Mixer mixer, bool gated)
        : cfg(preset_config("tiny")), spec{mixer, gated, Ffn::moe} {
        cfg.mla.q_lora_rank = q_lora_rank;
        cfg.indexer.top_k = 4;
        TensorList list = attention_tensors(cfg, spec, w);
        for (TensorSpec& t : list)
            t.std = 1.0f / std::sqrt(static_cast<float>(t.shape.back()));
        Philox rng(7, 0, 0);
        init_random(list, rng);
        const MlaConfig& m = cfg.mla;
        const int64_t d = cfg.hidden_size, q_in = q_lora_rank > 0 ? q_lora_rank : d;
        const int64_t q_out = m.n_head * (m.qk_nope_head_dim + m.qk_rope_head_dim);
        add(q, q_out, q_in, 1);
        add(kv, m.kv_lora_rank + m.qk_rope_head_dim, d, 2);
        add(o, d, m.n_head * m.v_head_dim, 3);
    }
    static void add(LoraSlot& s, int64_t out, int64_t in, uint32_t stream) {
        s.adapters.push_back(make_lora_pair(out, in, 4, 2.0f, 99, stream, true));
        LoraPair& p = s.adapters[0];
        Philox rng(98, stream, 0);
        rng.fill_normal(p.B.ptr<float>(), static_cast<size_t>(p.B.view().numel()), 0.0f, 0.5f);
    }
};

LoraFactorsView factors(const LoraPair& p, Buffer& dA, Buffer& dB) {
    return {p.A.view(), p.B.view(), p.scale, dA.view(), dB.view()};
}

const SeqBatch two_sequences{{0, 7, 19}, {0, 0}, {}};

}  // namespace

BOOST_AUTO_TEST_SUITE(attention_backward_views)

BOOST_AUTO_TEST_CASE(factor_views_equal_host_slots) {
    for (auto [q_lora, mixer, gated] :
         {std::tuple{32, Mixer::mla, false}, {0, Mixer::mla, true}, {32, Mixer::dsa, true}}) {
        Layer L(q_lora, mixer, gated);
        const int64_t n = two_sequences.n_tok(), d = L.cfg.hidden_size;
        const Buffer x = random({n, d}, 11), dy = random({n, d}, 12);
        // host slots
        MlaWeights& w = L.w;
        w.lora = {&L.q, nullptr, nullptr, &L.kv, &L.o};
        Buffer dx_host(DType::f32, {n, d});
        attention_backward(backend::cpu_ctx(),
                           L.cfg,
                           L.spec,
                           attention_views(w),
                           x.view(),
                           AttnBatchViews{&two_sequences, {}},
                           dy.view(),
                           dx_host.view());
        // the same adapters as factor views on adapter 0's rows (every row)
        std::vector<int64_t> all(static_cast<size_t>(n));
        std::iota(all.begin(), all.end(), 0);
        const std::vector<LoraRowsView> rows{{0, Tensor{all.data(), DType::i64, Device::cpu, {n}}}};
        std::vector<Buffer> grads;
        for (LoraSlot* s : {&L.q, &L.kv, &L.o}) {
            grads.emplace_back(DType::f32, s->adapters[0].A.view().shape);
            grads.emplace_back(DType::f32, s->adapters[0].B.view().shape);
        }
        MlaWeightViews v = attention_views(w);
        v.lora = nullptr;
        v.lora_views.q = {factors(L.q.adapters[0], grads[0], grads[1])};
        v.lora_views.kv = {factors(L.kv.adapters[0], grads[2], grads[3])};
        v.lora_views.o = {factors(L.o.adapters[0], grads[4], grads[5])};
        v.lora_rows = &rows;
        Buffer dx_views(DType::f32, {n, d});
        attention_backward(backend::cpu_ctx(),
                           L.cfg,
                           L.spec,
                           v,
                           x.view(),
                           AttnBatchViews{&two_sequences, {}},
                           dy.view(),
                           dx_views.view());
        BOOST_TEST_CONTEXT("q_lora " << q_lora << " " << to_string(mixer) << " gated " << gated) {
            BOOST_TEST(rel(dx_views.view(), dx_host.view()) < 1e-5);
            int i = 0;
            for (LoraSlot* s : {&L.q, &L.kv, &L.o}) {
                BOOST_TEST(rel(grads[i].view(), s->adapters[0].dA.view()) < 1e-5);
                BOOST_TEST(rel(grads[i + 1].view(), s->adapters[0].dB.view()) < 1e-5);
                i += 2;
            }
        }
    }
}

BOOST_AUTO_TEST_CASE(training_forward_equals_attention_forward) {
    for (auto [q_lora, mixer, gated] :
         {std::tuple{32, Mixer::mla, true}, {0, Mixer::mla, false}, {32, Mixer::dsa, true}}) {
        Layer L(q_lora, mixer, gated);
        L.w.lora = {&L.q, nullptr, nullptr, &L.kv, &L.o};
        const int64_t n = two_sequences.n_tok(), d = L.cfg.hidden_size;
        const Buffer x = random({n, d}, 13);
        Buffer want(DType::f32, {n, d}), got(DType::f32, {n, d});
        attention_forward(backend::cpu_ctx(),
                          L.cfg,
                          L.spec,
                          L.w,
                          x.view(),
                          two_sequences,
                          {},
                          want.view(),
                          AttnMode::expanded);
        std::vector<int64_t> pos{0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
        attention_forward(
            backend::cpu_ctx(),
            L.cfg,
            L.spec,
            attention_views(L.w),
            x.view(),
            AttnBatchViews{&two_sequences, Tensor{pos.data(), DType::i64, Device::cpu, {n}}},
            got.view());
        BOOST_TEST_CONTEXT("q_lora " << q_lora << " " << to_string(mixer) << " gated " << gated) {
            BOOST_TEST(rel(got.view(), want.view()) < 1e-5);
        }
    }
}

BOOST_AUTO_TEST_CASE(only_fresh_sequences) {
    const Layer L(32, Mixer::mla, false);
    const SeqBatch later{{0, 4}, {3}, {}};
    const Buffer x = random({4, L.cfg.hidden_size}, 14);
    Buffer dx(DType::f32, {4, L.cfg.hidden_size});
    BOOST_CHECK_THROW(attention_backward(backend::cpu_ctx(),
                                         L.cfg,
                                         L.spec,
                                         attention_views(L.w),
                                         x.view(),
                                         AttnBatchViews{&later, {}},
                                         x.view(),
                                         dx.view()),
                      Error);
}

BOOST_AUTO_TEST_SUITE_END()
