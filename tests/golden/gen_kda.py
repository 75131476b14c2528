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
lb = -5. The layer math and the weight draws live in reference.py (kda_weights, kda_layer).
Run: /usr/bin/python3 tests/golden/gen_kda.py (from the repository root).
"""
import os

import h5py
import torch

from reference import kda_layer, kda_weights

D_MODEL, H, K, W, T, B = 64, 4, 16, 4, 24, 2
EPS = 1e-5
LOWER_BOUND = -5.0
PREFIX = "model.layers.0.self_attn."


def main():
    torch.set_default_dtype(torch.float32)
    gen = torch.Generator().manual_seed(20260117)
    w = kda_weights(gen, D_MODEL, H, K, W)
    x = torch.randn(B * T, D_MODEL, generator=gen)
    offsets = [s * T for s in range(B + 1)]
    out = {}
    for name, lb in (("", None), ("_lower_bound", LOWER_BOUND)):
        ys, ss = zip(*(kda_layer(w, x[offsets[s] : offsets[s + 1]], H, K, EPS, lb)
                       for s in range(B)))
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
