// Unit tests of MLA / DSA / gated attention (hymoe/model/attention.h, spec/model-math.md §4-5): the
// softmax core on a case computed by hand; the absorbed (MQA) form equal to the expanded (MHA) one;
// DSA equal to dense MLA when its top-k covers every key, and to a loop reference that masks
// exactly the unselected keys otherwise; one prefill equal to two chunks and to token-by-token
// decode through the cache; a packed batch equal to its sequences alone; RoPE (interleaved and
// rotate-half) and the YaRN frequencies by hand; the output gate; and the layer against the torch
// golden of tests/golden/gen_attention.py. Run from the repository root (the golden file is read
// by relative path).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_attention.h"
#include "hymoe/core/rng.h"
#include "hymoe/io/h5.h"
#include "hymoe/model/attention.h"
#include "hymoe/model/config.h"
#include "hymoe/model/weights.h"

namespace {

using namespace hymoe;
using namespace hymoe::model;

constexpr float inf = std::numeric_limits<float>::infinity();

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    BOOST_REQUIRE_EQUAL(a.size(), b.size());
    float e = 0.0f;
    for (size_t i = 0; i < a.size(); ++i)
        e = std::max(e, std::abs(a[i] - b[i]));
    return e;
}
double f64(float v) {
    return static_cast<double>(v);
}
std::vector<float> copy_of(const Tensor& t) {
    return std::vector<float>(t.ptr<float>(), t.ptr<float>() + t.numel());
}
Tensor view_of(std::vector<float>& v, Shape shape) {
    return Tensor{v.data(), DType::f32, Device::cpu, std::move(shape)};
}

// One attention layer of a tiny preset with seeded weights: projections N(0, fan_in^{-1/2}) so
// that activations, scores and outputs are O(1) (the 0.02 default would make every error tiny).
struct Layer {
    ModelConfig cfg;
    LayerSpec spec;
    MlaWeights w;

    Layer(const std::string& preset, Mixer mixer, bool gated, uint64_t seed = 7)
        : cfg(preset_config(preset)), spec{mixer, gated, Ffn::moe} {
        TensorList list = attention_tensors(cfg, spec, w);
        for (TensorSpec& t : list)
            t.std = 1.0f / std::sqrt(static_cast<float>(t.shape.back()));
        Philox rng(seed, 0, 0);
        init_random(list, rng);
    }

    // y [n_tok, d] of one call.
    std::vector<float> run(std::vector<float>& x,  // [n_tok, d]
                           const SeqBatch& batch,
                           const std::vector<AttnCache*>& caches,
                           AttnMode mode = AttnMode::automatic,
                           AttnStats* stats = nullptr) const {
        const int64_t d = cfg.hidden_size;
        std::vector<float> y(x.size());
        Tensor yv = view_of(y, {batch.n_tok(), d});
        attention_forward(backend::cpu_ctx(),
                          cfg,
                          spec,
                          w,
                          view_of(x, {batch.n_tok(), d}),
                          batch,
                          caches,
                          yv,
                          mode,
                          stats);
        return y;
    }
};

std::vector<float> random_x(int64_t n_tok, int64_t d, uint64_t seed) {
    std::vector<float> x(static_cast<size_t>(n_tok * d));
    Philox rng(seed, 1, 0);
    rng.fill_normal(x.data(), x.size(), 0.0f, 1.0f);
    return x;
}

std::vector<float> rows_of(const std::vector<float>& x, int64_t d, int64_t begin, int64_t count) {
    return std::vector<float>(x.begin() + begin * d, x.begin() + (begin + count) * d);
}

// ---- an independent loop reference (double accumulation) --------------------------------------

// Rotate the dims [0, 2·theta.size()) of v at position pos, by hand (spec §4-5).
void rope_ref(float* v, const std::vector<double>& theta, int64_t pos, bool interleaved) {
    const size_t half = theta.size();
    for (size_t i = 0; i < half; ++i) {
        const double c = std::cos(static_cast<double>(pos) * theta[i]);
        const double s = std::sin(static_cast<double>(pos) * theta[i]);
        float& a = interleaved ? v[2 * i] : v[i];
        float& b = interleaved ? v[2 * i + 1] : v[i + half];
        const double x0 = a, x1 = b;
        a = static_cast<float>(x0 * c - x1 * s);
        b = static_cast<float>(x0 * s + x1 * c);
    }
}

// y = x Wᵀ for x [n, in], W [out, in], in double.
std::vector<float> matmul_t(const std::vector<float>& x, const Buffer& w, int64_t n) {
    const int64_t out = w.view().dim(0), in = w.view().dim(1);
    std::vector<float> y(static_cast<size_t>(n * out));
    for (int64_t t = 0; t < n; ++t)
        for (int64_t o = 0; o < out; ++o) {
            double acc = 0;
            for (int64_t i = 0; i < in; ++i)
                acc += f64(x[t * in + i]) * f64(w.ptr<float>()[o * in + i]);
            y[t * out + o] = static_cast<float>(acc);
        }
    return y;
}

// x ← (x − mean)/σ or x/rms per row, × w (+ b), in double.
void norm_ref(std::vector<float>& x, int64_t dim, const Buffer& w, const Buffer* b, double eps) {
    for (size_t r = 0; r < x.size() / dim; ++r) {
        float* row = x.data() + r * dim;
        double mean = 0, ss = 0;
        if (b != nullptr) {
            for (int64_t i = 0; i < dim; ++i)
                mean += f64(row[i]);
            mean /= static_cast<double>(dim);
        }
        for (int64_t i = 0; i < dim; ++i)
            ss += (f64(row[i]) - mean) * (f64(row[i]) - mean);
        const double inv = 1.0 / std::sqrt(ss / static_cast<double>(dim) + eps);
        for (int64_t i = 0; i < dim; ++i)
            row[i] = static_cast<float>((f64(row[i]) - mean) * inv * f64(w.ptr<float>()[i]) +
                                        (b != nullptr ? f64(b->ptr<float>()[i]) : 0.0));
    }
}

// The layer for one new sequence of T tokens, written from the spec with loops: plain RoPE (no
// YaRN), query latent present. top_k = 0: dense causal attention; else each query keeps the top_k
// visible keys by the indexer score, ties to the smaller index. `kept` [T, T] returns the kept set.
std::vector<float> reference_layer(const Layer& L,
                                   const std::vector<float>& x,  // [T, d]
                                   int64_t T,
                                   int64_t top_k,
                                   std::vector<char>& kept) {  // [T, T]
    const MlaConfig& m = L.cfg.mla;
    const int64_t H = m.n_head, dn = m.qk_nope_head_dim, dr = m.qk_rope_head_dim;
    const int64_t dv = m.v_head_dim, rkv = m.kv_lora_rank;
    std::vector<double> theta(dr / 2);
    for (int64_t i = 0; i < dr / 2; ++i)
        theta[i] = std::pow(m.rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(dr));
    std::vector<float> c_q = matmul_t(x, L.w.q_a_proj, T);
    norm_ref(c_q, m.q_lora_rank, L.w.q_a_layernorm, nullptr, m.norm_eps);
    std::vector<float> q = matmul_t(c_q, L.w.q_b_proj, T);  // [T, H, dn + dr]
    std::vector<float> kv = matmul_t(x, L.w.kv_a_proj_with_mqa, T);
    std::vector<float> c_kv(T * rkv), k_r(T * dr);
    for (int64_t t = 0; t < T; ++t) {
        std::copy_n(kv.begin() + t * (rkv + dr), rkv, c_kv.begin() + t * rkv);
        std::copy_n(kv.begin() + t * (rkv + dr) + rkv, dr, k_r.begin() + t * dr);
        rope_ref(k_r.data() + t * dr, theta, t, true);
        for (int64_t h = 0; h < H; ++h)
            rope_ref(q.data() + (t * H + h) * (dn + dr) + dn, theta, t, true);
    }
    norm_ref(c_kv, rkv, L.w.kv_a_layernorm, nullptr, m.norm_eps);
    const std::vector<float> kvb = matmul_t(c_kv, L.w.kv_b_proj, T);  // [T, H, dn + dv]

    kept.assign(T * T, 0);
    for (int64_t t = 0; t < T; ++t)
        for (int64_t u = 0; u <= t; ++u)
            kept[t * T + u] = 1;
    if (top_k > 0) {
        const IndexerConfig& ic = L.cfg.indexer;
        const int64_t HI = ic.n_head, dI = ic.head_dim;
        std::vector<float> qi = matmul_t(c_q, L.w.indexer.wq_b, T);  // [T, HI, dI]
        std::vector<float> ki = matmul_t(x, L.w.indexer.wk, T);      // [T, dI]
        norm_ref(ki, dI, L.w.indexer.k_norm_weight, &L.w.indexer.k_norm_bias, 1e-6);
        const std::vector<float> wi = matmul_t(x, L.w.indexer.weights_proj, T);  // [T, HI]
        for (int64_t t = 0; t < T; ++t) {
            rope_ref(ki.data() + t * dI, theta, t, false);
            for (int64_t j = 0; j < HI; ++j)
                rope_ref(qi.data() + (t * HI + j) * dI, theta, t, false);
        }
        for (int64_t t = 0; t < T; ++t) {
            std::vector<double> score(t + 1);
            for (int64_t s = 0; s <= t; ++s)
                for (int64_t j = 0; j < HI; ++j) {
                    double dot = 0;
                    for (int64_t e = 0; e < dI; ++e)
                        dot += f64(qi[(t * HI + j) * dI + e]) * f64(ki[s * dI + e]);
                    score[s] += f64(wi[t * HI + j]) * std::max(dot, 0.0) /
                                std::sqrt(static_cast<double>(HI * dI));
                }
            std::vector<int64_t> order(t + 1);
            std::iota(order.begin(), order.end(), 0);
            std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
                return score[a] > score[b];
            });
            for (size_t r = static_cast<size_t>(top_k); r < order.size(); ++r)
                kept[t * T + order[r]] = 0;
        }
    }

    const double tau = mla_softmax_scale(m);
    std::vector<float> o(T * H * dv);
    for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < H; ++h) {
            std::vector<double> p(T, 0.0);
            double mx = -1e300, sum = 0;
            for (int64_t u = 0; u < T; ++u) {
                if (!kept[t * T + u])
                    continue;
                double s = 0;
                for (int64_t e = 0; e < dn; ++e)
                    s +=
                        f64(q[(t * H + h) * (dn + dr) + e]) * f64(kvb[(u * H + h) * (dn + dv) + e]);
                for (int64_t e = 0; e < dr; ++e)
                    s += f64(q[(t * H + h) * (dn + dr) + dn + e]) * f64(k_r[u * dr + e]);
                p[u] = s * tau;
                mx = std::max(mx, p[u]);
            }
            for (int64_t u = 0; u < T; ++u)
                if (kept[t * T + u])
                    sum += (p[u] = std::exp(p[u] - mx));
            for (int64_t e = 0; e < dv; ++e) {
                double acc = 0;
                for (int64_t u = 0; u < T; ++u)
                    if (kept[t * T + u])
                        acc += p[u] / sum * f64(kvb[(u * H + h) * (dn + dv) + dn + e]);
                o[(t * H + h) * dv + e] = static_cast<float>(acc);
            }
        }
    if (L.spec.gated) {
        const std::vector<float> g = matmul_t(x, L.w.g_proj, T);
        for (size_t i = 0; i < o.size(); ++i)
            o[i] = static_cast<float>(f64(o[i]) / (1.0 + std::exp(-f64(g[i]))));
    }
    return matmul_t(o, L.w.o_proj, T);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(attention)

// (a) 1 head, 2 tokens, d_qk = d_v = 2, τ = 1/2, causal. Token 0 sees only key 0: o_0 = v_0.
// Token 1: scores (q_1·k_0, q_1·k_1)·τ = (0, 0.5), p = (1, e^{0.5})/(1 + e^{0.5})
// = (0.3775406688, 0.6224593312), o_1 = p_0 v_0 + p_1 v_1 = (2.2449186624, 3.2449186624).
BOOST_AUTO_TEST_CASE(core_by_hand) {
    std::vector<float> q{1, 0, 0, 1}, k{1, 0, 1, 1}, v{1, 2, 3, 4}, mask{0, -inf, 0, 0}, o(4);
    Tensor ov = view_of(o, {2, 2});
    ops::attention_core(view_of(q, {2, 2}),
                        view_of(k, {2, 2}),
                        view_of(v, {2, 2}),
                        view_of(mask, {2, 2}),
                        0.5f,
                        ov);
    const std::vector<float> want{1.0f, 2.0f, 2.2449186624f, 3.2449186624f};
    BOOST_TEST(max_abs_diff(o, want) <= 1e-6f);
}

// (b) The MQA form over the latent equals the MHA form, for MLA (YaRN) and gated DSA, in a
// 20-token prefill and in a decode step after it.
BOOST_AUTO_TEST_CASE(absorbed_equals_expanded) {
    const int64_t T = 20;
    float worst = 0.0f;
    for (const auto& [preset, mixer, gated] :
         {std::tuple{"tiny-deepseek", Mixer::mla, false}, std::tuple{"tiny", Mixer::dsa, true}}) {
        const Layer L(preset, mixer, gated);
        std::vector<float> x = random_x(T + 1, L.cfg.hidden_size, 11);
        std::vector<float> prompt = rows_of(x, L.cfg.hidden_size, 0, T);
        std::vector<float> next = rows_of(x, L.cfg.hidden_size, T, 1);
        AttnCache ce, ca;
        const std::vector<float> pe = L.run(prompt, single_sequence(T), {&ce}, AttnMode::expanded);
        const std::vector<float> pa = L.run(prompt, single_sequence(T), {&ca}, AttnMode::absorbed);
        const std::vector<float> de = L.run(next, single_sequence(1, T), {&ce}, AttnMode::expanded);
        const std::vector<float> da = L.run(next, single_sequence(1, T), {&ca}, AttnMode::absorbed);
        BOOST_TEST_CONTEXT(preset) {
            BOOST_TEST(max_abs_diff(pa, pe) <= 1e-5f);
            BOOST_TEST(max_abs_diff(da, de) <= 1e-5f);
        }
        worst = std::max({worst, max_abs_diff(pa, pe), max_abs_diff(da, de)});
    }
    BOOST_TEST_MESSAGE("absorbed vs expanded: max |diff| " << worst);
}

// (c) DSA whose top-k covers every key is dense MLA (same weights, indexer unused); with top-k 8 <
// 24 tokens it differs, and equals a loop reference masking exactly the keys it did not select.
BOOST_AUTO_TEST_CASE(dsa_topk) {
    const int64_t T = 24;
    Layer L("tiny", Mixer::dsa, true);
    std::vector<float> x = random_x(T, L.cfg.hidden_size, 12);
    L.spec.mixer = Mixer::mla;  // the same weights, the indexer unused
    const std::vector<float> y_dense = L.run(x, single_sequence(T), {});
    std::vector<char> kept;
    BOOST_TEST(max_abs_diff(y_dense, reference_layer(L, x, T, 0, kept)) <= 1e-5f);
    L.spec.mixer = Mixer::dsa;

    L.cfg.indexer.top_k = static_cast<int>(T);
    const std::vector<float> y_full = L.run(x, single_sequence(T), {});
    BOOST_TEST(max_abs_diff(y_full, y_dense) <= 1e-6f);

    L.cfg.indexer.top_k = 8;
    for (AttnMode mode : {AttnMode::expanded, AttnMode::absorbed, AttnMode::sparse}) {
        AttnStats stats;
        const std::vector<float> y_sparse = L.run(x, single_sequence(T), {}, mode, &stats);
        const std::vector<float> y_ref = reference_layer(L, x, T, 8, kept);
        BOOST_TEST(max_abs_diff(y_sparse, y_dense) > 1e-2f);
        BOOST_TEST(max_abs_diff(y_sparse, y_ref) <= 1e-5f);
        BOOST_TEST(std::count(kept.begin(), kept.end(), 1) == 8 * (T - 8) + 8 * 9 / 2);
        BOOST_TEST(stats.indexer_seconds > 0.0);
        const float sparse_err = max_abs_diff(y_sparse, y_ref);
        const float full_err = max_abs_diff(y_full, y_dense);
        BOOST_TEST_MESSAGE("dsa top-8 vs loop reference: max |diff| "
                           << sparse_err << "; top-24 vs dense " << full_err);
    }
}

// (c2) The sparse DSA prefill (each query over its own gathered top-k rows; the automatic choice)
// equals the masked-dense expanded form: 300 new tokens (two query blocks) after a 40-token
// chunk already in the cache, top-k 16 of up to 340 keys; and the selection is ops::top_k's.
BOOST_AUTO_TEST_CASE(dsa_sparse_equals_masked_dense) {
    const int64_t T0 = 40, T = 300;
    Layer L("tiny", Mixer::dsa, true);
    L.cfg.indexer.top_k = 16;
    const int64_t d = L.cfg.hidden_size;
    std::vector<float> x = random_x(T0 + T, d, 21);
    std::vector<float> head = rows_of(x, d, 0, T0), rest = rows_of(x, d, T0, T);
    float worst = 0.0f;
    AttnCache ref;
    L.run(head, single_sequence(T0), {&ref}, AttnMode::expanded);
    const AttnCache start = ref;
    const std::vector<float> y_ref =
        L.run(rest, single_sequence(T, T0), {&ref}, AttnMode::expanded);
    for (AttnMode mode : {AttnMode::sparse, AttnMode::automatic}) {
        AttnCache c = start;
        const std::vector<float> y = L.run(rest, single_sequence(T, T0), {&c}, mode);
        BOOST_TEST(max_abs_diff(y, y_ref) <= 1e-5f);
        worst = std::max(worst, max_abs_diff(y, y_ref));
    }
    // indexer_select keeps exactly ops::top_k's keys (ties included: scores rounded to force them)
    Buffer scores(DType::f32, {T, T0 + T});
    Philox rng(5, 0, 0);
    rng.fill_normal(scores.ptr<float>(), static_cast<size_t>(T * (T0 + T)), 0.0f, 1.0f);
    for (int64_t i = 0; i < T * (T0 + T); ++i)
        scores.ptr<float>()[i] = std::round(4.0f * scores.ptr<float>()[i]);
    const int64_t k = 16;
    std::vector<int64_t> keep(T * k), n_keep(T), want(k);
    ops::indexer_select(scores.view(), T0, k, keep.data(), n_keep.data());
    int64_t differ = 0;
    for (int64_t i = 0; i < T; ++i) {
        const int64_t visible = T0 + i + 1;
        BOOST_TEST(n_keep[i] == std::min(k, visible));
        ops::top_k(scores.ptr<float>() + i * (T0 + T), visible, n_keep[i], want.data());
        std::sort(want.begin(), want.begin() + n_keep[i]);
        differ += !std::equal(want.begin(), want.begin() + n_keep[i], keep.begin() + i * k);
    }
    BOOST_TEST(differ == 0);
    BOOST_TEST_MESSAGE("dsa sparse prefill vs masked dense: max |diff| " << worst);
}

// (d) One 24-token prefill == 10 + 14 chunks == 24 single-token decode steps through the cache.
BOOST_AUTO_TEST_CASE(chunked_and_decode_equal_prefill) {
    const int64_t T = 24;
    float worst = 0.0f;
    for (const auto& [preset, mixer, gated] :
         {std::tuple{"tiny-deepseek", Mixer::mla, false}, std::tuple{"tiny", Mixer::dsa, true}}) {
        const Layer L(preset, mixer, gated);
        const int64_t d = L.cfg.hidden_size;
        std::vector<float> x = random_x(T, d, 13);
        AttnCache c1, c2, c3;
        const std::vector<float> once = L.run(x, single_sequence(T), {&c1});
        std::vector<float> chunked, stepped;
        for (auto [begin, count] : {std::pair<int64_t, int64_t>{0, 10}, {10, 14}}) {
            std::vector<float> part = rows_of(x, d, begin, count);
            const std::vector<float> y = L.run(part, single_sequence(count, begin), {&c2});
            chunked.insert(chunked.end(), y.begin(), y.end());
        }
        for (int64_t t = 0; t < T; ++t) {
            std::vector<float> part = rows_of(x, d, t, 1);
            const std::vector<float> y = L.run(part, single_sequence(1, t), {&c3});
            stepped.insert(stepped.end(), y.begin(), y.end());
        }
        BOOST_TEST_CONTEXT(preset) {
            BOOST_TEST(max_abs_diff(chunked, once) <= 1e-5f);
            BOOST_TEST(max_abs_diff(stepped, once) <= 1e-5f);
            BOOST_TEST((c1.n == T && c2.n == T && c3.n == T));
            BOOST_TEST(max_abs_diff(c3.c_kv, c1.c_kv) <= 1e-6f);  // GEMV vs GEMM rounding
            BOOST_TEST(max_abs_diff(c3.k_idx, c1.k_idx) <= 1e-6f);
        }
        worst = std::max({worst, max_abs_diff(chunked, once), max_abs_diff(stepped, once)});
    }
    BOOST_TEST_MESSAGE("chunked / decode vs one prefill: max |diff| " << worst);
}

// (e) A packed batch of 3 sequences (new prompts of 5, 12, 7 tokens, then continued by 1, 3, 2
// tokens: a decode row next to prefill chunks) equals each sequence run alone.
BOOST_AUTO_TEST_CASE(packed_batch_equals_alone) {
    const Layer L("tiny", Mixer::dsa, true);
    const int64_t d = L.cfg.hidden_size;
    const std::vector<std::vector<int64_t>> steps{{5, 12, 7}, {1, 3, 2}};
    std::vector<AttnCache> packed(3), alone(3);
    std::vector<int64_t> pos0(3, 0);
    float worst = 0.0f;
    uint64_t seed = 20;
    for (const std::vector<int64_t>& lens : steps) {
        SeqBatch batch{{0}, pos0, {}};
        std::vector<float> x, y_alone;
        for (int64_t s = 0; s < 3; ++s) {
            batch.offsets.push_back(batch.offsets.back() + lens[s]);
            std::vector<float> xs = random_x(lens[s], d, seed++);
            const std::vector<float> ys = L.run(xs, single_sequence(lens[s], pos0[s]), {&alone[s]});
            x.insert(x.end(), xs.begin(), xs.end());
            y_alone.insert(y_alone.end(), ys.begin(), ys.end());
            pos0[s] += lens[s];
        }
        const std::vector<float> y = L.run(x, batch, {&packed[0], &packed[1], &packed[2]});
        BOOST_TEST(max_abs_diff(y, y_alone) <= 1e-6f);
        worst = std::max(worst, max_abs_diff(y, y_alone));
    }
    for (int64_t s = 0; s < 3; ++s)
        BOOST_TEST(packed[s].n == pos0[s]);
    BOOST_TEST_MESSAGE("packed vs alone: max |diff| " << worst);
}

// (f) RoPE on v = (1, 2, 3, 4) at position 1 with θ = (1, 0.1): interleaved rotates (1, 2) by 1
// rad and (3, 4) by 0.1; rotate-half rotates (1, 3) by 1 and (2, 4) by 0.1.
BOOST_AUTO_TEST_CASE(rope_by_hand) {
    ops::RopeFreqs freqs;
    freqs.theta = {1.0f, 0.1f};
    const int64_t pos = 1;
    std::vector<float> a{1, 2, 3, 4}, b{1, 2, 3, 4};
    ops::rope(a.data(), 1, 1, 4, 4, &pos, freqs, true);
    ops::rope(b.data(), 1, 1, 4, 4, &pos, freqs, false);
    // cos 1 = 0.5403023059, sin 1 = 0.8414709848, cos 0.1 = 0.9950041653, sin 0.1 = 0.0998334166
    BOOST_TEST(max_abs_diff(a, {-1.1426396637f, 1.9220755966f, 2.5856788295f, 4.2795169110f}) <=
               1e-6f);
    BOOST_TEST(max_abs_diff(b, {-1.9841106485f, 1.5906746642f, 2.4623779025f, 4.1796834944f}) <=
               1e-6f);
}

// (f) YaRN as MLA configures it (tiny-deepseek: d_r 8, θ 1e4, factor 4 over 64 positions, β
// 32/1) against spec §4: low = floor(corr(32)) → 0, high = ceil(corr(1)) → 2, corr(r) =
// d_r·ln(64/(2πr))/(2 ln θ); smooth_i = 1 − clamp(i/2, 0, 1); θ'_i = θ_i/4·(1 − smooth) +
// θ_i·smooth.
BOOST_AUTO_TEST_CASE(yarn_frequencies) {
    MlaConfig m = preset_config("tiny-deepseek").mla;
    const double d_r = m.qk_rope_head_dim, base = m.rope_theta;
    auto corr = [&](double rot) {
        return d_r * std::log(64.0 / (rot * 2.0 * M_PI)) / (2.0 * std::log(base));
    };
    const double low = std::max(std::floor(corr(32.0)), 0.0);
    const double high = std::min(std::ceil(corr(1.0)), d_r - 1.0);
    BOOST_TEST(low == 0.0);
    BOOST_TEST(high == 2.0);
    const ops::RopeFreqs f = mla_rope_freqs(m);
    BOOST_REQUIRE_EQUAL(f.theta.size(), 4u);
    for (int i = 0; i < 4; ++i) {
        const double theta = std::pow(base, -2.0 * i / d_r);
        const double smooth = 1.0 - std::clamp((i - low) / (high - low), 0.0, 1.0);
        const double want = theta / 4.0 * (1.0 - smooth) + theta * smooth;
        BOOST_TEST(std::abs(f64(f.theta[i]) - want) <= 1e-6 * want);
    }
    BOOST_TEST(f.mscale == 1.0f);  // mscale = mscale_all_dim: cos/sin unscaled
    m.yarn_mscale = 2.0;           // HF ratio (0.2 ln 4 + 1)/(0.1 ln 4 + 1)
    BOOST_TEST(std::abs(f64(mla_rope_freqs(m).mscale) - 1.2772588722 / 1.1386294361) <= 1e-6);
    m.rope_scaling = RopeScaling::none;
    BOOST_TEST(mla_rope_freqs(m).theta[3] == static_cast<float>(std::pow(base, -0.75)));
}

// (g) The output gate with W_g = 0 halves the ungated output (σ(0) = 1/2).
BOOST_AUTO_TEST_CASE(zero_gate_halves) {
    const int64_t T = 12;
    for (Mixer mixer : {Mixer::mla, Mixer::dsa}) {
        Layer L("tiny", mixer, true);
        std::fill_n(L.w.g_proj.ptr<float>(), L.w.g_proj.view().numel(), 0.0f);
        std::vector<float> x = random_x(T, L.cfg.hidden_size, 14);
        const std::vector<float> y_gated = L.run(x, single_sequence(T), {});
        L.spec.gated = false;  // the same weights, g_proj unused
        std::vector<float> y_half = L.run(x, single_sequence(T), {});
        for (float& v : y_half)
            v *= 0.5f;
        BOOST_TEST(max_abs_diff(y_gated, y_half) <= 1e-7f);
    }
}

// The named tensors: HF names and shapes by query path, gate and indexer.
BOOST_AUTO_TEST_CASE(tensor_lists) {
    MlaWeights w;
    const ModelConfig tiny = preset_config("tiny");
    std::vector<std::string> names;
    for (const TensorSpec& t : attention_tensors(tiny, {Mixer::dsa, true, Ffn::moe}, w))
        names.push_back(t.name);
    BOOST_TEST(names.size() == 13u);
    BOOST_TEST((std::count(names.begin(), names.end(), "indexer.k_norm.bias") == 1));
    BOOST_TEST((std::count(names.begin(), names.end(), "g_proj.weight") == 1));
    const TensorList kimi =
        attention_tensors(preset_config("tiny-kimi"), {Mixer::mla, false, Ffn::moe}, w);
    BOOST_TEST(kimi.size() == 5u);
    BOOST_TEST(kimi[0].name == "q_proj.weight");
    BOOST_TEST((kimi[0].shape == Shape{4 * 24, 64}));
}

// Kimi-Linear's form (no query latent, NoPE): absorbed == expanded and decode == prefill.
BOOST_AUTO_TEST_CASE(kimi_nope) {
    const int64_t T = 9;
    const Layer L("tiny-kimi", Mixer::mla, false);
    const int64_t d = L.cfg.hidden_size;
    std::vector<float> x = random_x(T, d, 15);
    AttnCache c;
    const std::vector<float> once = L.run(x, single_sequence(T), {}, AttnMode::absorbed);
    std::vector<float> stepped;
    for (int64_t t = 0; t < T; ++t) {
        std::vector<float> part = rows_of(x, d, t, 1);
        const std::vector<float> y = L.run(part, single_sequence(1, t), {&c}, AttnMode::expanded);
        stepped.insert(stepped.end(), y.begin(), y.end());
    }
    BOOST_TEST(max_abs_diff(stepped, once) <= 1e-5f);
}

// (h) The layer against the torch reference of tests/golden/gen_attention.py: MLA with YaRN
// (tiny-deepseek) and gated DSA with top-8 of 24 (tiny), with the indexer scores and selection.
BOOST_AUTO_TEST_CASE(golden) {
    const std::string path = "tests/golden/attention.h5";
    BOOST_REQUIRE_MESSAGE(std::filesystem::exists(path),
                          path << " is missing (run the tests from the repository root)");
    const io::H5Reader h5(path);
    std::vector<float> x = h5.floats("x");
    const int64_t T = h5.shape("x")[0];
    float worst = 0.0f;
    for (const auto& [preset, mixer, gated, group] :
         {std::tuple{"tiny-deepseek", Mixer::mla, false, "mla"},
          std::tuple{"tiny", Mixer::dsa, true, "dsa"}}) {
        Layer L(preset, mixer, gated);
        load_named(attention_tensors(L.cfg, L.spec, L.w),
                   "weights/self_attn.",
                   [&](const std::string& name, Tensor& dest) {
                       BOOST_REQUIRE_MESSAGE(h5.shape(name) == dest.shape, name);
                       const std::vector<float> v = h5.floats(name);
                       std::copy(v.begin(), v.end(), dest.ptr<float>());
                   });
        BOOST_REQUIRE((h5.shape("x") == Shape{T, L.cfg.hidden_size}));
        const std::vector<float> y_ref = h5.floats(std::string(group) + "/y");
        for (AttnMode mode : {AttnMode::expanded, AttnMode::absorbed, AttnMode::sparse}) {
            const std::vector<float> y = L.run(x, single_sequence(T), {}, mode);
            BOOST_TEST_CONTEXT(group << " mode " << static_cast<int>(mode)) {
                BOOST_TEST(max_abs_diff(y, y_ref) <= 1e-5f);
            }
            worst = std::max(worst, max_abs_diff(y, y_ref));
        }
        if (mixer != Mixer::dsa)
            continue;
        // the indexer alone: scores and the kept set
        std::vector<int64_t> pos(T);
        std::iota(pos.begin(), pos.end(), 0);
        Buffer c_q(DType::f32, {T, L.cfg.mla.q_lora_rank});
        ops::linear(view_of(x, {T, L.cfg.hidden_size}), L.w.q_a_proj.view(), c_q.view());
        ops::rms_norm(c_q.view(), L.w.q_a_layernorm.view(), 1e-6f, c_q.view());
        IndexerInputs in = indexer_project(
            L.cfg, L.w.indexer, view_of(x, {T, L.cfg.hidden_size}), c_q.view(), pos);
        Buffer scores(DType::f32, {T, T}), mask(DType::f32, {T, T});
        ops::indexer_scores(in.q.view(), in.w.view(), in.k.view(), scores.view());
        ops::indexer_mask(scores.view(), 0, L.cfg.indexer.top_k, mask.view());
        const float score_err = max_abs_diff(copy_of(scores.view()), h5.floats("dsa/index_scores"));
        BOOST_TEST(score_err <= 1e-5f);
        const std::vector<int64_t> selected = h5.ints("dsa/selected");
        int64_t mismatched = 0;
        for (int64_t i = 0; i < T * T; ++i)
            mismatched += (mask.ptr<float>()[i] == 0.0f) != (selected[i] != 0);
        BOOST_TEST(mismatched == 0);
        BOOST_TEST_MESSAGE("indexer scores vs golden: max |diff| " << score_err);
    }
    BOOST_TEST_MESSAGE("attention golden: max |diff| " << worst);
}

BOOST_AUTO_TEST_SUITE_END()
