#!/usr/bin/python3
"""Golden data for the KDA block (tests/unit/model/test_kda.cpp): writes tests/golden/kda.h5.

The full KDA layer of spec/model-math.md §3 in torch fp32, written from the spec's equations in
the naive token-by-token form (no chunking), at the tiny test sizes of §13: d = 64, H = 4,
K = V = 16, W = 4, RMSNorm eps 1e-5; two sequences of T = 24 tokens, each from a zero state.
Random weights are drawn at a scale that makes every path matter (decays from ~0 to ~-2 per
step, gates away from 0.5, a non-trivial o_norm weight).

Datasets: every weight under "model.layers.0.self_attn.<HF name>" with its HF shape; "x"
[B*T, d] (the input-normed hidden states, sequences packed); "offsets" [B+1]; "y" [B*T, d] the
layer output; "S" [B, H, K, V] the final recurrent states; "y_lower_bound" [B*T, d] and
"S_lower_bound" the same with fla's lower-bound gate g = lb*sigmoid(exp(A_log)*(f + dt_bias)),
lb = -5. Run: /usr/bin/python3 tests/golden/gen_kda.py (from the repository root).
"""
import math
import os

import h5py
import torch
import torch.nn.functional as F

D_MODEL, H, K, W, T, B = 64, 4, 16, 4, 24, 2
D = H * K
EPS = 1e-5
LOWER_BOUND = -5.0
PREFIX = "model.layers.0.self_attn."


def make_weights(gen):
    def normal(*shape, std):
        return torch.randn(*shape, generator=gen) * std

    def uniform(*shape, lo, hi):
        return lo + (hi - lo) * torch.rand(*shape, generator=gen)

    dt = torch.exp(uniform(D, lo=math.log(1e-3), hi=math.log(1e-1))).clamp(min=1e-4)
    return {
        "q_proj.weight": normal(D, D_MODEL, std=D_MODEL**-0.5),
        "k_proj.weight": normal(D, D_MODEL, std=D_MODEL**-0.5),
        "v_proj.weight": normal(D, D_MODEL, std=D_MODEL**-0.5),
        "q_conv1d.weight": normal(D, 1, W, std=0.5),
        "k_conv1d.weight": normal(D, 1, W, std=0.5),
        "v_conv1d.weight": normal(D, 1, W, std=0.5),
        "f_a_proj.weight": normal(K, D_MODEL, std=D_MODEL**-0.5),
        "f_b_proj.weight": normal(D, K, std=0.5),
        "dt_bias": dt + torch.log(-torch.expm1(-dt)),  # inverse softplus (fla init)
        "A_log": torch.log(uniform(1, 1, H, 1, lo=1.0, hi=16.0)),
        "b_proj.weight": normal(H, D_MODEL, std=D_MODEL**-0.5),
        "g_a_proj.weight": normal(K, D_MODEL, std=D_MODEL**-0.5),
        "g_b_proj.weight": normal(D, K, std=0.5),
        "o_norm.weight": 1.0 + normal(K, std=0.2),
        "o_proj.weight": normal(D_MODEL, D, std=D**-0.5),
    }


def causal_conv_silu(u, w):
    """SiLU(c), c_t[ch] = sum_i w[ch, 0, i] * u_{t-W+1+i}[ch], u_{<0} = 0. u [T, D]."""
    n = u.shape[0]
    padded = torch.cat([torch.zeros(W - 1, D), u])
    c = sum(w[:, 0, i] * padded[i : i + n] for i in range(W))
    return F.silu(c)


def l2norm(x):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def kda_layer(w, x, lower_bound=None):
    """One sequence x [T, d] from a zero state -> (y [T, d], S [H, K, V])."""
    n = x.shape[0]
    q = causal_conv_silu(x @ w["q_proj.weight"].T, w["q_conv1d.weight"]).view(n, H, K)
    k = causal_conv_silu(x @ w["k_proj.weight"].T, w["k_conv1d.weight"]).view(n, H, K)
    v = causal_conv_silu(x @ w["v_proj.weight"].T, w["v_conv1d.weight"]).view(n, H, K)
    q = l2norm(q) * K**-0.5
    k = l2norm(k)
    f = (x @ w["f_a_proj.weight"].T) @ w["f_b_proj.weight"].T + w["dt_bias"]
    f = f.view(n, H, K)
    a = torch.exp(w["A_log"].view(H, 1))
    if lower_bound is None:
        g = -a * F.softplus(f)
    else:
        g = lower_bound * torch.sigmoid(a * f)
    beta = torch.sigmoid(x @ w["b_proj.weight"].T)  # [T, H]

    S = torch.zeros(H, K, K)
    o = torch.zeros(n, H, K)
    for t in range(n):
        S = S * torch.exp(g[t])[:, :, None]  # S' = e^g (.) S, row-wise
        ks = (k[t][:, :, None] * S).sum(-2)  # S'^T k   [H, V]
        u = beta[t][:, None] * (v[t] - ks)  # [H, V]
        S = S + k[t][:, :, None] * u[:, None, :]
        o[t] = (q[t][:, :, None] * S).sum(-2)  # S^T q

    gate = (x @ w["g_a_proj.weight"].T) @ w["g_b_proj.weight"].T
    o = o * torch.rsqrt((o * o).mean(-1, keepdim=True) + EPS) * w["o_norm.weight"]
    o = o * torch.sigmoid(gate.view(n, H, K))
    return o.reshape(n, D) @ w["o_proj.weight"].T, S


def main():
    torch.set_default_dtype(torch.float32)
    gen = torch.Generator().manual_seed(20260117)
    w = make_weights(gen)
    x = torch.randn(B * T, D_MODEL, generator=gen)
    offsets = [s * T for s in range(B + 1)]
    out = {}
    for name, lb in (("", None), ("_lower_bound", LOWER_BOUND)):
        ys, ss = zip(*(kda_layer(w, x[offsets[s] : offsets[s + 1]], lb) for s in range(B)))
        out["y" + name] = torch.cat(ys)
        out["S" + name] = torch.stack(ss)

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kda.h5")
    with h5py.File(path, "w") as f:
        f.attrs["generator"] = "tests/golden/gen_kda.py"
        for name, t in w.items():
            f.create_dataset(PREFIX + name, data=t.numpy())
        f.create_dataset("x", data=x.numpy())
        f.create_dataset("offsets", data=torch.tensor(offsets, dtype=torch.int64).numpy())
        for name, t in out.items():
            f.create_dataset(name, data=t.numpy())
    print(f"wrote {path}: |y| max {out['y'].abs().max():.3f}")


if __name__ == "__main__":
    main()
