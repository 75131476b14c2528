// Unit tests of the FFN blocks (hymoe/model/ffn.h, spec/model-math.md §6-7): routing on a
// 4-expert, 2-group case worked by hand (sigmoid + bias + group limit + renormalise + ρ); the HF
// Kimi biased-weight switch, softmax scoring and Kimi's 0.0 group fill; top_k = E routing equal to
// the dense score-weighted sum of every expert; capacity dropping under both policies; LatentMoE
// against plain loops; bit-exact permutation invariance; and the torch golden of
// tests/golden/gen_moe.py (DeepSeek grouped routing and a relu2 LatentMoE). Run from the
// repository root (the golden file is read by relative path).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/core/rng.h"
#include "hymoe/io/h5.h"
#include "hymoe/model/ffn.h"
#include "hymoe/model/weights.h"

namespace {

using namespace hymoe;
using namespace hymoe::model;

const LayerSpec moe_layer{Mixer::kda, false, Ffn::moe};
const LayerSpec latent_layer{Mixer::kda, false, Ffn::latent_moe};

// The tiny MoE of model-math §13 (DeepSeek path): d 64, E 8, top-2, groups 2/1, sigmoid + bias,
// renormalised, ρ 2.5, one shared expert of width 32; ℓ 32 for latent layers.
ModelConfig tiny_moe() {
    ModelConfig c;
    c.model_type = "deepseek_v32";
    c.hidden_size = 64;
    MoeConfig& m = c.moe;
    m.n_routed_experts = 8;
    m.top_k = 2;
    m.n_shared_experts = 1;
    m.moe_intermediate = 32;
    m.shared_intermediate = 32;
    m.latent_size = 32;
    m.n_group = 2;
    m.topk_group = 1;
    m.routed_scaling_factor = 2.5;
    return c;
}

// Random weights at unit-variance scale (std = fan_in^{-1/2}, bias 0.1·N(0,1)).
MoeWeights random_moe(const ModelConfig& cfg, const LayerSpec& spec, uint64_t seed) {
    MoeWeights w;
    TensorList list = ffn_tensors(cfg, spec, nullptr, &w);
    for (TensorSpec& s : list)
        if (s.init == Init::normal)
            s.std = 1.0f / std::sqrt(static_cast<float>(s.shape[1]));
    Philox rng(seed, 0, 0);
    init_random(list, rng);
    return w;
}

Buffer random_x(int64_t n_tok, int64_t d, uint64_t seed) {
    Buffer x(DType::f32, {n_tok, d});  // [n_tok, d]
    Philox rng(seed, 1, 0);
    rng.fill_normal(x.ptr<float>(), static_cast<size_t>(x.view().numel()), 0.0f, 1.0f);
    return x;
}

Buffer filled(Shape shape, const std::vector<float>& values) {
    Buffer b(DType::f32, std::move(shape));
    BOOST_REQUIRE_EQUAL(static_cast<int64_t>(values.size()), b.view().numel());
    std::copy(values.begin(), values.end(), b.ptr<float>());
    return b;
}

// Rows of values → one row-major vector.
std::vector<float> flat(const std::vector<std::vector<float>>& rows) {
    std::vector<float> v;
    for (const std::vector<float>& r : rows)
        v.insert(v.end(), r.begin(), r.end());
    return v;
}

float max_abs_diff(const float* a, const float* b, int64_t n) {
    float e = 0.0f;
    for (int64_t i = 0; i < n; ++i)
        e = std::max(e, std::abs(a[i] - b[i]));
    return e;
}

float sigmoid_ref(float l) {
    return 1.0f / (1.0f + std::exp(-l));
}

// ---- the hand-worked router case ----------------------------------------------------------------
// E = 4 in 2 groups {0, 1}, {2, 3}; d = 4 with an identity gate, so the logits are the rows of x.
// b = [0.1, 0.3, 0, 0]. Token by token (s = σ(l), s' = s + b, group score = top-2 sum of s'):
//   t0 l = [1, 0.5, 2, −2]:     s' = [.831, .923, .881, .119]; groups 1.754 vs 1.000 → keep 0:
//                               [1, 0] (ungrouped it would be [1, 2]: the group limit drops 2)
//   t1 l = [−1, 0, 0.5, 1.5]:   s' = [.369, .800, .622, .818]; groups 1.169 vs 1.440 → keep 1:
//                               [3, 2] (ungrouped [3, 1])
//   t2 l = [0.3, 0, 0.25, 0.2]: s' = [.674, .800, .562, .550]; keep 0: [1, 0] (without the bias
//                               the order would be [0, 1])
const std::vector<float> hand_logits =
    flat({{1.0f, 0.5f, 2.0f, -2.0f}, {-1.0f, 0.0f, 0.5f, 1.5f}, {0.3f, 0.0f, 0.25f, 0.2f}});
const std::vector<float> hand_bias = {0.1f, 0.3f, 0.0f, 0.0f};

ModelConfig hand_config() {
    ModelConfig c;
    c.model_type = "deepseek_v32";
    c.hidden_size = 4;
    MoeConfig& m = c.moe;
    m.n_routed_experts = 4;
    m.top_k = 2;
    m.moe_intermediate = 2;
    m.n_group = 2;
    m.topk_group = 1;
    m.routed_scaling_factor = 2.5;
    return c;
}

MoeWeights hand_router(const std::vector<float>& bias) {
    MoeWeights w;
    w.gate = filled({4, 4}, {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1});
    w.correction_bias = filled({4}, bias);
    return w;
}

// The expected weights: src[idx_i] / Σ_j src[idx_j] · ρ, per token.
std::vector<float> renormalised(const std::vector<float>& src /*[n_tok, E]*/,
                                const std::vector<int64_t>& idx /*[n_tok, k]*/,
                                int64_t n_exp,
                                int64_t k,
                                float rho) {
    std::vector<float> w(idx.size());
    for (size_t t = 0; t < idx.size() / static_cast<size_t>(k); ++t) {
        float sum = 0.0f;
        for (int64_t i = 0; i < k; ++i)
            sum += src[t * n_exp + idx[t * k + i]];
        for (int64_t i = 0; i < k; ++i)
            w[t * k + i] = src[t * n_exp + idx[t * k + i]] / sum * rho;
    }
    return w;
}

std::vector<float> sigmoid_scores(const std::vector<float>& logits, const std::vector<float>& b) {
    std::vector<float> s(logits.size());
    for (size_t i = 0; i < s.size(); ++i)
        s[i] = sigmoid_ref(logits[i]) + b[i % b.size()];
    return s;
}

Routing route_hand(const ModelConfig& cfg, const std::vector<float>& bias) {
    Buffer x = filled({3, 4}, hand_logits);
    return route(cfg, hand_router(bias), x.view());
}

// ---- plain-loop references ----------------------------------------------------------------------

// y [n] = W [out, in] x [in]
std::vector<float> matvec(const Buffer& w, const float* x) {
    const int64_t out = w.view().dim(0), in = w.view().dim(1);
    std::vector<float> y(static_cast<size_t>(out), 0.0f);
    for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < in; ++i)
            y[o] += w.ptr<float>()[o * in + i] * x[i];
    return y;
}

// One MLP on one row, by loops: down(act(x)).
std::vector<float> mlp_ref(const DenseFfnWeights& w, ExpertAct act, const float* x) {
    std::vector<float> h = matvec(w.up_proj, x);
    if (act == ExpertAct::swiglu) {
        const std::vector<float> g = matvec(w.gate_proj, x);
        for (size_t i = 0; i < h.size(); ++i)
            h[i] *= g[i] * sigmoid_ref(g[i]);
    } else {
        for (float& v : h)
            v = v > 0.0f ? v * v : 0.0f;
    }
    return matvec(w.down_proj, h.data());
}

}  // namespace

BOOST_AUTO_TEST_SUITE(moe)

BOOST_AUTO_TEST_CASE(routing_by_hand_sigmoid_bias_groups_renormalise_rho) {
    const ModelConfig cfg = hand_config();
    const Routing r = route_hand(cfg, hand_bias);
    const std::vector<int64_t> want_idx = {1, 0, 3, 2, 1, 0};
    BOOST_TEST(r.idx == want_idx, boost::test_tools::per_element());
    // Every pick lies in the kept group: t0, t2 in {0, 1}; t1 in {2, 3}.
    for (int64_t t = 0; t < 3; ++t)
        for (int64_t i = 0; i < 2; ++i)
            BOOST_TEST((r.idx[t * 2 + i] / 2) == (t == 1 ? 1 : 0));
    const std::vector<float> s = sigmoid_scores(hand_logits, {0.0f});
    const std::vector<float> want_w = renormalised(s, want_idx, 4, 2, 2.5f);
    for (size_t a = 0; a < want_w.size(); ++a)
        BOOST_TEST(r.weight[a] == want_w[a], boost::test_tools::tolerance(1e-6f));
    BOOST_TEST(r.tokens_per_expert == std::vector<int64_t>({2, 2, 1, 1}),
               boost::test_tools::per_element());
    BOOST_TEST(r.dropped == 0);

    // Without group limiting, t0 takes expert 2 of the dropped group and t1 expert 1.
    ModelConfig flat = cfg;
    flat.moe.n_group = 1;
    BOOST_TEST(route_hand(flat, hand_bias).idx == std::vector<int64_t>({1, 2, 3, 1, 1, 0}),
               boost::test_tools::per_element());
    // Without the bias the group score is the best s: t0 keeps group 1 (.881 > .731), [2, 3];
    // t2 picks by s alone, [0, 1].
    ModelConfig no_bias = cfg;
    no_bias.moe.correction_bias = false;
    MoeWeights plain = hand_router(hand_bias);
    plain.correction_bias = Buffer();
    Buffer x = filled({3, 4}, hand_logits);
    BOOST_TEST(route(no_bias, plain, x.view()).idx == std::vector<int64_t>({2, 3, 3, 2, 0, 1}),
               boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(hf_kimi_biased_weights_switch) {
    ModelConfig cfg = hand_config();
    const Routing unbiased = route_hand(cfg, hand_bias);
    cfg.moe.weights_from_biased_scores = true;
    const Routing biased = route_hand(cfg, hand_bias);
    BOOST_TEST(biased.idx == unbiased.idx, boost::test_tools::per_element());
    const std::vector<float> s_b = sigmoid_scores(hand_logits, hand_bias);
    const std::vector<float> want = renormalised(s_b, biased.idx, 4, 2, 2.5f);
    float largest_change = 0.0f;
    for (size_t a = 0; a < want.size(); ++a) {
        BOOST_TEST(biased.weight[a] == want[a], boost::test_tools::tolerance(1e-6f));
        largest_change = std::max(largest_change, std::abs(biased.weight[a] - unbiased.weight[a]));
    }
    BOOST_TEST(largest_change > 0.05f);  // b ≠ 0: the two semantics differ

    // b = 0: both give the same weights, bit for bit (also with the kimi_linear ε = 1e-20).
    const std::vector<float> zero(4, 0.0f);
    for (const char* type : {"deepseek_v32", "kimi_linear"}) {
        cfg.model_type = type;
        cfg.moe.weights_from_biased_scores = true;
        const Routing a = route_hand(cfg, zero);
        cfg.moe.weights_from_biased_scores = false;
        const Routing b = route_hand(cfg, zero);
        BOOST_TEST(a.idx == b.idx, boost::test_tools::per_element());
        BOOST_TEST(a.weight == b.weight, boost::test_tools::per_element());
    }
}

BOOST_AUTO_TEST_CASE(softmax_scoring_selects_on_biased_probs) {
    ModelConfig cfg = hand_config();
    cfg.moe.scoring = Scoring::softmax;
    const Routing r = route_hand(cfg, hand_bias);
    // p = softmax(l) per token, s' = p + b, the same group rule.
    std::vector<float> p(hand_logits.size());
    for (int64_t t = 0; t < 3; ++t) {
        double z = 0.0;
        for (int64_t e = 0; e < 4; ++e)
            z += std::exp(static_cast<double>(hand_logits[t * 4 + e]));
        for (int64_t e = 0; e < 4; ++e)
            p[t * 4 + e] = static_cast<float>(std::exp(double{hand_logits[t * 4 + e]}) / z);
    }
    // t0 p = [.229, .139, .621, .011] → s' groups .767 vs .633: keep 0, [1, 0] (.439 > .329);
    // t1 p = [.049, .133, .220, .598] → groups .582 vs .818: keep 1, [3, 2];
    // t2 p = [.278, .206, .265, .252] → s' = [.378, .506, .265, .252]: keep 0, [1, 0].
    const std::vector<int64_t> want_idx = {1, 0, 3, 2, 1, 0};
    BOOST_TEST(r.idx == want_idx, boost::test_tools::per_element());
    const std::vector<float> want = renormalised(p, want_idx, 4, 2, 2.5f);
    for (size_t a = 0; a < want.size(); ++a)
        BOOST_TEST(r.weight[a] == want[a], boost::test_tools::tolerance(1e-6f));
    // Without renormalisation the weights are ρ·p.
    cfg.moe.renormalize = false;
    const Routing raw = route_hand(cfg, hand_bias);
    for (size_t a = 0; a < want.size(); ++a)
        BOOST_TEST(raw.weight[a] == 2.5f * p[(a / 2) * 4 + want_idx[a]],
                   boost::test_tools::tolerance(1e-6f));
}

BOOST_AUTO_TEST_CASE(kimi_fills_masked_groups_with_zero) {
    // s = σ(0) = 0.5, b = [−0.7, −0.2, −0.5, −0.5]: s' = [−0.2, 0.3, 0, 0]; group scores 0.1 vs 0
    // keep group 0. DeepSeek (−inf fill) takes both of group 0: [1, 0]. Kimi's 0.0 fill ranks the
    // masked experts (0.0) above expert 0 (−0.2): [1, 2].
    ModelConfig cfg = hand_config();
    MoeWeights w = hand_router({-0.7f, -0.2f, -0.5f, -0.5f});
    Buffer x(DType::f32, {1, 4});  // [1, 4] logits 0
    BOOST_TEST(route(cfg, w, x.view()).idx == std::vector<int64_t>({1, 0}),
               boost::test_tools::per_element());
    cfg.model_type = "kimi_linear";
    BOOST_TEST(route(cfg, w, x.view()).idx == std::vector<int64_t>({1, 2}),
               boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(top_k_all_experts_equals_weighted_dense_sum) {
    for (ExpertAct act : {ExpertAct::swiglu, ExpertAct::relu2}) {
        ModelConfig cfg = tiny_moe();
        MoeConfig& m = cfg.moe;
        m.top_k = m.n_routed_experts;
        m.n_group = 1;
        m.topk_group = 1;
        m.correction_bias = false;
        m.renormalize = false;
        m.routed_scaling_factor = 1.0;
        m.expert_act = act;
        const MoeWeights w = random_moe(cfg, moe_layer, 7);
        const int64_t n_tok = 16, d = cfg.hidden_size, n_exp = m.n_routed_experts;
        Buffer x = random_x(n_tok, d, 8);
        Buffer y(DType::f32, {n_tok, d});  // [n_tok, d]
        moe_forward(cfg, moe_layer, w, x.view(), y.view());

        // Σ_e s_e · Expert_e(x) + Shared(x), each expert on every token.
        std::vector<float> want(static_cast<size_t>(n_tok * d), 0.0f);
        Buffer out(DType::f32, {n_tok, d});  // [n_tok, d]
        for (int64_t e = 0; e < n_exp; ++e) {
            dense_ffn_forward(backend::cpu_ctx(), w.experts[e], act, x.view(), out.view());
            for (int64_t t = 0; t < n_tok; ++t) {
                const float s = sigmoid_ref(matvec(w.gate, x.ptr<float>() + t * d)[e]);
                for (int64_t j = 0; j < d; ++j)
                    want[t * d + j] += s * out.ptr<float>()[t * d + j];
            }
        }
        dense_ffn_forward(backend::cpu_ctx(), w.shared, act, x.view(), out.view());
        for (int64_t i = 0; i < n_tok * d; ++i)
            want[i] += out.ptr<float>()[i];
        const float err = max_abs_diff(y.ptr<float>(), want.data(), n_tok * d);
        BOOST_TEST_MESSAGE("top_k = E vs dense sum (" << to_string(act) << "): max err " << err);
        BOOST_TEST(err <= 1e-5f);
    }
}

BOOST_AUTO_TEST_CASE(capacity_drops_what_the_policy_names) {
    // d = 4, identity gate, E = 4, top-2, no bias, no groups, weights = s (no renormalisation,
    // ρ = 1). Expert 0 is picked by t0 (σ(.5) = .622), t1 (σ(2) = .881) and t2 (σ(1) = .731);
    // C = ceil(4·2/4 · CF) = 2 for CF = 1 and 0.6. probs keeps t1, t2 (drops t0 slot 0);
    // position keeps t0, t1 (drops t2 slot 0). Every other expert has ≤ 2 assignments.
    ModelConfig cfg = hand_config();
    MoeConfig& m = cfg.moe;
    m.n_group = 1;
    m.correction_bias = false;
    m.renormalize = false;
    m.routed_scaling_factor = 1.0;
    m.n_shared_experts = 1;
    m.shared_intermediate = 3;
    MoeWeights w = random_moe(cfg, moe_layer, 11);
    w.gate = filled({4, 4}, {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1});
    const std::vector<float> logits = flat({{0.5f, 0.2f, -1.0f, -1.0f},
                                            {2.0f, -1.0f, 0.1f, -1.0f},
                                            {1.0f, -1.0f, -1.0f, 0.3f},
                                            {-1.0f, 0.4f, 0.9f, -1.0f}});
    Buffer x = filled({4, 4}, logits);
    const std::vector<int64_t> want_idx = {0, 1, 0, 2, 0, 3, 2, 1};

    struct Case {
        DropPolicy policy;
        double cf;
        size_t dropped_slot;  // t·k + i
    };
    for (const Case& c : {Case{DropPolicy::probs, 1.0, 0},
                          Case{DropPolicy::probs, 0.6, 0},
                          Case{DropPolicy::position, 1.0, 4},
                          Case{DropPolicy::position, 0.6, 4}}) {
        m.capacity_factor = c.cf;
        m.drop_policy = c.policy;
        Buffer y(DType::f32, {4, 4});  // [n_tok, d]
        Routing r;
        moe_forward(cfg, moe_layer, w, x.view(), y.view(), &r);
        BOOST_TEST(r.idx == want_idx, boost::test_tools::per_element());
        BOOST_TEST(r.dropped == 1);
        BOOST_TEST(r.tokens_per_expert == std::vector<int64_t>({2, 2, 2, 1}),
                   boost::test_tools::per_element());
        for (int64_t n : r.tokens_per_expert)
            BOOST_TEST(n <= 2);
        for (size_t a = 0; a < want_idx.size(); ++a) {
            const bool dropped = a == c.dropped_slot;
            BOOST_TEST(r.kept[a] == (dropped ? 0 : 1));
            const float s = sigmoid_ref(logits[(a / 2) * 4 + want_idx[a]]);
            BOOST_TEST(r.weight[a] == (dropped ? 0.0f : s), boost::test_tools::tolerance(1e-6f));
        }
        // y_t = Σ over kept slots of w · Expert(x_t) + Shared(x_t): a dropped token keeps the rest.
        for (int64_t t = 0; t < 4; ++t) {
            std::vector<float> want = mlp_ref(w.shared, m.expert_act, x.ptr<float>() + t * 4);
            for (int64_t i = 0; i < 2; ++i) {
                const size_t a = static_cast<size_t>(t * 2 + i);
                if (!r.kept[a])
                    continue;
                const std::vector<float> o =
                    mlp_ref(w.experts[want_idx[a]], m.expert_act, x.ptr<float>() + t * 4);
                for (int64_t j = 0; j < 4; ++j)
                    want[j] += r.weight[a] * o[j];
            }
            BOOST_TEST(max_abs_diff(y.ptr<float>() + t * 4, want.data(), 4) <= 1e-6f);
        }
    }
}

BOOST_AUTO_TEST_CASE(latent_moe_equals_plain_loops) {
    for (ExpertAct act : {ExpertAct::relu2, ExpertAct::swiglu}) {
        ModelConfig cfg = tiny_moe();
        cfg.model_type = "hymoe";
        cfg.moe.expert_act = act;
        const MoeWeights w = random_moe(cfg, latent_layer, 21);
        const int64_t n_tok = 12, d = cfg.hidden_size, ell = cfg.moe.latent_size, k = 2;
        Buffer x = random_x(n_tok, d, 22);
        Buffer y(DType::f32, {n_tok, d});  // [n_tok, d]
        Routing r;
        moe_forward(cfg, latent_layer, w, x.view(), y.view(), &r);

        // fc2(Σ_i w_i Expert_i(fc1 x)) + Shared(x), token by token.
        std::vector<float> want(static_cast<size_t>(n_tok * d));
        for (int64_t t = 0; t < n_tok; ++t) {
            const float* xt = x.ptr<float>() + t * d;
            const std::vector<float> z = matvec(w.fc1_latent_proj, xt);  // [ℓ]
            std::vector<float> y_lat(static_cast<size_t>(ell), 0.0f);    // [ℓ]
            for (int64_t i = 0; i < k; ++i) {
                const std::vector<float> o = mlp_ref(w.experts[r.idx[t * k + i]], act, z.data());
                for (int64_t j = 0; j < ell; ++j)
                    y_lat[j] += r.weight[t * k + i] * o[j];
            }
            const std::vector<float> yt = matvec(w.fc2_latent_proj, y_lat.data());
            const std::vector<float> sh = mlp_ref(w.shared, act, xt);
            for (int64_t j = 0; j < d; ++j)
                want[t * d + j] = yt[j] + sh[j];
        }
        const float err = max_abs_diff(y.ptr<float>(), want.data(), n_tok * d);
        BOOST_TEST_MESSAGE("LatentMoE vs loops (" << to_string(act) << "): max err " << err);
        BOOST_TEST(err <= 1e-5f);
    }
}

BOOST_AUTO_TEST_CASE(token_permutation_permutes_routing_exactly_and_outputs) {
    for (const LayerSpec& spec : {moe_layer, latent_layer}) {
        const ModelConfig cfg = tiny_moe();
        const MoeWeights w = random_moe(cfg, spec, 31);
        const int64_t n_tok = 24, d = cfg.hidden_size, k = cfg.moe.top_k;
        Buffer x = random_x(n_tok, d, 32);
        std::vector<int64_t> perm(static_cast<size_t>(n_tok));  // [n_tok] new row → old row
        std::iota(perm.begin(), perm.end(), 0);
        Philox rng(33, 0, 0);
        for (int64_t i = n_tok - 1; i > 0; --i)  // Fisher-Yates
            std::swap(perm[i], perm[rng.next_u32() % static_cast<uint32_t>(i + 1)]);
        Buffer xp(DType::f32, {n_tok, d});  // [n_tok, d] x[perm]
        for (int64_t t = 0; t < n_tok; ++t)
            std::copy_n(x.ptr<float>() + perm[t] * d, d, xp.ptr<float>() + t * d);

        Buffer y(DType::f32, {n_tok, d});   // [n_tok, d]
        Buffer yp(DType::f32, {n_tok, d});  // [n_tok, d]
        Routing r, rp;
        moe_forward(cfg, spec, w, x.view(), y.view(), &r);
        moe_forward(cfg, spec, w, xp.view(), yp.view(), &rp);
        float max_diff = 0;
        for (int64_t t = 0; t < n_tok; ++t) {
            for (int64_t c = 0; c < d; ++c)
                max_diff = std::max(
                    max_diff,
                    std::abs(yp.ptr<float>()[t * d + c] - y.ptr<float>()[perm[t] * d + c]));
            for (int64_t i = 0; i < k; ++i) {
                BOOST_TEST(rp.idx[t * k + i] == r.idx[perm[t] * k + i]);
                BOOST_TEST(rp.weight[t * k + i] == r.weight[perm[t] * k + i]);
            }
        }
        BOOST_TEST(max_diff <= 1e-5f, to_string(spec.ffn));
        // Batch composition does not matter either: a token alone gives the same routing and,
        // to rounding, the same output.
        Buffer y1(DType::f32, {1, d});  // [1, d]
        Routing r1;
        moe_forward(cfg, spec, w, x.view().rows(5, 1), y1.view(), &r1);
        for (int64_t i = 0; i < k; ++i)
            BOOST_TEST(r1.idx[i] == r.idx[5 * k + i]);
        for (int64_t c = 0; c < d; ++c)
            BOOST_TEST(std::abs(y1.ptr<float>()[c] - y.ptr<float>()[5 * d + c]) <= 1e-5f);
    }
}

BOOST_AUTO_TEST_CASE(golden_torch_deepseek_grouped_and_latent_relu2) {
    io::H5Reader h5("tests/golden/moe.h5");
    const float atol = h5.floats("atol").at(0);
    BOOST_TEST(atol <= 1e-5f);
    struct Case {
        const char* group;
        const char* prefix;
        const char* model_type;
        LayerSpec spec;
        ExpertAct act;
    };
    for (const Case& c :
         {Case{"deepseek", "model.layers.1.mlp.", "deepseek_v32", moe_layer, ExpertAct::swiglu},
          Case{"latent", "model.layers.3.mlp.", "hymoe", latent_layer, ExpertAct::relu2}}) {
        ModelConfig cfg = tiny_moe();
        cfg.model_type = c.model_type;
        cfg.moe.expert_act = c.act;
        const std::string group = std::string(c.group) + "/";
        MoeWeights w;
        load_named(ffn_tensors(cfg, c.spec, nullptr, &w),
                   group + c.prefix,
                   [&](const std::string& name, Tensor& dest) {
                       BOOST_REQUIRE_MESSAGE(h5.exists(name), name << " is not in moe.h5");
                       BOOST_REQUIRE(h5.shape(name) == dest.shape);
                       const std::vector<float> v = h5.floats(name);
                       std::copy(v.begin(), v.end(), dest.ptr<float>());
                   });
        const std::vector<float> x_v = h5.floats(group + "x");
        const std::vector<float> y_want = h5.floats(group + "y");
        const int64_t n_tok = h5.shape(group + "x").at(0), d = cfg.hidden_size;
        Buffer x = filled({n_tok, d}, x_v);
        Buffer y(DType::f32, {n_tok, d});  // [n_tok, d]
        Routing r;
        moe_forward(cfg, c.spec, w, x.view(), y.view(), &r);

        BOOST_TEST(r.idx == h5.ints(group + "idx"), boost::test_tools::per_element());
        const std::vector<float> wt_want = h5.floats(group + "weight");
        const float w_err = max_abs_diff(r.weight.data(), wt_want.data(), n_tok * 2);
        const float y_err = max_abs_diff(y.ptr<float>(), y_want.data(), n_tok * d);
        BOOST_TEST_MESSAGE("golden " << c.group << ": max |Δweight| " << w_err << ", max |Δy| "
                                     << y_err);
        BOOST_TEST(w_err <= atol);
        BOOST_TEST(y_err <= atol);
    }
}

BOOST_AUTO_TEST_CASE(tensor_names_follow_the_family) {
    ModelConfig cfg = tiny_moe();
    auto names = [&](const LayerSpec& spec) {
        DenseFfnWeights dense;
        MoeWeights moe;
        std::vector<std::string> n;
        for (const TensorSpec& s : ffn_tensors(cfg, spec, &dense, &moe))
            n.push_back(s.name + shape_string(s.shape));
        return n;
    };
    auto has = [](const std::vector<std::string>& v, const std::string& s) {
        return std::find(v.begin(), v.end(), s) != v.end();
    };
    cfg.model_type = "kimi_linear";
    std::vector<std::string> kimi = names(moe_layer);
    BOOST_TEST(has(kimi, "gate.weight[8, 64]"));
    BOOST_TEST(has(kimi, "gate.e_score_correction_bias[8]"));
    BOOST_TEST(has(kimi, "experts.7.w1.weight[32, 64]"));
    BOOST_TEST(has(kimi, "experts.7.w3.weight[32, 64]"));
    BOOST_TEST(has(kimi, "experts.7.w2.weight[64, 32]"));
    BOOST_TEST(has(kimi, "shared_experts.gate_proj.weight[32, 64]"));
    BOOST_TEST(kimi.size() == 2 + 8 * 3 + 3);
    cfg.model_type = "hymoe";
    cfg.moe.expert_act = ExpertAct::relu2;
    std::vector<std::string> latent = names(latent_layer);
    BOOST_TEST(has(latent, "fc1_latent_proj.weight[32, 64]"));
    BOOST_TEST(has(latent, "fc2_latent_proj.weight[64, 32]"));
    BOOST_TEST(has(latent, "experts.0.up_proj.weight[32, 32]"));
    BOOST_TEST(has(latent, "experts.0.down_proj.weight[32, 32]"));
    BOOST_TEST(has(latent, "shared_experts.down_proj.weight[64, 32]"));
    BOOST_TEST(latent.size() == 2 + 2 + 8 * 2 + 2);  // no gate_proj for relu2
    cfg.intermediate_size = 128;
    std::vector<std::string> dense = names(LayerSpec{Mixer::kda, false, Ffn::dense});
    BOOST_TEST(dense == std::vector<std::string>({"gate_proj.weight[128, 64]",
                                                  "up_proj.weight[128, 64]",
                                                  "down_proj.weight[64, 128]"}),
               boost::test_tools::per_element());
}

BOOST_AUTO_TEST_SUITE_END()
