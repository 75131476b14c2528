#!/usr/bin/python3
"""Golden vision-path outputs for tests/unit/model/test_vision.cpp, written from
spec/model-math.md §8 in torch fp32 (independent of the C++ code): writes tests/golden/vision.h5.

The tiny preset's tower (§13: C 32, 2 layers, 2 heads of 16, mlp 64, p 4, 2x2 merge, position
table 8x8) and projector into d 64, on two packed images of 4x6 and 10x8 patches (16x24 and
40x32 pixels), so that the position table is interpolated both down and up:
  patches  [L, 3p²] per image img.view(3,h,p,w,p).permute(1,3,0,2,4), images concatenated
  x_embed  [L, C]   Conv2d(3,C,p,p) as a matmul + bias + bicubic(pos_emb → (h, w))
                    (F.interpolate, align_corners=False)
  x_block0 [L, C]   after block 0: pre-LN, wqkv (+bias), 2-D RoPE (complex pairs; pair 2i by
                    column, 2i+1 by row, θ_i = 10000^(-4i/dh)), softmax(qkᵀ/√dh)v within each
                    image, wo (+bias); fc1(GELU_tanh(fc0(LN1 x)))
  x_final  [L, C]   after both blocks and final_layernorm
  merged   [N, 4C]  per image x.view(h/2,2,w/2,2,C).permute(0,2,1,3,4), flattened
  tokens   [N, d]   projector: LN(C) on each of the 4 slots, linear_1, GELU (erf), linear_2
Inputs and weights lie on the bf16 grid (exact in fp32). Weights under their HF names in /weights; /pixels_<i> [3, H, W] and /grids [n, 2] (h, w patches);
/rtol [1] is the relative tolerance the C++ test applies (max |a−b| / max |b|).
Run from the repository root: /usr/bin/python3 tests/golden/gen_vision.py
"""
import h5py
import torch
import torch.nn.functional as F

C, LAYERS, HEADS, MLP, P, MERGE, S, D = 32, 2, 2, 64, 4, 2, 8, 64
DH = C // HEADS
GRIDS = [(4, 6), (10, 8)]
EPS = 1e-5

gen = torch.Generator().manual_seed(20261211)


def randn(*shape, std=1.0):
    """N(0, std²) on the bf16 grid (exact in fp32): a smaller gzip-ed file."""
    return (torch.randn(*shape, generator=gen, dtype=torch.float32) * std).bfloat16().float()


def weights():
    t, pr = "vision_tower.", "multi_modal_projector."
    w = {t + "patch_embed.proj.weight": randn(C, 3, P, P, std=(3 * P * P) ** -0.5),
         t + "patch_embed.proj.bias": randn(C, std=0.1),
         t + "patch_embed.pos_emb.weight": randn(S, S, C, std=0.5)}
    for i in range(LAYERS):
        b = f"{t}encoder.blocks.{i}."
        for n in ("norm0", "norm1"):
            w[b + n + ".weight"] = 1 + randn(C, std=0.1)
            w[b + n + ".bias"] = randn(C, std=0.1)
        w[b + "wqkv.weight"] = randn(3 * C, C, std=C ** -0.5)
        w[b + "wqkv.bias"] = randn(3 * C, std=0.1)
        w[b + "wo.weight"] = randn(C, C, std=C ** -0.5)
        w[b + "wo.bias"] = randn(C, std=0.1)
        w[b + "mlp.fc0.weight"] = randn(MLP, C, std=C ** -0.5)
        w[b + "mlp.fc0.bias"] = randn(MLP, std=0.1)
        w[b + "mlp.fc1.weight"] = randn(C, MLP, std=MLP ** -0.5)
        w[b + "mlp.fc1.bias"] = randn(C, std=0.1)
    C4 = MERGE * MERGE * C
    for n in (t + "encoder.final_layernorm", pr + "pre_norm"):
        w[n + ".weight"] = 1 + randn(C, std=0.1)
        w[n + ".bias"] = randn(C, std=0.1)
    w[pr + "linear_1.weight"] = randn(C4, C4, std=C4 ** -0.5)
    w[pr + "linear_1.bias"] = randn(C4, std=0.1)
    w[pr + "linear_2.weight"] = randn(D, C4, std=C4 ** -0.5)
    w[pr + "linear_2.bias"] = randn(D, std=0.1)
    return w


def rope_2d(x, h, w):
    """x [n, H, dh] of one image of grid (h, w), n = h·w row-major."""
    freqs = 1.0 / (10000 ** (torch.arange(0, DH, 4)[: DH // 4].float() / DH))
    rows = torch.arange(h).repeat_interleave(w).float()
    cols = torch.arange(w).repeat(h).float()
    x_cis = torch.polar(torch.ones(h * w, DH // 4), torch.outer(cols, freqs))
    y_cis = torch.polar(torch.ones(h * w, DH // 4), torch.outer(rows, freqs))
    cis = torch.stack([x_cis, y_cis], dim=-1).reshape(h * w, DH // 2)
    xc = torch.view_as_complex(x.reshape(h * w, HEADS, DH // 2, 2))
    return torch.view_as_real(xc * cis[:, None, :]).reshape(h * w, HEADS, DH)


def block(x, w, i, grids):
    b = f"vision_tower.encoder.blocks.{i}."
    xn = F.layer_norm(x, (C,), w[b + "norm0.weight"], w[b + "norm0.bias"], EPS)
    qkv = (xn @ w[b + "wqkv.weight"].T + w[b + "wqkv.bias"]).view(-1, 3, HEADS, DH)
    outs, off = [], 0
    for h, wd in grids:
        n = h * wd
        q = rope_2d(qkv[off:off + n, 0], h, wd).transpose(0, 1)  # [H, n, dh]
        k = rope_2d(qkv[off:off + n, 1], h, wd).transpose(0, 1)
        v = qkv[off:off + n, 2].transpose(0, 1)
        a = torch.softmax(q @ k.transpose(1, 2) / DH ** 0.5, dim=-1) @ v
        outs.append(a.transpose(0, 1).reshape(n, C))
        off += n
    x = x + torch.cat(outs) @ w[b + "wo.weight"].T + w[b + "wo.bias"]
    xn = F.layer_norm(x, (C,), w[b + "norm1.weight"], w[b + "norm1.bias"], EPS)
    f = F.gelu(xn @ w[b + "mlp.fc0.weight"].T + w[b + "mlp.fc0.bias"], approximate="tanh")
    return x + f @ w[b + "mlp.fc1.weight"].T + w[b + "mlp.fc1.bias"]


def main():
    w = weights()
    pixels = [randn(3, h * P, wd * P) for h, wd in GRIDS]
    t = "vision_tower."
    embed = []
    for img, (h, wd) in zip(pixels, GRIDS):
        patches = img.view(3, h, P, wd, P).permute(1, 3, 0, 2, 4).reshape(h * wd, 3 * P * P)
        x = patches @ w[t + "patch_embed.proj.weight"].reshape(C, -1).T + w[t + "patch_embed.proj.bias"]
        table = w[t + "patch_embed.pos_emb.weight"].permute(2, 0, 1).unsqueeze(0)
        pos = F.interpolate(table, size=(h, wd), mode="bicubic", align_corners=False)
        embed.append(x + pos[0].permute(1, 2, 0).reshape(h * wd, C))
    x_embed = torch.cat(embed)
    x_block0 = block(x_embed, w, 0, GRIDS)
    x = x_block0
    for i in range(1, LAYERS):
        x = block(x, w, i, GRIDS)
    n = t + "encoder.final_layernorm."
    x_final = F.layer_norm(x, (C,), w[n + "weight"], w[n + "bias"], EPS)
    merged, off = [], 0
    for h, wd in GRIDS:
        cell = x_final[off:off + h * wd].view(h // 2, 2, wd // 2, 2, C).permute(0, 2, 1, 3, 4)
        merged.append(cell.reshape(-1, 4, C))
        off += h * wd
    merged = torch.cat(merged)  # [N, 4, C]
    pr = "multi_modal_projector."
    y = F.layer_norm(merged, (C,), w[pr + "pre_norm.weight"], w[pr + "pre_norm.bias"], EPS)
    y = F.gelu(y.reshape(-1, 4 * C) @ w[pr + "linear_1.weight"].T + w[pr + "linear_1.bias"])
    tokens = y @ w[pr + "linear_2.weight"].T + w[pr + "linear_2.bias"]

    with h5py.File("tests/golden/vision.h5", "w") as f:
        def put(name, arr):
            f.create_dataset(name, data=arr.numpy(), compression="gzip", compression_opts=9,
                             shuffle=True, track_times=False)
        for k, v in w.items():
            put("weights/" + k, v)
        for i, img in enumerate(pixels):
            put(f"pixels_{i}", img)
        f.create_dataset("grids", data=torch.tensor(GRIDS, dtype=torch.int64).numpy())
        put("x_embed", x_embed)
        put("x_block0", x_block0)
        put("x_final", x_final)
        put("merged", merged.reshape(-1, 4 * C))
        put("tokens", tokens)
        f.create_dataset("rtol", data=torch.tensor([1e-4]).numpy())


if __name__ == "__main__":
    main()
