#!/usr/bin/python3
# Golden gradients for tests/unit/model/test_attention_backward.cpp: the MLA / DSA / gated layer of
# reference.py (mla_layer: spec/model-math.md §4-5, dense MHA form with explicit causal and top-k
# masks) differentiated by torch autograd w.r.t. its input x, for a random output gradient dy:
# dx = ∂(Σ dy ⊙ y)/∂x. The top-k indices are integers, so autograd treats the selection as a
# constant and gives the indexer no gradient, as spec §9 asks. Computed in float64 from fp32-stored
# inputs and weights (the C++ side reads the same fp32 values and computes in fp32), so the file
# holds the exact gradient of the stored problem. Sizes of §13 (d 64, H 4, d_n 16, d_r 8, d_v 16,
# kv_lora 32, indexer 16 × 16, top-k 8 < T = 24):
#   mla     ungated MLA, q_lora 32, YaRN RoPE with the mscale² softmax scale (preset tiny-deepseek)
#   dsa     gated DSA, q_lora 32, plain RoPE (preset tiny)
#   kimi    ungated MLA without query latent and without RoPE (preset tiny-kimi), own weights
#   packed  gated DSA over two sequences of 10 and 14 tokens packed in x (each from position 0)
# The indexer scores are checked tie-free (relative gap ≥ 1e-3 between the k-th and (k+1)-th
# visible score of every query), so fp32 rounding on the C++ side cannot flip a selection.
# Run with Debian's /usr/bin/python3 (python3-torch, python3-h5py); writes
# tests/golden/attention_backward.h5.
import os

import h5py
import torch

from reference import Attn, attn_weights, indexer_gap, mla_layer, softmax_scale

D, H, R_Q, R_KV, D_N, D_R, D_V = 64, 4, 32, 32, 16, 8, 16
H_I, D_I, TOP_K, T = 16, 16, 8, 24
PACKED = (10, 14)
THETA = 10000.0
NORM_EPS = 1e-6
YARN = dict(factor=4.0, original=64, beta_fast=32.0, beta_slow=1.0, mscale=1.0)
MIN_GAP = 1e-3


def grad_x(w, x, dy, a, lengths):
    """dx [T, d] of Σ dy ⊙ y, y from mla_layer per sequence (rows split by lengths), float64."""
    w64 = {k: v.double() for k, v in w.items()}
    x64 = x.double().requires_grad_()
    ys, row = [], 0
    for n in lengths:
        y, extra = mla_layer(w64, x64[row:row + n], a)
        if "index_scores" in extra:
            causal = torch.full((n, n), float("-inf"), dtype=torch.float64).triu(1)
            gap = indexer_gap(extra["index_scores"] + causal, a.index_topk)
            if gap < MIN_GAP:
                raise SystemExit(f"indexer scores nearly tied: relative gap {gap:.3g}")
        ys.append(y)
        row += n
    (torch.cat(ys) * dy.double()).sum().backward()
    return x64.grad.float()


def main():
    gen = torch.Generator().manual_seed(20261206)
    sizes = dict(n_head=H, q_lora_rank=R_Q, kv_lora_rank=R_KV, d_nope=D_N, d_rope=D_R, d_v=D_V,
                 theta=THETA, norm_eps=NORM_EPS, index_heads=H_I, index_dim=D_I, index_topk=TOP_K)
    w = attn_weights(gen, D, Attn(tau=0.0, gated=True, **sizes))
    kimi_sizes = dict(sizes, q_lora_rank=0, index_heads=0, index_dim=0, index_topk=0)
    w_kimi = attn_weights(gen, D, Attn(tau=0.0, nope=True, **kimi_sizes))
    x = torch.randn(T, D, generator=gen)
    dy = torch.randn(T, D, generator=gen)
    tau_plain = softmax_scale(D_N, D_R)
    cases = {
        "mla": (w, Attn(tau=softmax_scale(D_N, D_R, YARN["factor"], YARN["mscale"]), yarn=YARN,
                        **dict(sizes, index_heads=0)), (T,)),
        "dsa": (w, Attn(tau=tau_plain, gated=True, **sizes), (T,)),
        "kimi": (w_kimi, Attn(tau=tau_plain, nope=True, **kimi_sizes), (T,)),
        "packed": (w, Attn(tau=tau_plain, gated=True, **sizes), PACKED),
    }
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "attention_backward.h5")
    with h5py.File(path, "w") as f:
        f.attrs["generator"] = "tests/golden/gen_attention_backward.py"
        f.attrs["rtol"] = 1e-4
        f["x"] = x.numpy()
        f["dy"] = dy.numpy()
        f["packed_lengths"] = torch.tensor(PACKED, dtype=torch.int64).numpy()
        for name, t in w.items():
            f["weights/self_attn." + name] = t.numpy()
        for name, t in w_kimi.items():
            f["weights_kimi/self_attn." + name] = t.numpy()
        for group, (weights, a, lengths) in cases.items():
            dx = grad_x(weights, x, dy, a, lengths)
            f[group + "/dx"] = dx.numpy()
            print(f"{group}: |dx| max {dx.abs().max():.4f}")
        dense = grad_x(w, x, dy, Attn(tau=tau_plain, gated=True, **dict(sizes, index_heads=0)), (T,))
        assert (f["dsa/dx"][()] - dense.numpy()).__abs__().max() > 1e-3, "top-k changed nothing"
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
