// Unit tests of the KDA backward (hymoe/backend/ops.h: kda_scan_backward, chunked, and
// kda_scan_backward_tokens; hymoe/model/kda.h: kda_backward; spec/model-math.md §3, §9): the
// scan's gradients against fourth-order central differences of the recurrence, from a zero and a
// resumed state; both scan backwards from checkpoints against a plain per-token reverse sweep that
// stores every state (double), on several shapes, also under decay strong enough to underflow
// e^g; the whole block's dx and the LoRA dA, dB of the q, k, v, o adapters against finite
// differences of Σ dy ⊙ y on two packed sequences, with both decay gates; the block under extreme
// decay stays finite; its adapters as factor views with gradient views against the host slots;
// and the block against the torch autograd golden of
// tests/golden/gen_kda_backward.py. Errors are max|a − b| / max|b| over a whole gradient. Run from
// the repository root (the golden file is read by relative path).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/backend/ops.h"
#include "hymoe/core/rng.h"
#include "hymoe/io/h5.h"
#include "hymoe/model/kda.h"
#include "hymoe/model/kda_backward_views.h"
#include "hymoe/model/lora.h"
#include "hymoe/model/weights.h"

namespace {

using namespace hymoe;
using namespace hymoe::model;

// max|a − b| / max|b| over the whole array.
double rel_err(const float* a, const float* b, int64_t n) {
    double diff = 0.0, scale = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        diff = std::max(diff, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
        scale = std::max(scale, std::abs(static_cast<double>(b[i])));
    }
    return diff / std::max(scale, 1e-30);
}
double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
    BOOST_REQUIRE_EQUAL(a.size(), b.size());
    return rel_err(a.data(), b.data(), static_cast<int64_t>(a.size()));
}
bool all_finite(const std::vector<float>& x) {
    return std::all_of(x.begin(), x.end(), [](float v) { return std::isfinite(v); });
}
std::vector<float> random_normal(size_t n, float std, Philox& rng) {
    std::vector<float> x(n);
    rng.fill_normal(x.data(), n, 0.0f, std);
    return x;
}

// ∂f/∂x_i for each of the n entries of x, by the fourth-order central difference
// (8(f(x+h) − f(x−h)) − (f(x+2h) − f(x−2h))) / 12h; x is restored.
std::vector<float> fd_grad(float* x, int64_t n, float h, const std::function<double()>& f) {
    std::vector<float> grad(n);
    for (int64_t i = 0; i < n; ++i) {
        const float x0 = x[i];
        double fx[4];
        const float steps[4] = {h, -h, 2 * h, -2 * h};
        for (int j = 0; j < 4; ++j) {
            x[i] = x0 + steps[j];
            fx[j] = f();
        }
        x[i] = x0;
        grad[i] = static_cast<float>((8.0 * (fx[0] - fx[1]) - (fx[2] - fx[3])) /
                                     (12.0 * static_cast<double>(h)));
    }
    return grad;
}

// ---- the scan --------------------------------------------------------------------------------

struct ScanGrads {
    std::vector<float> dq, dk, dv, dg, dbeta;
};

// One sequence's scan inputs: q, k unit per head (q × K^{-1/2}) as the block makes them, β in
// (0, 1), g = −g_max·u² (mostly mild steps, some down to −g_max); the state before the first
// token zero, or random (a resumed sequence) after resume().
struct ScanCase {
    int64_t T;
    int H, K, V;
    std::vector<float> q, k, v, g, beta;  // [T, H, K], [T, H, K], [T, H, V], [T, H, K], [T, H]
    std::vector<float> S0;                // [H, K, V] the state the scan starts from

    ScanCase(int64_t n_tok, int n_head, int d_k, int d_v, float g_max, Philox& rng)
        : T(n_tok), H(n_head), K(d_k), V(d_v) {
        q = random_normal(T * H * K, 1.0f, rng);
        k = random_normal(T * H * K, 1.0f, rng);
        v = random_normal(T * H * V, 1.0f, rng);
        g.resize(T * H * K);
        rng.fill_uniform(g.data(), g.size(), 0.0f, 1.0f);
        for (float& x : g)
            x = -g_max * x * x;
        beta.resize(T * H);
        rng.fill_uniform(beta.data(), beta.size(), 0.05f, 0.95f);
        unit_rows(q, 1.0f / std::sqrt(static_cast<float>(K)));
        unit_rows(k, 1.0f);
        S0.assign(static_cast<size_t>(H) * K * V, 0.0f);
    }
    void resume(Philox& rng) { S0 = random_normal(S0.size(), 1.0f, rng); }
    void unit_rows(std::vector<float>& x, float scale) const {
        for (size_t r = 0; r < x.size(); r += K) {
            float ss = 0.0f;
            for (int i = 0; i < K; ++i)
                ss += x[r + i] * x[r + i];
            for (int i = 0; i < K; ++i)
                x[r + i] *= scale / std::sqrt(ss);
        }
    }
    KdaScanParams params(float* S, float* o) const {
        return KdaScanParams{T, H, K, V, q.data(), k.data(), v.data(), g.data(), beta.data(), S, o};
    }
    // Σ dO ⊙ o of the token-by-token recurrence (the function the backward differentiates).
    double loss(const std::vector<float>& dO) const {
        std::vector<float> S = S0, o(T * H * V);
        ops::kda_recurrent(params(S.data(), o.data()));
        double l = 0.0;
        for (size_t i = 0; i < o.size(); ++i)
            l += static_cast<double>(dO[i]) * static_cast<double>(o[i]);
        return l;
    }
    // The library's backward (chunked, or the per-token sweep when `tokens`): checkpoints every
    // `chunk` tokens, then the reverse sweep.
    ScanGrads backward(const std::vector<float>& dO, int chunk, bool tokens = false) const {
        std::vector<float> S = S0, o(T * H * V);
        std::vector<float> ckpt(((T + chunk - 1) / chunk) * S.size());
        const KdaScanParams p = params(S.data(), o.data());
        ops::kda_chunked_checkpoints(p, ckpt.data(), chunk);
        ScanGrads d{std::vector<float>(q.size(), NAN),
                    std::vector<float>(k.size(), NAN),
                    std::vector<float>(v.size(), NAN),
                    std::vector<float>(g.size(), NAN),
                    std::vector<float>(beta.size(), NAN)};
        const KdaScanGrads grads{
            dO.data(), d.dq.data(), d.dk.data(), d.dv.data(), d.dg.data(), d.dbeta.data()};
        if (tokens)
            ops::kda_scan_backward_tokens(p, ckpt.data(), grads, chunk);
        else
            ops::kda_scan_backward(p, ckpt.data(), grads, chunk);
        return d;
    }
};

// The plain reverse sweep in double: every state S_0..S_T of a head kept from one forward pass
// (S_0 = c.S0),
// then for t = T..1, with dS = ∂L/∂S_t:
//   dS += q dOᵀ, dq = S_t dO, S' = e^g S_{t−1}, p = S'ᵀk, u = β(v − p), du = dSᵀk, dk = dS u,
//   dβ = du·(v − p), dv = β du, dp = −β du, dS' = dS + k dpᵀ, dk += S' dp, dg = Σ_v dS' ⊙ S',
//   dS ← e^g dS'.
ScanGrads reference_backward(const ScanCase& c, const std::vector<float>& dO_f) {
    const int64_t T = c.T, H = c.H, K = c.K, V = c.V;
    auto wide = [](const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); };
    const std::vector<double> q = wide(c.q), k = wide(c.k), v = wide(c.v), g = wide(c.g);
    const std::vector<double> beta = wide(c.beta), dO = wide(dO_f);
    std::vector<double> dq(q.size()), dk(k.size()), dv(v.size()), dg(g.size()), dbeta(beta.size());
    for (int64_t h = 0; h < H; ++h) {
        auto at = [&](int64_t t, int64_t i, int64_t D) { return (t * H + h) * D + i; };
        std::vector<double> S((T + 1) * K * V, 0.0);  // S[t] after t tokens
        std::copy(&c.S0[h * K * V], &c.S0[(h + 1) * K * V], S.begin());
        std::vector<double> sp(K * V), p(V), u(V);
        auto step = [&](int64_t t) {  // S' into sp, p, u for token t (from S[t])
            std::fill(p.begin(), p.end(), 0.0);
            for (int64_t x = 0; x < K; ++x)
                for (int64_t y = 0; y < V; ++y) {
                    sp[x * V + y] = std::exp(g[at(t, x, K)]) * S[(t * K + x) * V + y];
                    p[y] += k[at(t, x, K)] * sp[x * V + y];
                }
            for (int64_t y = 0; y < V; ++y)
                u[y] = beta[t * H + h] * (v[at(t, y, V)] - p[y]);
        };
        for (int64_t t = 0; t < T; ++t) {
            step(t);
            for (int64_t x = 0; x < K; ++x)
                for (int64_t y = 0; y < V; ++y)
                    S[((t + 1) * K + x) * V + y] = sp[x * V + y] + k[at(t, x, K)] * u[y];
        }
        std::vector<double> dS(K * V, 0.0), du(V);
        for (int64_t t = T - 1; t >= 0; --t) {
            step(t);
            const double b = beta[t * H + h];
            for (int64_t x = 0; x < K; ++x)
                for (int64_t y = 0; y < V; ++y) {
                    dS[x * V + y] += q[at(t, x, K)] * dO[at(t, y, V)];
                    dq[at(t, x, K)] += S[((t + 1) * K + x) * V + y] * dO[at(t, y, V)];
                }
            for (int64_t y = 0; y < V; ++y) {
                du[y] = 0.0;
                for (int64_t x = 0; x < K; ++x)
                    du[y] += dS[x * V + y] * k[at(t, x, K)];
                dbeta[t * H + h] += du[y] * (v[at(t, y, V)] - p[y]);
                dv[at(t, y, V)] = b * du[y];
            }
            for (int64_t x = 0; x < K; ++x) {
                const double kx = k[at(t, x, K)], e = std::exp(g[at(t, x, K)]);
                for (int64_t y = 0; y < V; ++y) {
                    const double dp = -b * du[y];
                    dk[at(t, x, K)] += dS[x * V + y] * u[y] + sp[x * V + y] * dp;
                    const double dsp = dS[x * V + y] + kx * dp;
                    dg[at(t, x, K)] += dsp * sp[x * V + y];
                    dS[x * V + y] = e * dsp;
                }
            }
        }
    }
    auto narrow = [](const std::vector<double>& x) {
        return std::vector<float>(x.begin(), x.end());
    };
    return ScanGrads{narrow(dq), narrow(dk), narrow(dv), narrow(dg), narrow(dbeta)};
}

// ---- the block -------------------------------------------------------------------------------

const char* const kSlotNames[4] = {"q", "k", "v", "o"};

// A KDA layer with one adapter of rank 2 on each of q_proj, k_proj, v_proj, o_proj (B random,
// not the zero init, so that every adapter path carries gradient). Random weights as in
// test_kda.cpp (fan-in^{-1/2} for the projections, 0.5 for the convs and the low-rank
// up-projections), o_norm 1 + 0.2·N. Holds pointers into itself: not copyable.
struct Block {
    ModelConfig cfg;
    KdaWeights w;
    std::array<LoraSlot, 4> slots;  // q, k, v, o

    Block(int d, int n_head, int head_dim, std::optional<double> lower_bound) {
        cfg.hidden_size = d;
        cfg.rms_norm_eps = 1e-5;
        cfg.kda.n_head = n_head;
        cfg.kda.head_dim = head_dim;
        cfg.kda.conv_kernel = 4;
        cfg.kda.gate_lower_bound = lower_bound;
        w.lora = LoraSlots{&slots[0], &slots[1], &slots[2], nullptr, &slots[3]};
    }
    Block(const Block&) = delete;
    Block& operator=(const Block&) = delete;

    void init_random(uint64_t seed) {
        TensorList list = kda_tensors(cfg, w);
        for (TensorSpec& s : list) {
            const bool up = s.name == "f_b_proj.weight" || s.name == "g_b_proj.weight";
            s.std = s.shape.size() == 2 && !up ? 1.0f / std::sqrt(static_cast<float>(s.shape[1]))
                                               : 0.5f;
        }
        Philox rng(seed, 0, 0);
        model::init_random(list, rng);
        rng.fill_normal(w.o_norm.ptr<float>(), cfg.kda.head_dim, 1.0f, 0.2f);
        const int64_t d = cfg.hidden_size, D = cfg.kda.n_head * cfg.kda.head_dim;
        for (int i = 0; i < 4; ++i) {
            const bool o = i == 3;
            LoraPair pair = make_lora_pair(o ? d : D, o ? D : d, 2, 0.5f, seed, 10 + i, true);
            rng.fill_normal(pair.B.ptr<float>(), pair.B.view().numel(), 0.0f, 0.3f);
            slots[i].adapters.clear();
            slots[i].adapters.push_back(std::move(pair));
        }
    }
    LoraPair& pair(int i) { return slots[i].adapters[0]; }

    // Σ dy ⊙ y of kda_forward from fresh states.
    double loss(std::vector<float>& x, const std::vector<float>& dy, const SeqBatch& batch) const {
        const int64_t n = batch.n_tok(), d = cfg.hidden_size;
        std::vector<KdaState> states;
        std::vector<KdaState*> ptrs;
        for (int64_t s = 0; s < batch.n_seq(); ++s)
            states.push_back(make_kda_state(cfg));
        for (KdaState& st : states)
            ptrs.push_back(&st);
        std::vector<float> y(n * d);
        Tensor xt{x.data(), DType::f32, Device::cpu, {n, d}};
        Tensor yt{y.data(), DType::f32, Device::cpu, {n, d}};
        kda_forward(backend::cpu_ctx(), cfg, w, xt, batch, ptrs, yt);
        double l = 0.0;
        for (int64_t i = 0; i < n * d; ++i)
            l += static_cast<double>(dy[i]) * static_cast<double>(y[i]);
        return l;
    }
    // dx of kda_backward, the adapters' gradients zeroed first.
    std::vector<float> backward(std::vector<float>& x,
                                std::vector<float>& dy,
                                const SeqBatch& batch,
                                int chunk) {
        for (int i = 0; i < 4; ++i) {
            std::fill(
                pair(i).dA.ptr<float>(), pair(i).dA.ptr<float>() + pair(i).dA.view().numel(), 0.0f);
            std::fill(
                pair(i).dB.ptr<float>(), pair(i).dB.ptr<float>() + pair(i).dB.view().numel(), 0.0f);
        }
        const int64_t n = batch.n_tok(), d = cfg.hidden_size;
        std::vector<float> dx(n * d, NAN);
        Tensor xt{x.data(), DType::f32, Device::cpu, {n, d}};
        Tensor dyt{dy.data(), DType::f32, Device::cpu, {n, d}};
        Tensor dxt{dx.data(), DType::f32, Device::cpu, {n, d}};
        kda_backward(backend::cpu_ctx(), cfg, w, xt, batch, dyt, dxt, chunk);
        return dx;
    }
};

std::vector<float> copy_of(const Buffer& b) {
    return std::vector<float>(b.ptr<float>(), b.ptr<float>() + b.view().numel());
}

}  // namespace

BOOST_AUTO_TEST_SUITE(kda_backward_tests)

// dq, dk, dv, dg, dβ of the scan (T = 13 over chunks of 4, the last one short; H = 2,
// K = V = 4) against finite differences of Σ dO ⊙ o.
BOOST_AUTO_TEST_CASE(scan_vs_finite_differences) {
    Philox rng(5, 0, 0);
    ScanCase c(13, 2, 4, 4, 1.5f, rng);
    const std::vector<float> dO = random_normal(c.T * c.H * c.V, 1.0f, rng);
    const ScanGrads d = c.backward(dO, 4);
    const float h = 1e-2f;
    auto f = [&] { return c.loss(dO); };
    const double e_q = rel_err(d.dq, fd_grad(c.q.data(), c.q.size(), h, f));
    const double e_k = rel_err(d.dk, fd_grad(c.k.data(), c.k.size(), h, f));
    const double e_v = rel_err(d.dv, fd_grad(c.v.data(), c.v.size(), h, f));
    const double e_g = rel_err(d.dg, fd_grad(c.g.data(), c.g.size(), h, f));
    const double e_b = rel_err(d.dbeta, fd_grad(c.beta.data(), c.beta.size(), h, f));
    BOOST_TEST(e_q <= 1e-3);
    BOOST_TEST(e_k <= 1e-3);
    BOOST_TEST(e_v <= 1e-3);
    BOOST_TEST(e_g <= 1e-3);
    BOOST_TEST(e_b <= 1e-3);
    BOOST_TEST_MESSAGE("kda scan backward vs finite differences: dq "
                       << e_q << " dk " << e_k << " dv " << e_v << " dg " << e_g << " dbeta "
                       << e_b);
}

// The largest error of any of the five gradients.
double max_rel_err(const ScanGrads& a, const ScanGrads& b) {
    return std::max({rel_err(a.dq, b.dq),
                     rel_err(a.dk, b.dk),
                     rel_err(a.dv, b.dv),
                     rel_err(a.dg, b.dg),
                     rel_err(a.dbeta, b.dbeta)});
}

// The chunked backward (GEMMs per chunk) and the per-token sweep from checkpoints == the per-token
// sweep keeping every state (double), for chunks shorter than, equal to and longer than the
// sequence (T = 37 and 150 are no multiple of the chunk), K ≠ V, K = 20 not a multiple of the
// 16-wide vectors, from a zero and from a resumed state; with g down to −20, −80 (e^g near the
// smallest normal float) and −300 (e^g underflows to 0 in fp32): all finite. The per-token sweep
// stays within 1e-5. The chunked form evaluates e^{Γ_c − Γ_j} from cumulative log-decays Γ, whose
// fp32 rounding grows with |Γ| (the forward's chunked form drifts from the recurrence as much:
// 1e-5 at g down to −80); its bound is 1e-5 up to g = −1, then 1e-4 (−20), 5e-4 (−80, −300).
BOOST_AUTO_TEST_CASE(chunked_equals_per_token_sweep) {
    Philox rng(6, 0, 0);
    const std::array<std::array<int, 3>, 2> shapes{{{2, 8, 4}, {1, 20, 12}}};  // H, K, V
    for (float g_max : {1.0f, 20.0f, 80.0f, 300.0f}) {
        const double tol = g_max <= 1.0f ? 1e-5 : g_max <= 20.0f ? 1e-4 : 5e-4;
        double worst = 0.0, worst_tokens = 0.0;
        for (const auto& [H, K, V] : shapes)
            for (int64_t T : {1, 37, 150})
                for (bool resumed : {false, true}) {
                    ScanCase c(T, H, K, V, g_max, rng);
                    if (resumed)
                        c.resume(rng);
                    const std::vector<float> dO = random_normal(c.T * c.H * c.V, 1.0f, rng);
                    const ScanGrads ref = reference_backward(c, dO);
                    for (int chunk : {1, 4, 16, 64}) {
                        const ScanGrads d = c.backward(dO, chunk);
                        const ScanGrads d_tok = c.backward(dO, chunk, true);
                        const double e = max_rel_err(d, ref), e_tok = max_rel_err(d_tok, ref);
                        BOOST_TEST_CONTEXT("g_max " << g_max << " H " << H << " K " << K << " V "
                                                    << V << " T " << T << " resumed " << resumed
                                                    << " chunk " << chunk) {
                            for (const auto* a : {&d.dq, &d.dk, &d.dv, &d.dg, &d.dbeta})
                                BOOST_TEST(all_finite(*a));
                            BOOST_TEST(e <= tol);
                            BOOST_TEST(e_tok <= 1e-5);
                        }
                        worst = std::max(worst, e);
                        worst_tokens = std::max(worst_tokens, e_tok);
                    }
                }
        BOOST_TEST_MESSAGE("kda scan backward vs the double per-token sweep, g down to "
                           << -g_max << ": chunked " << worst << ", per-token " << worst_tokens);
    }
}

// The gradients of a resumed sequence (random state before the first token) against finite
// differences of Σ dO ⊙ o (T = 13 over chunks of 4, H = 2, K = V = 4).
BOOST_AUTO_TEST_CASE(scan_resumed_vs_finite_differences) {
    Philox rng(7, 0, 0);
    ScanCase c(13, 2, 4, 4, 1.5f, rng);
    c.resume(rng);
    const std::vector<float> dO = random_normal(c.T * c.H * c.V, 1.0f, rng);
    const ScanGrads d = c.backward(dO, 4);
    const float h = 1e-2f;
    auto f = [&] { return c.loss(dO); };
    ScanGrads fd{fd_grad(c.q.data(), c.q.size(), h, f),
                 fd_grad(c.k.data(), c.k.size(), h, f),
                 fd_grad(c.v.data(), c.v.size(), h, f),
                 fd_grad(c.g.data(), c.g.size(), h, f),
                 fd_grad(c.beta.data(), c.beta.size(), h, f)};
    const double e = max_rel_err(d, fd);
    BOOST_TEST(e <= 1e-3);
    BOOST_TEST_MESSAGE("kda scan backward from a resumed state vs finite differences: " << e);
}

// The block's dx and every adapter's dA, dB against finite differences of Σ dy ⊙ y (d = 16,
// H = 2, K = 4; sequences of 7 and 6 tokens packed; the backward in chunks of 4), both gates.
BOOST_AUTO_TEST_CASE(block_vs_finite_differences) {
    const SeqBatch batch{{0, 7, 13}, {0, 0}, {}};
    for (std::optional<double> lb : {std::optional<double>{}, std::optional<double>{-5.0}}) {
        Block b(16, 2, 4, lb);
        b.init_random(21);
        Philox rng(22, 0, 0);
        std::vector<float> x = random_normal(13 * 16, 1.0f, rng);
        std::vector<float> dy = random_normal(13 * 16, 1.0f, rng);
        const std::vector<float> dx = b.backward(x, dy, batch, 4);
        const float h = 1e-2f;
        auto f = [&] { return b.loss(x, dy, batch); };
        const double e_x = rel_err(dx, fd_grad(x.data(), x.size(), h, f));
        double e_lora = 0.0;
        BOOST_TEST_CONTEXT("lower bound " << (lb ? *lb : 0.0)) {
            BOOST_TEST(e_x <= 1e-3);
            for (int i = 0; i < 4; ++i) {
                LoraPair& p = b.pair(i);
                const double e_a =
                    rel_err(copy_of(p.dA), fd_grad(p.A.ptr<float>(), p.A.view().numel(), h, f));
                const double e_b =
                    rel_err(copy_of(p.dB), fd_grad(p.B.ptr<float>(), p.B.view().numel(), h, f));
                BOOST_TEST_CONTEXT("adapter " << kSlotNames[i]) {
                    BOOST_TEST(e_a <= 1e-3);
                    BOOST_TEST(e_b <= 1e-3);
                }
                e_lora = std::max({e_lora, e_a, e_b});
            }
        }
        BOOST_TEST_MESSAGE("kda block backward vs finite differences (lower bound "
                           << (lb ? *lb : 0.0) << "): dx " << e_x << ", LoRA dA/dB " << e_lora);
    }
}

// The block's adapters as factor views with gradient views (model/lora_views.h, adapter 0's rows
// the whole batch) through kda_backward on views give the host slots' dx, dA and dB.
BOOST_AUTO_TEST_CASE(block_factor_views_match_host_slots) {
    const SeqBatch batch{{0, 7, 13}, {0, 0}, {}};
    Block b(16, 2, 4, std::nullopt);
    b.init_random(31);
    Philox rng(32, 0, 0);
    std::vector<float> x = random_normal(13 * 16, 1.0f, rng);
    std::vector<float> dy = random_normal(13 * 16, 1.0f, rng);
    const std::vector<float> dx = b.backward(x, dy, batch, 4);

    KdaWeightViews v = kda_views(b.w);
    v.lora = nullptr;
    std::vector<Buffer> grads;  // [4 × (dA, dB)] zero
    for (int i = 0; i < 4; ++i) {
        grads.emplace_back(DType::f32, b.pair(i).A.view().shape);
        grads.emplace_back(DType::f32, b.pair(i).B.view().shape);
    }
    LoraSlotView* sites[4] = {&v.lora_views.q, &v.lora_views.k, &v.lora_views.v, &v.lora_views.o};
    for (int i = 0; i < 4; ++i)
        *sites[i] = {{b.pair(i).A.view(),
                      b.pair(i).B.view(),
                      b.pair(i).scale,
                      grads[2 * i].view(),
                      grads[2 * i + 1].view()}};
    std::vector<int64_t> all(13);
    for (int64_t r = 0; r < 13; ++r)
        all[static_cast<size_t>(r)] = r;
    const std::vector<LoraRowsView> rows = {{0, Tensor{all.data(), DType::i64, Device::cpu, {13}}}};
    ops::KdaSeqTable t;
    t.n_tok = 13;
    t.n_seq = 2;
    t.offsets = batch.offsets.data();
    std::vector<float> dx_views(13 * 16, NAN);
    Tensor xt{x.data(), DType::f32, Device::cpu, {13, 16}};
    Tensor dyt{dy.data(), DType::f32, Device::cpu, {13, 16}};
    Tensor dxt{dx_views.data(), DType::f32, Device::cpu, {13, 16}};
    kda_backward(backend::cpu_ctx(), b.cfg, v, xt, KdaBatchViews{&batch, t, &rows}, dyt, dxt, 4);
    BOOST_TEST(rel_err(dx_views, dx) <= 1e-6);
    for (int i = 0; i < 4; ++i) {
        BOOST_TEST(rel_err(copy_of(grads[2 * i]), copy_of(b.pair(i).dA)) <= 1e-6, kSlotNames[i]);
        BOOST_TEST(rel_err(copy_of(grads[2 * i + 1]), copy_of(b.pair(i).dB)) <= 1e-6,
                   kSlotNames[i]);
    }
}

// Decay far past fp32's range (A_log = 8, dt_bias = 6: g ≈ −1.8e4 per step, e^g = 0): the
// backward stays finite and still carries gradient.
BOOST_AUTO_TEST_CASE(block_extreme_decay_finite) {
    const SeqBatch batch{{0, 9, 20}, {0, 0}, {}};
    Block b(16, 2, 4, std::nullopt);
    b.init_random(31);
    std::fill(b.w.a_log.ptr<float>(), b.w.a_log.ptr<float>() + 2, 8.0f);
    std::fill(b.w.dt_bias.ptr<float>(), b.w.dt_bias.ptr<float>() + 8, 6.0f);
    Philox rng(32, 0, 0);
    std::vector<float> x = random_normal(20 * 16, 1.0f, rng);
    std::vector<float> dy = random_normal(20 * 16, 1.0f, rng);
    for (int chunk : {4, 64}) {
        const std::vector<float> dx = b.backward(x, dy, batch, chunk);
        BOOST_TEST_CONTEXT("chunk " << chunk) {
            BOOST_TEST(all_finite(dx));
            BOOST_TEST(*std::max_element(dx.begin(), dx.end()) > 0.0f);
            for (int i = 0; i < 4; ++i) {
                BOOST_TEST(all_finite(copy_of(b.pair(i).dA)));
                BOOST_TEST(all_finite(copy_of(b.pair(i).dB)));
            }
        }
    }
}

// The block against torch autograd through the naive recurrence (tests/golden/
// gen_kda_backward.py: d = 32, H = 2, K = 8, sequences of 20 and 13 tokens, LoRA rank 2 on
// q, k, v, o), dx and every dA, dB, both gates, the backward in chunks of 4 and 64.
BOOST_AUTO_TEST_CASE(golden) {
    const std::string path = "tests/golden/kda_backward.h5";
    BOOST_REQUIRE_MESSAGE(std::filesystem::exists(path),
                          path << " is missing (run the tests from the repository root)");
    const io::H5Reader h5(path);
    const std::vector<int64_t> offsets = h5.ints("offsets");
    const int64_t n_seq = static_cast<int64_t>(offsets.size()) - 1;
    const SeqBatch batch{offsets, std::vector<int64_t>(n_seq, 0), {}};
    std::vector<float> x = h5.floats("x"), dy = h5.floats("dy");
    const float scale = h5.floats("lora_scale").at(0);
    double worst = 0.0;
    for (std::string variant : {"", "_lower_bound"}) {
        Block b(32, 2, 8, variant.empty() ? std::nullopt : std::optional<double>(-5.0));
        b.init_random(1);  // shapes and gradient buffers; every value is then read
        load_named(kda_tensors(b.cfg, b.w),
                   "model.layers.0.self_attn.",
                   [&](const std::string& name, Tensor& dest) {
                       BOOST_REQUIRE_MESSAGE(h5.shape(name) == dest.shape, name);
                       const std::vector<float> v = h5.floats(name);
                       std::copy(v.begin(), v.end(), dest.ptr<float>());
                   });
        BOOST_REQUIRE((h5.shape("x") == Shape{offsets.back(), 32}));
        for (int i = 0; i < 4; ++i) {
            const std::string pre = std::string("lora.") + kSlotNames[i] + ".";
            LoraPair& p = b.pair(i);
            BOOST_REQUIRE(h5.shape(pre + "A") == p.A.view().shape);
            BOOST_REQUIRE(h5.shape(pre + "B") == p.B.view().shape);
            const std::vector<float> A = h5.floats(pre + "A"), B = h5.floats(pre + "B");
            std::copy(A.begin(), A.end(), p.A.ptr<float>());
            std::copy(B.begin(), B.end(), p.B.ptr<float>());
            p.scale = scale;
        }
        for (int chunk : {4, 64}) {
            const std::vector<float> dx = b.backward(x, dy, batch, chunk);
            BOOST_TEST_CONTEXT("gate" << variant << " chunk " << chunk) {
                const double e_x = rel_err(dx, h5.floats("dx" + variant));
                BOOST_TEST(e_x <= 1e-4);
                worst = std::max(worst, e_x);
                for (int i = 0; i < 4; ++i) {
                    const std::string pre = std::string("lora.") + kSlotNames[i] + ".";
                    const double e_a =
                        rel_err(copy_of(b.pair(i).dA), h5.floats(pre + "dA" + variant));
                    const double e_b =
                        rel_err(copy_of(b.pair(i).dB), h5.floats(pre + "dB" + variant));
                    BOOST_TEST_CONTEXT("adapter " << kSlotNames[i]) {
                        BOOST_TEST(e_a <= 1e-4);
                        BOOST_TEST(e_b <= 1e-4);
                    }
                    worst = std::max({worst, e_a, e_b});
                }
            }
        }
    }
    BOOST_TEST_MESSAGE("kda backward golden (torch autograd): max error " << worst);
}

BOOST_AUTO_TEST_SUITE_END()
