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
# and (k+1)-th largest visible scores differ by at least 1e-3·max|score|. The layer math and the
# weight draws live in reference.py (attn_weights, mla_layer).
# Run with Debian's /usr/bin/python3 (python3-torch, python3-h5py); writes
# tests/golden/attention.h5.
import os

import h5py
import torch

from reference import Attn, attn_weights, indexer_gap, mla_layer, softmax_scale

D, H, R_Q, R_KV, D_N, D_R, D_V = 64, 4, 32, 32, 16, 8, 16
H_I, D_I, TOP_K, T = 16, 16, 8, 24
THETA = 10000.0
NORM_EPS = 1e-6  # q_norm / kv_norm (MlaConfig::norm_eps) and the indexer's k_norm
YARN = dict(factor=4.0, original=64, beta_fast=32.0, beta_slow=1.0, mscale=1.0)
MIN_GAP = 1e-3


def check_tie_free(scores, top_k):
    gap = indexer_gap(scores, top_k)
    if gap < MIN_GAP:
        raise SystemExit(f"indexer scores nearly tied: relative gap {gap:.3g}")


def main():
    gen = torch.Generator().manual_seed(20260301)
    sizes = dict(n_head=H, q_lora_rank=R_Q, kv_lora_rank=R_KV, d_nope=D_N, d_rope=D_R, d_v=D_V,
                 theta=THETA, norm_eps=NORM_EPS, index_heads=H_I, index_dim=D_I, index_topk=TOP_K)
    w = attn_weights(gen, D, Attn(tau=0.0, gated=True, **sizes))
    x = torch.randn(T, D, generator=gen)
    tau_mla = softmax_scale(D_N, D_R, YARN["factor"], YARN["mscale"])
    tau_dsa = softmax_scale(D_N, D_R)
    mla = Attn(tau=tau_mla, yarn=YARN, **dict(sizes, index_heads=0))
    dsa = Attn(tau=tau_dsa, gated=True, **sizes)
    y_mla, _ = mla_layer(w, x, mla)
    y_dsa, extra = mla_layer(w, x, dsa)
    check_tie_free(extra["index_scores"] + torch.full((T, T), float("-inf")).triu(1), TOP_K)
    y_dense, _ = mla_layer(w, x, dsa, top_k=False)
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
