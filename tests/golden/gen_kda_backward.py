#!/usr/bin/python3
"""Golden data for the KDA block's backward (tests/unit/model/test_kda_backward.cpp): writes
tests/golden/kda_backward.h5.

The KDA layer of reference.py (kda_layer: spec/model-math.md §3, naive per-token recurrence from
a zero state per sequence) with LoRA adapters on q_proj, k_proj, v_proj and o_proj (PEFT:
h = W x + s·B A x, written as the merged weight W + s·B A so autograd reaches A and B), and
gradients by torch autograd of L = Σ dy ⊙ y w.r.t. x and every adapter's A and B. The inputs are
drawn in fp32 (what the C++ test reads); the layer and its gradients are evaluated in float64.
Sizes: d = 32, H = 2, K = V = 8, W = 4, adapter rank 2, scale 0.5, two sequences of 20 and 13
tokens (packed), RMSNorm eps 1e-5; B is drawn nonzero so that every adapter path carries
gradient.

Datasets: every weight under "model.layers.0.self_attn.<HF name>"; "x", "dy" [n_tok, d];
"offsets" [3]; "lora_scale" [1]; "lora.<p>.A" [r, in], "lora.<p>.B" [out, r] for p in q, k, v,
o; and, for the default decay gate ("") and fla's lower-bound gate
("_lower_bound", lb = -5): "dx<v>" [n_tok, d], "lora.<p>.dA<v>", "lora.<p>.dB<v>".
Run: /usr/bin/python3 tests/golden/gen_kda_backward.py (from the repository root).
"""
import os

import h5py
import torch

from reference import kda_layer, kda_weights

D_MODEL, H, K, W, RANK, SCALE = 32, 2, 8, 4, 2, 0.5
LENGTHS = (20, 13)
EPS = 1e-5
LOWER_BOUND = -5.0
PREFIX = "model.layers.0.self_attn."
ADAPTED = {"q": "q_proj.weight", "k": "k_proj.weight", "v": "v_proj.weight", "o": "o_proj.weight"}


def main():
    torch.set_default_dtype(torch.float32)
    gen = torch.Generator().manual_seed(20261202)
    w = kda_weights(gen, D_MODEL, H, K, W)
    n_tok = sum(LENGTHS)
    x = torch.randn(n_tok, D_MODEL, generator=gen)
    dy = torch.randn(n_tok, D_MODEL, generator=gen)
    lora = {}
    for p, name in ADAPTED.items():
        out, inp = w[name].shape
        lora[p] = (torch.randn(RANK, inp, generator=gen) * inp**-0.5,
                   torch.randn(out, RANK, generator=gen) * 0.3)
    offsets = [0]
    for n in LENGTHS:
        offsets.append(offsets[-1] + n)

    torch.set_default_dtype(torch.float64)
    out = {}
    for variant, lb in (("", None), ("_lower_bound", LOWER_BOUND)):
        xd = x.double().requires_grad_()
        ab = {p: (a.double().requires_grad_(), b.double().requires_grad_())
              for p, (a, b) in lora.items()}
        wd = {name: t.double() for name, t in w.items()}
        for p, name in ADAPTED.items():
            a, b = ab[p]
            wd[name] = wd[name] + SCALE * b @ a
        ys = [kda_layer(wd, xd[offsets[s]:offsets[s + 1]], H, K, EPS, lb)[0]
              for s in range(len(LENGTHS))]
        loss = (torch.cat(ys) * dy.double()).sum()
        loss.backward()
        out["dx" + variant] = xd.grad
        for p, (a, b) in ab.items():
            out[f"lora.{p}.dA" + variant] = a.grad
            out[f"lora.{p}.dB" + variant] = b.grad

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kda_backward.h5")
    with h5py.File(path, "w") as f:
        f.attrs["generator"] = "tests/golden/gen_kda_backward.py"
        f.create_dataset("lora_scale", data=torch.tensor([SCALE], dtype=torch.float32).numpy())
        for name, t in w.items():
            f.create_dataset(PREFIX + name, data=t.numpy())
        f.create_dataset("x", data=x.numpy())
        f.create_dataset("dy", data=dy.numpy())
        f.create_dataset("offsets", data=torch.tensor(offsets, dtype=torch.int64).numpy())
        for p, (a, b) in lora.items():
            f.create_dataset(f"lora.{p}.A", data=a.numpy())
            f.create_dataset(f"lora.{p}.B", data=b.numpy())
        for name, t in out.items():
            f.create_dataset(name, data=t.float().numpy())
    print(f"wrote {path}: |dx| max {out['dx'].abs().max():.3f}")


if __name__ == "__main__":
    main()
