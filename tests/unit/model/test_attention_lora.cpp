// Unit tests of the MLA/DSA block's LoRA adapters as factor views (model/attention_views.h
// lora_views and lora_rows, the form the GPU model passes): on the CPU context they add what the
// host slots add (model/lora.h lora_forward, run by run) on q (q_b_proj under a query latent,
// q_proj without), kv (kv_a_proj_with_mqa, onto [c_kv | k_r] before the split) and o, for a
// prefill and the decode step after it through the caches, the sequences on different adapters
// (one on none); and adapters on k or v, which the block does not have, are refused.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/core/error.h"
#include "hymoe/core/rng.h"
#include "hymoe/model/attention_views.h"
#include "hymoe/model/lora.h"
#include "hymoe/model/lora_rows.h"
#include "hymoe/model/weights.h"

namespace {

using namespace hymoe;
using namespace hymoe::model;

// One attention layer of a preset, projections N(0, fan_in^{-1/2}), with adapters 0 and 2 on q,
// kv and o (adapter 1 leaves every projection alone), B random so that each adapter counts.
struct Layer {
    ModelConfig cfg;
    LayerSpec spec;
    MlaWeights w;
    LoraSlot q, kv, o;

    Layer(const std::string& preset, Mixer mixer)
        : cfg(preset_config(preset)), spec{mixer, true, Ffn::moe} {
        TensorList list = attention_tensors(cfg, spec, w);
        for (TensorSpec& t : list)
            t.std = 1.0f / std::sqrt(static_cast<float>(t.shape.back()));
        Philox rng(7, 0, 0);
        init_random(list, rng);
        const bool latent = cfg.mla.q_lora_rank > 0;
        adapt(q, latent ? w.q_b_proj.view() : w.q_proj.view(), 10);
        adapt(kv, w.kv_a_proj_with_mqa.view(), 20);
        adapt(o, w.o_proj.view(), 30);
        w.lora.q = &q;
        w.lora.kv = &kv;
        w.lora.o = &o;
    }
    static void adapt(LoraSlot& slot, const Tensor& proj, uint32_t stream) {
        const int64_t out = proj.dim(0), in = proj.dim(1);
        for (uint32_t a = 0; a < 3; ++a) {
            LoraPair& p = slot.adapters.emplace_back();
            if (a == 1)
                continue;
            p = make_lora_pair(out, in, 4, 0.5f + static_cast<float>(a), 5, stream + a, false);
            Philox(9, stream + a, 0)
                .fill_normal(p.B.ptr<float>(), static_cast<size_t>(out * 4), 0.0f, 0.3f);
        }
    }
    static LoraSlotView factors(const LoraSlot& slot) {
        LoraSlotView v;
        for (const LoraPair& p : slot.adapters)
            v.push_back({p.A.view(), p.B.view(), p.scale});
        return v;
    }
};

// A batch's rows of each adapter as host index lists (what the GPU model uploads).
struct Rows {
    std::vector<Buffer> keep;
    std::vector<LoraRowsView> views;
    explicit Rows(const SeqBatch& batch) {
        const LoraRows lr = adapter_rows(batch, 3);
        for (const LoraSegment& seg : lr.segments) {
            Buffer& r = keep.emplace_back(DType::i64, Shape{seg.count});
            for (int64_t i = 0; i < seg.count; ++i)
                r.ptr<int64_t>()[i] = lr.rows[static_cast<size_t>(seg.begin + i)];
            views.push_back({seg.adapter, r.view()});
        }
    }
};

float max_abs_diff(const Buffer& a, const Buffer& b) {
    float e = 0.0f;
    for (int64_t i = 0; i < a.view().numel(); ++i)
        e = std::max(e, std::abs(a.ptr<float>()[i] - b.ptr<float>()[i]));
    return e;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(attention_lora)

BOOST_AUTO_TEST_CASE(factor_views_add_what_the_host_slots_add) {
    for (const auto& [preset, mixer] : {std::pair<std::string, Mixer>{"tiny", Mixer::dsa},
                                        std::pair<std::string, Mixer>{"tiny-kimi", Mixer::mla}}) {
        BOOST_TEST_CONTEXT(preset << " " << to_string(mixer)) {
            const Layer L(preset, mixer);
            MlaWeightViews views = attention_views(L.w);
            views.lora = nullptr;
            views.lora_views.q = Layer::factors(L.q);
            views.lora_views.kv = Layer::factors(L.kv);
            views.lora_views.o = Layer::factors(L.o);
            Layer bare(preset, mixer);  // the same weights without adapters: they must count
            bare.w.lora = {};
            const backend::Ctx cpu = backend::cpu_ctx();
            std::vector<AttnCache> host(3), fact(3), base(3);
            const std::vector<AttnCache*> c_host{&host[0], &host[1], &host[2]};
            const std::vector<AttnCache*> c_fact{&fact[0], &fact[1], &fact[2]};
            const std::vector<AttnCache*> c_base{&base[0], &base[1], &base[2]};
            const int64_t d = L.cfg.hidden_size;
            uint32_t stream = 40;
            for (const SeqBatch& b : {SeqBatch{{0, 7, 8, 38}, {0, 0, 0}, {2, -1, 0}},
                                      SeqBatch{{0, 1, 2, 3}, {7, 1, 30}, {2, -1, 0}}}) {
                const int64_t n = b.n_tok();
                Buffer x(DType::f32, {n, d});
                Philox(3, stream++, 0)
                    .fill_normal(x.ptr<float>(), static_cast<size_t>(n * d), 0.0f, 1.0f);
                Buffer want(DType::f32, {n, d}), got(DType::f32, {n, d}), plain(DType::f32, {n, d});
                Tensor wv = want.view(), gv = got.view(), pv = plain.view();
                attention_forward(cpu, L.cfg, L.spec, L.w, x.view(), b, c_host, wv);
                const Rows rows(b);
                views.lora_rows = &rows.views;
                attention_forward(cpu, L.cfg, L.spec, views, x.view(), b, c_fact, gv);
                attention_forward(cpu, L.cfg, L.spec, bare.w, x.view(), b, c_base, pv);
                BOOST_TEST(max_abs_diff(got, want) < 2e-5f);
                BOOST_TEST(max_abs_diff(plain, want) > 1e-2f);
                // sequence 1 (rows [7, 8) of the prefill, row 1 of the decode) is on no adapter
                const int64_t r1 = b.offsets[1];
                for (int64_t j = 0; j < d; ++j)
                    BOOST_TEST(got.ptr<float>()[r1 * d + j] == plain.ptr<float>()[r1 * d + j]);
            }
        }
    }
}

BOOST_AUTO_TEST_CASE(adapters_on_k_or_v_are_refused) {
    const Layer L("tiny", Mixer::mla);
    MlaWeightViews views = attention_views(L.w);
    views.lora = nullptr;
    views.lora_views.k = Layer::factors(L.q);
    const SeqBatch b = single_sequence(4);
    Buffer x(DType::f32, {4, L.cfg.hidden_size}), y(DType::f32, {4, L.cfg.hidden_size});
    Tensor yv = y.view();
    BOOST_CHECK_THROW(
        attention_forward(backend::cpu_ctx(), L.cfg, L.spec, views, x.view(), b, {}, yv), Error);
}

BOOST_AUTO_TEST_SUITE_END()
