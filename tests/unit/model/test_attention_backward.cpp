// Unit tests of attention_backward (hymoe/model/attention.h, spec/model-math.md §4, §5, §9): the
// layer's dx against central finite differences of L = Σ dy ⊙ y (y from attention_forward, fp32)
// for MLA with and without the query latent, with and without RoPE, gated and not, with YaRN; for
// DSA with top-k < T (the selection checked unchanged at every perturbed point); the LoRA
// gradients dA, dB of the q, kv and o adapters (B nonzero, one with dropout); two sequences packed
// in one batch, equal to each alone; DSA whose top-k covers every key equal to MLA; and dx against
// torch autograd (tests/golden/gen_attention_backward.py). Run from the repository root.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_attention.h"
#include "hymoe/core/error.h"
#include "hymoe/core/rng.h"
#include "hymoe/io/h5.h"
#include "hymoe/model/attention.h"
#include "hymoe/model/config.h"
#include "hymoe/model/lora.h"
#include "hymoe/model/weights.h"

namespace {

using namespace hymoe;
using namespace hymoe::model;

constexpr double fd_step = 1e-2;  // the larger finite-difference step (see fd_gradient)

double f64(float v) {
    return static_cast<double>(v);
}
Tensor view_of(std::vector<float>& v, Shape shape) {
    return Tensor{v.data(), DType::f32, Device::cpu, std::move(shape)};
}
std::vector<float> random_vec(size_t n, uint64_t seed, float std = 1.0f) {
    std::vector<float> v(n);
    Philox rng(seed, 1, 0);
    rng.fill_normal(v.data(), n, 0.0f, std);
    return v;
}

// max |a − b| / max |b|
double rel_err(const std::vector<float>& a, const std::vector<double>& b) {
    BOOST_REQUIRE_EQUAL(a.size(), b.size());
    double e = 0, scale = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        e = std::max(e, std::abs(f64(a[i]) - b[i]));
        scale = std::max(scale, std::abs(b[i]));
    }
    return e / scale;
}
double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
    return rel_err(a, std::vector<double>(b.begin(), b.end()));
}

// One attention layer with seeded weights: projections N(0, fan_in^{-1/2}) so activations and
// scores are O(1), norm weights 1 + 0.1·N(0, 1) (so their backward is not the unit case).
struct Layer {
    ModelConfig cfg;
    LayerSpec spec;
    MlaWeights w;

    Layer(ModelConfig c, Mixer mixer, bool gated, uint64_t seed = 7)
        : cfg(std::move(c)), spec{mixer, gated, Ffn::moe} {
        TensorList list = attention_tensors(cfg, spec, w);
        for (TensorSpec& t : list)
            t.std = 1.0f / std::sqrt(static_cast<float>(t.shape.back()));
        Philox rng(seed, 0, 0);
        init_random(list, rng);
        for (Buffer* norm : {&w.q_a_layernorm, &w.kv_a_layernorm}) {
            float* p = norm->ptr<float>();  // null: no query latent
            for (int64_t i = 0; p != nullptr && i < norm->view().numel(); ++i)
                p[i] += 0.1f * rng.normal();
        }
    }

    int64_t d() const { return cfg.hidden_size; }

    std::vector<float> forward(std::vector<float>& x, const SeqBatch& batch) const {
        std::vector<float> y(x.size());
        Tensor yv = view_of(y, {batch.n_tok(), d()});
        attention_forward(
            backend::cpu_ctx(), cfg, spec, w, view_of(x, {batch.n_tok(), d()}), batch, {}, yv);
        return y;
    }
    std::vector<float> backward(std::vector<float>& x,
                                const SeqBatch& batch,
                                std::vector<float>& dy) const {
        std::vector<float> dx(x.size(), 1.0f);  // overwritten
        Tensor dxv = view_of(dx, {batch.n_tok(), d()});
        attention_backward(cfg,
                           spec,
                           w,
                           view_of(x, {batch.n_tok(), d()}),
                           batch,
                           view_of(dy, {batch.n_tok(), d()}),
                           dxv);
        return dx;
    }
    // L = Σ dy ⊙ y, accumulated in double
    double loss(std::vector<float>& x, const SeqBatch& batch, const std::vector<float>& dy) const {
        const std::vector<float> y = forward(x, batch);
        double l = 0;
        for (size_t i = 0; i < y.size(); ++i)
            l += f64(dy[i]) * f64(y[i]);
        return l;
    }

    // The DSA selection of every sequence (1 = kept), from the public indexer pieces.
    std::vector<char> selection(std::vector<float>& x, const SeqBatch& batch) const {
        std::vector<char> kept;
        const int64_t r_q = cfg.mla.q_lora_rank;
        for (int64_t s = 0; s < batch.n_seq(); ++s) {
            const int64_t n = batch.length(s);
            Tensor xs = view_of(x, {batch.n_tok(), d()}).rows(batch.offsets[s], n);
            std::vector<int64_t> pos(static_cast<size_t>(n));
            std::iota(pos.begin(), pos.end(), 0);
            Buffer c_q(DType::f32, {n, r_q}), scores(DType::f32, {n, n}), mask(DType::f32, {n, n});
            ops::linear(xs, w.q_a_proj.view(), c_q.view());
            ops::rms_norm(c_q.view(),
                          w.q_a_layernorm.view(),
                          static_cast<float>(cfg.mla.norm_eps),
                          c_q.view());
            const IndexerInputs in = indexer_project(cfg, w.indexer, xs, c_q.view(), pos);
            ops::indexer_scores(in.q.view(), in.w.view(), in.k.view(), scores.view());
            ops::indexer_mask(scores.view(), 0, cfg.indexer.top_k, mask.view());
            for (int64_t i = 0; i < n * n; ++i)
                kept.push_back(mask.ptr<float>()[i] == 0.0f);
        }
        return kept;
    }
};

// ∂L/∂v_i for every element of v (a layer input or an adapter weight): central differences
// D(h) = (L(v + h) − L(v − h))/2h, Richardson-extrapolated (4·D(h/2) − D(h))/3 (error O(h⁴)), so
// that h can be large enough for fp32 rounding in L to stay ≲ 1e-4 of the gradient. For DSA,
// every perturbed point must keep the selection of the unperturbed one.
std::vector<double> fd_gradient(const Layer& L,
                                std::vector<float>& x,
                                const SeqBatch& batch,
                                const std::vector<float>& dy,
                                float* v,
                                size_t n) {
    const bool dsa = L.spec.mixer == Mixer::dsa;
    const std::vector<char> kept = dsa ? L.selection(x, batch) : std::vector<char>{};
    int64_t flips = 0;
    auto at = [&](size_t i, float v0, double h) {
        v[i] = static_cast<float>(f64(v0) + h);
        const double l = L.loss(x, batch, dy);
        flips += dsa && L.selection(x, batch) != kept;
        return l;
    };
    std::vector<double> g(n);
    for (size_t i = 0; i < n; ++i) {
        const float v0 = v[i];
        const double d1 = (at(i, v0, fd_step) - at(i, v0, -fd_step)) / (2 * fd_step);
        const double d2 = (at(i, v0, fd_step / 2) - at(i, v0, -fd_step / 2)) / fd_step;
        v[i] = v0;
        g[i] = (4 * d2 - d1) / 3;
    }
    BOOST_TEST(flips == 0);
    return g;
}

SeqBatch packed(const std::vector<int64_t>& lengths) {
    SeqBatch b{{0}, {}, {}};
    for (int64_t n : lengths) {
        b.offsets.push_back(b.offsets.back() + n);
        b.pos0.push_back(0);
    }
    return b;
}

// dx of the layer against finite differences; returns the relative error.
double check_dx(const Layer& L, const SeqBatch& batch, uint64_t seed) {
    const auto n = static_cast<size_t>(batch.n_tok() * L.d());
    std::vector<float> x = random_vec(n, seed), dy = random_vec(n, seed + 1);
    const std::vector<float> dx = L.backward(x, batch, dy);
    const std::vector<double> fd = fd_gradient(L, x, batch, dy, x.data(), n);
    const double err = rel_err(dx, fd);
    BOOST_TEST(err <= 1e-3);
    return err;
}

ModelConfig mla_config(const std::string& preset, int q_lora_rank, bool nope) {
    ModelConfig c = preset_config(preset);
    c.mla.q_lora_rank = q_lora_rank;
    c.mla.nope = nope;
    return c;
}

// A trainable adapter of rank 4 with B drawn N(0, 0.5) (PEFT's zero B would hide dA).
LoraSlot lora_slot(int64_t out, int64_t in, uint32_t stream, float dropout) {
    LoraSlot slot;
    slot.adapters.push_back(make_lora_pair(out, in, 4, 2.0f, 99, stream, true));
    LoraPair& p = slot.adapters[0];
    Philox rng(98, stream, 0);
    rng.fill_normal(p.B.ptr<float>(), static_cast<size_t>(p.B.view().numel()), 0.0f, 0.5f);
    slot.dropout = dropout;
    slot.dropout_seed = 5;
    slot.dropout_stream = stream;
    return slot;
}

std::vector<float> copy_of(const Buffer& b) {
    return std::vector<float>(b.ptr<float>(), b.ptr<float>() + b.view().numel());
}

}  // namespace

BOOST_AUTO_TEST_SUITE(attention_backward_cpu)

// MLA over one 10-token sequence: query latent or not × RoPE or NoPE × gate or not (preset tiny's
// sizes), and YaRN with the mscale² softmax scale and a cos/sin multiplier ≠ 1 (tiny-deepseek,
// mscale 2 over mscale_all_dim 1).
BOOST_AUTO_TEST_CASE(mla_dx_matches_finite_differences) {
    double worst = 0;
    for (int q_lora : {32, 0})
        for (bool nope : {false, true})
            for (bool gated : {false, true}) {
                const Layer L(mla_config("tiny", q_lora, nope), Mixer::mla, gated);
                BOOST_TEST_CONTEXT("q_lora " << q_lora << " nope " << nope << " gated " << gated) {
                    worst = std::max(worst, check_dx(L, single_sequence(10), 31));
                }
            }
    ModelConfig yarn = preset_config("tiny-deepseek");
    yarn.mla.yarn_mscale = 2.0;
    BOOST_REQUIRE(mla_rope_freqs(yarn.mla).mscale != 1.0f);
    const Layer L(yarn, Mixer::mla, true);
    BOOST_TEST_CONTEXT("yarn") {
        worst = std::max(worst, check_dx(L, single_sequence(10), 32));
    }
    BOOST_TEST_MESSAGE("mla dx vs finite differences: max relative error " << worst);
}

// DSA with top-4 of 12 tokens (queries past the 4th drop keys), gated and not.
BOOST_AUTO_TEST_CASE(dsa_dx_matches_finite_differences) {
    double worst = 0;
    for (bool gated : {true, false}) {
        ModelConfig c = preset_config("tiny");
        c.indexer.top_k = 4;
        const Layer L(c, Mixer::dsa, gated);
        BOOST_TEST_CONTEXT("gated " << gated) {
            worst = std::max(worst, check_dx(L, single_sequence(12), 33));
        }
    }
    BOOST_TEST_MESSAGE("dsa dx vs finite differences: max relative error " << worst);
}

// Two sequences (7 and 9 tokens) packed in one batch: dx against finite differences on the packed
// batch, and equal to each sequence's dx alone (gated DSA, top-4).
BOOST_AUTO_TEST_CASE(packed_batch) {
    ModelConfig c = preset_config("tiny");
    c.indexer.top_k = 4;
    const Layer L(c, Mixer::dsa, true);
    const SeqBatch batch = packed({7, 9});
    const double err = check_dx(L, batch, 34);
    const auto n = static_cast<size_t>(batch.n_tok() * L.d());
    std::vector<float> x = random_vec(n, 35), dy = random_vec(n, 36);
    const std::vector<float> dx = L.backward(x, batch, dy);
    std::vector<float> alone;
    for (int64_t s = 0; s < 2; ++s) {
        const int64_t b = batch.offsets[s] * L.d(), e = batch.offsets[s + 1] * L.d();
        std::vector<float> xs(x.begin() + b, x.begin() + e), dys(dy.begin() + b, dy.begin() + e);
        const std::vector<float> dxs = L.backward(xs, single_sequence(batch.length(s)), dys);
        alone.insert(alone.end(), dxs.begin(), dxs.end());
    }
    const double err_alone = rel_err(dx, alone);
    BOOST_TEST(err_alone <= 1e-6);
    BOOST_TEST_MESSAGE("packed dx vs finite differences: relative error "
                       << err << "; packed vs alone " << err_alone);
}

// A 300-token sequence spans two query blocks of the sweep (256 + 44), so key gradients sum over
// blocks. Directional derivatives along v = dx restricted to rows R, normalised (⟨dx, v⟩ = |dx_R|:
// a strong signal over fp32 rounding), R = all rows, the first block's, the second's, against
// Richardson-extrapolated central differences of L(x + h·v), for MLA and gated DSA (top-8).
BOOST_AUTO_TEST_CASE(two_query_blocks_directional) {
    const int64_t T = 300, block = 256;
    double worst = 0;
    for (Mixer mixer : {Mixer::mla, Mixer::dsa}) {
        const Layer L(preset_config("tiny"), mixer, mixer == Mixer::dsa);
        const int64_t d = L.d();
        const auto n = static_cast<size_t>(T * d);
        std::vector<float> x = random_vec(n, 42), dy = random_vec(n, 43);
        const SeqBatch batch = single_sequence(T);
        const std::vector<float> dx = L.backward(x, batch, dy);
        const std::vector<char> kept =
            mixer == Mixer::dsa ? L.selection(x, batch) : std::vector<char>{};
        for (auto [first, last] : {std::pair{int64_t{0}, T}, {int64_t{0}, block}, {block, T}}) {
            std::vector<double> v(n, 0.0);
            double norm = 0;
            for (int64_t i = first * d; i < last * d; ++i)
                norm += f64(dx[i]) * f64(dx[i]);
            norm = std::sqrt(norm);
            for (int64_t i = first * d; i < last * d; ++i)
                v[i] = f64(dx[i]) / norm;
            auto at = [&](double h) {
                std::vector<float> xp(n);
                for (size_t i = 0; i < n; ++i)
                    xp[i] = static_cast<float>(f64(x[i]) + h * v[i]);
                if (mixer == Mixer::dsa)
                    BOOST_TEST((L.selection(xp, batch) == kept));
                return L.loss(xp, batch, dy);
            };
            const double d1 = (at(fd_step) - at(-fd_step)) / (2 * fd_step);
            const double d2 = (at(fd_step / 2) - at(-fd_step / 2)) / fd_step;
            const double err = std::abs(norm - (4 * d2 - d1) / 3) / norm;
            BOOST_TEST_CONTEXT("mixer " << to_string(mixer) << " rows " << first << ".." << last) {
                BOOST_TEST(err <= 1e-3);
            }
            worst = std::max(worst, err);
        }
    }
    BOOST_TEST_MESSAGE("two query blocks, directional derivatives: max relative error " << worst);
}

// A DSA layer whose top-k covers every key has the MLA layer's gradient (same weights).
BOOST_AUTO_TEST_CASE(dsa_full_topk_equals_mla) {
    ModelConfig c = preset_config("tiny");
    const int64_t T = 12;
    c.indexer.top_k = static_cast<int>(T);
    Layer L(c, Mixer::dsa, true);
    const auto n = static_cast<size_t>(T * L.d());
    std::vector<float> x = random_vec(n, 37), dy = random_vec(n, 38);
    const std::vector<float> dx_dsa = L.backward(x, single_sequence(T), dy);
    L.spec.mixer = Mixer::mla;
    const std::vector<float> dx_mla = L.backward(x, single_sequence(T), dy);
    BOOST_TEST(rel_err(dx_dsa, dx_mla) <= 1e-6);
    L.spec.mixer = Mixer::dsa;
    L.cfg.indexer.top_k = 4;
    BOOST_TEST(rel_err(L.backward(x, single_sequence(T), dy), dx_mla) > 1e-3);  // sparsity matters
}

// Adapters on q (q_b_proj, input c_q; or q_proj, input x), kv (kv_a_proj_with_mqa) and o
// (o_proj, input the gated output): dA, dB and dx against finite differences, kv with dropout 0.1
// (the recomputed forward draws the same mask). Gated DSA top-4 with the query latent; gated MLA
// without.
BOOST_AUTO_TEST_CASE(lora_gradients_match_finite_differences) {
    double worst_w = 0, worst_x = 0;
    for (int q_lora : {32, 0}) {
        ModelConfig c = mla_config("tiny", q_lora, false);
        c.indexer.top_k = 4;
        Layer L(c, q_lora > 0 ? Mixer::dsa : Mixer::mla, true);
        const MlaConfig& m = L.cfg.mla;
        const int64_t d = L.d(), q_out = m.n_head * (m.qk_nope_head_dim + m.qk_rope_head_dim);
        LoraSlot q = lora_slot(q_out, q_lora > 0 ? q_lora : d, 1, 0.0f);
        LoraSlot kv = lora_slot(m.kv_lora_rank + m.qk_rope_head_dim, d, 2, 0.1f);
        LoraSlot o = lora_slot(d, m.n_head * m.v_head_dim, 3, 0.0f);
        L.w.lora.q = &q;
        L.w.lora.kv = &kv;
        L.w.lora.o = &o;
        const SeqBatch batch = packed({5, 7});
        const auto n = static_cast<size_t>(batch.n_tok() * d);
        std::vector<float> x = random_vec(n, 39), dy = random_vec(n, 40);
        const std::vector<float> dx = L.backward(x, batch, dy);
        BOOST_TEST_CONTEXT("q_lora " << q_lora) {
            const double ex = rel_err(dx, fd_gradient(L, x, batch, dy, x.data(), n));
            BOOST_TEST(ex <= 1e-3);
            worst_x = std::max(worst_x, ex);
            for (auto [name, slot] : {std::pair{"q", &q}, {"kv", &kv}, {"o", &o}}) {
                LoraPair& p = slot->adapters[0];
                for (auto [which, wgt, grad] :
                     {std::tuple{"A", &p.A, &p.dA}, std::tuple{"B", &p.B, &p.dB}}) {
                    const std::vector<double> fd =
                        fd_gradient(L,
                                    x,
                                    batch,
                                    dy,
                                    wgt->ptr<float>(),
                                    static_cast<size_t>(wgt->view().numel()));
                    const double e = rel_err(copy_of(*grad), fd);
                    BOOST_TEST_CONTEXT(name << " d" << which) {
                        BOOST_TEST(e <= 1e-3);
                    }
                    worst_w = std::max(worst_w, e);
                }
            }
            // a second backward accumulates: the gradients double
            const std::vector<float> da = copy_of(kv.adapters[0].dA);
            L.backward(x, batch, dy);
            std::vector<float> twice = copy_of(kv.adapters[0].dA);
            for (float& v : twice)
                v *= 0.5f;
            BOOST_TEST(rel_err(twice, da) <= 1e-6);
        }
    }
    BOOST_TEST_MESSAGE("lora vs finite differences: max relative error dA/dB " << worst_w << ", dx "
                                                                               << worst_x);
}

// dx against torch autograd over the same fp32 weights and inputs (float64 reference): MLA with
// YaRN, gated DSA top-8 of 24, Kimi's form (no latent, NoPE), gated DSA over 10 + 14 packed.
BOOST_AUTO_TEST_CASE(golden) {
    const std::string path = "tests/golden/attention_backward.h5";
    BOOST_REQUIRE_MESSAGE(std::filesystem::exists(path),
                          path << " is missing (run the tests from the repository root)");
    const io::H5Reader h5(path);
    std::vector<float> x = h5.floats("x"), dy = h5.floats("dy");
    const int64_t T = h5.shape("x")[0];
    const std::vector<int64_t> lengths = h5.ints("packed_lengths");
    double worst = 0;
    for (const auto& [preset, mixer, gated, group, weights] :
         {std::tuple{"tiny-deepseek", Mixer::mla, false, "mla", "weights"},
          std::tuple{"tiny", Mixer::dsa, true, "dsa", "weights"},
          std::tuple{"tiny-kimi", Mixer::mla, false, "kimi", "weights_kimi"},
          std::tuple{"tiny", Mixer::dsa, true, "packed", "weights"}}) {
        Layer L(preset_config(preset), mixer, gated);
        load_named(attention_tensors(L.cfg, L.spec, L.w),
                   std::string(weights) + "/self_attn.",
                   [&](const std::string& name, Tensor& dest) {
                       BOOST_REQUIRE_MESSAGE(h5.shape(name) == dest.shape, name);
                       const std::vector<float> v = h5.floats(name);
                       std::copy(v.begin(), v.end(), dest.ptr<float>());
                   });
        BOOST_REQUIRE((h5.shape("x") == Shape{T, L.d()}));
        const SeqBatch batch =
            std::string(group) == "packed" ? packed(lengths) : single_sequence(T);
        const double err = rel_err(L.backward(x, batch, dy), h5.floats(std::string(group) + "/dx"));
        BOOST_TEST_CONTEXT(group) {
            BOOST_TEST(err <= 1e-4);
        }
        worst = std::max(worst, err);
    }
    BOOST_TEST_MESSAGE("attention backward vs torch autograd: max relative error " << worst);
}

// Only fresh sequences: a batch that continues one is refused.
BOOST_AUTO_TEST_CASE(refuses_a_continued_sequence) {
    const Layer L(preset_config("tiny"), Mixer::mla, false);
    std::vector<float> x = random_vec(static_cast<size_t>(3 * L.d()), 41), dy = x;
    BOOST_CHECK_THROW(L.backward(x, single_sequence(3, 5), dy), Error);
}

BOOST_AUTO_TEST_SUITE_END()
