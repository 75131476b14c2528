#!/usr/bin/python3
# Golden data for tests/unit/model/test_attention.cpp: MLA and gated DSA written straight from
# spec/model-math.md §4-5 in torch fp32 (dense MHA form with explicit masks, as DeepSeek-V3.2's
# prefill), at the tiny sizes of §13: d 64, H 4, q_lora 32, kv_lora 32, d_n 16, d_r 8, d_v 16,
# indexer 16 heads × 16, top-k 8 < T = 24.
#   mla: ungated MLA with YaRN RoPE (factor 4 over 64 positions, β 32/1, mscale = mscale_all_dim
#        = 1, so cos/sin are unscaled and τ = 24^{-1/2}·m², m = 0.1·ln 4 + 1) — preset tiny-deepseek
#   dsa: gated DSA with plain RoPE (θ 10000), τ = 24^{-1/2} — preset tiny
# Both read the same input x [24, 64] and the same weights (HF names under weights/self_attn.*;
# mla uses the subset it needs). The indexer scores are checked tie-free: for every query the k-th
# and (k+1)-th largest visible scores differ by at least 1e-3·max|score|.
# Run with Debian's /usr/bin/python3 (python3-torch, python3-h5py); writes
# tests/golden/attention.h5.
import math
import os

import h5py
import torch

D, H, R_Q, R_KV, D_N, D_R, D_V = 64, 4, 32, 32, 16, 8, 16
H_I, D_I, TOP_K, T = 16, 16, 8, 24
THETA = 10000.0
NORM_EPS = 1e-6  # q_norm / kv_norm (MlaConfig::norm_eps) and the indexer's k_norm
YARN = dict(factor=4.0, original=64, beta_fast=32.0, beta_slow=1.0, mscale=1.0)
MIN_GAP = 1e-3


def weights(gen):
    """HF-named tensors; projections N(0, fan_in^{-1/2}) so activations stay O(1)."""
    def lin(out, inp):
        return torch.randn(out, inp, generator=gen) / math.sqrt(inp)

    def near_one(n):
        return 1.0 + 0.1 * torch.randn(n, generator=gen)

    return {
        "q_a_proj.weight": lin(R_Q, D),
        "q_a_layernorm.weight": near_one(R_Q),
        "q_b_proj.weight": lin(H * (D_N + D_R), R_Q),
        "kv_a_proj_with_mqa.weight": lin(R_KV + D_R, D),
        "kv_a_layernorm.weight": near_one(R_KV),
        "kv_b_proj.weight": lin(H * (D_N + D_V), R_KV),
        "o_proj.weight": lin(D, H * D_V),
        "g_proj.weight": lin(H * D_V, D),
        "indexer.wq_b.weight": lin(H_I * D_I, R_Q),
        "indexer.wk.weight": lin(D_I, D),
        "indexer.k_norm.weight": near_one(D_I),
        "indexer.k_norm.bias": 0.1 * torch.randn(D_I, generator=gen),
        "indexer.weights_proj.weight": lin(H_I, D),
    }


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope_theta(dim, yarn):
    """θ_i = base^{-2i/dim}; YaRN: θ'_i = θ_i/factor·(1−smooth) + θ_i·smooth (spec §4)."""
    theta = torch.tensor([THETA ** (-2.0 * i / dim) for i in range(dim // 2)], dtype=torch.float64)
    if yarn is None:
        return theta.float()

    def corr_dim(rot):
        return dim * math.log(yarn["original"] / (rot * 2 * math.pi)) / (2 * math.log(THETA))

    low = max(math.floor(corr_dim(yarn["beta_fast"])), 0)
    high = min(math.ceil(corr_dim(yarn["beta_slow"])), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    smooth = 1 - ramp
    return (theta / yarn["factor"] * (1 - smooth) + theta * smooth).float()


def cos_sin(pos, theta):
    ang = pos.double()[:, None] * theta.double()[None, :]  # [T, dim/2]
    return ang.cos().float(), ang.sin().float()


def rope_interleaved(x, pos, theta):
    """pairs (x_2i, x_2i+1) as complex × e^{iθ_i·pos}; x [T, ..., dim]."""
    c, s = cos_sin(pos, theta)
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (c.shape[1],)
    c, s = c.view(shape), s.view(shape)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1).flatten(-2)


def rope_half(x, pos, theta):
    """rotate-half pairs (x_i, x_{i+dim/2}); x [T, ..., dim]."""
    c, s = cos_sin(pos, theta)
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (c.shape[1],)
    c, s = c.view(shape), s.view(shape)
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def indexer(w, x, c_q, pos, theta):
    """I(t, s) = Σ_j w_t,j·H_I^{-1/2}·d_I^{-1/2}·ReLU(q^I_t,j·k^I_s), unmasked [T, T]."""
    q = (c_q @ w["indexer.wq_b.weight"].T).view(T, H_I, D_I)
    q = torch.cat([rope_half(q[..., :D_R], pos, theta), q[..., D_R:]], dim=-1)  # rope first
    k = torch.nn.functional.layer_norm(x @ w["indexer.wk.weight"].T, (D_I,),
                                       w["indexer.k_norm.weight"], w["indexer.k_norm.bias"], 1e-6)
    k = torch.cat([rope_half(k[..., :D_R], pos, theta), k[..., D_R:]], dim=-1)
    hw = (x @ w["indexer.weights_proj.weight"].T) * H_I ** -0.5 * D_I ** -0.5  # [T, H_I]
    logits = torch.einsum("tjd,sd->tjs", q, k).relu()
    return torch.einsum("tj,tjs->ts", hw, logits)


def mla(w, x, yarn, tau, gated, top_k):
    """y [T, d] of one sequence at positions 0..T-1; top_k = None: dense MLA."""
    pos = torch.arange(T)
    theta = rope_theta(D_R, yarn)
    c_q = rms_norm(x @ w["q_a_proj.weight"].T, w["q_a_layernorm.weight"], NORM_EPS)
    q = (c_q @ w["q_b_proj.weight"].T).view(T, H, D_N + D_R)
    q_n, q_r = q[..., :D_N], rope_interleaved(q[..., D_N:], pos, theta)
    kv = x @ w["kv_a_proj_with_mqa.weight"].T
    c_kv = rms_norm(kv[:, :R_KV], w["kv_a_layernorm.weight"], NORM_EPS)
    k_r = rope_interleaved(kv[:, R_KV:], pos, theta)  # [T, d_r], shared by the heads
    kvb = (c_kv @ w["kv_b_proj.weight"].T).view(T, H, D_N + D_V)
    k_n, v = kvb[..., :D_N], kvb[..., D_N:]
    s = (torch.einsum("thd,uhd->htu", q_n, k_n) + torch.einsum("thd,ud->htu", q_r, k_r)) * tau
    causal = torch.full((T, T), float("-inf")).triu(1)
    mask = causal
    extra = {}
    if top_k is not None:  # DS32: top-k over the causally masked scores, then causal re-added
        scores = indexer(w, x, c_q, pos, theta)
        idx = (scores + causal).topk(min(top_k, T), dim=-1).indices
        mask = torch.full((T, T), float("-inf")).scatter_(1, idx, 0.0) + causal
        extra = {"index_scores": scores, "selected": (mask == 0).to(torch.int8)}
        check_tie_free(scores + causal, top_k)
    p = torch.softmax(s + mask, dim=-1)
    o = torch.einsum("htu,uhd->thd", p, v).reshape(T, H * D_V)
    if gated:
        o = o * torch.sigmoid(x @ w["g_proj.weight"].T)
    return o @ w["o_proj.weight"].T, extra


def check_tie_free(scores, top_k):
    for t in range(top_k, T):  # rows with more visible keys than k
        row = scores[t, : t + 1].sort(descending=True).values
        gap = (row[top_k - 1] - row[top_k]).item()
        if gap < MIN_GAP * row.abs().max().item():
            raise SystemExit(f"indexer scores nearly tied at query {t}: gap {gap:.3g}")


def main():
    gen = torch.Generator().manual_seed(20260301)
    w = weights(gen)
    x = torch.randn(T, D, generator=gen)
    yarn_m = 0.1 * YARN["mscale"] * math.log(YARN["factor"]) + 1.0
    tau_mla = (D_N + D_R) ** -0.5 * yarn_m * yarn_m
    tau_dsa = (D_N + D_R) ** -0.5
    y_mla, _ = mla(w, x, YARN, tau_mla, gated=False, top_k=None)
    y_dsa, extra = mla(w, x, None, tau_dsa, gated=True, top_k=TOP_K)
    y_dense, _ = mla(w, x, None, tau_dsa, gated=True, top_k=None)
    assert (y_dsa - y_dense).abs().max() > 1e-3, "top-k did not change the output"

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "attention.h5")
    with h5py.File(path, "w") as f:
        f.attrs["generator"] = "tests/golden/gen_attention.py"
        f.attrs["atol"] = 1e-5
        f["x"] = x.numpy()
        for name, t in w.items():
            f["weights/self_attn." + name] = t.numpy()
        f["mla/y"] = y_mla.numpy()
        f["dsa/y"] = y_dsa.numpy()
        f["dsa/index_scores"] = extra["index_scores"].numpy()
        f["dsa/selected"] = extra["selected"].numpy()
    print(f"wrote {path}: |y_mla| max {y_mla.abs().max():.3f}, "
          f"|y_dsa| max {y_dsa.abs().max():.3f}, "
          f"|y_dsa - y_dense| max {(y_dsa - y_dense).abs().max():.3f}")


if __name__ == "__main__":
    main()
