#!/usr/bin/python3
"""Golden MoE outputs for tests/unit/model/test_moe.cpp, written from spec/model-math.md §6-7 in
torch fp32 (independent of the C++ code): writes tests/golden/moe.h5.

Two cases, each on its own T=24 tokens, d=64, E=8 routed experts, top-2, moe_inter 32, 1 shared
expert of width 32, sigmoid scores + e_score_correction_bias (0.1·N(0,1)) for selection only,
group-limited (n_group 2, topk_group 1; group score = sum of the top-2 biased scores; other
groups −inf), weights from the unbiased scores, renormalised, × ρ = 2.5:
  /deepseek  DeepSeek-V3.2 MoE: y = Σ_i w_i Expert_i(x) + Shared(x), SwiGLU experts
             Expert(x) = down(SiLU(gate x) ⊙ up x); weights under model.layers.1.mlp.*
  /latent    LatentMoE (§7): z = fc1 x (ℓ = 32), y = fc2(Σ_i w_i Expert_i(z)) + Shared(x),
             relu2 experts Expert(z) = down(ReLU(up z)²), shared relu2 on x;
             weights under model.layers.3.mlp.*
Each group holds x [T, d], y [T, d], idx [T, 2] (int64, best first) and weight [T, 2]; /atol [1]
is the tolerance the C++ test applies.
Inputs and weights are rounded to the bf16 grid (exact in fp32) so that shuffle + gzip keeps the
file small; every computation is fp32. Selection margins are asserted (≥ 1e-4) so that ulp-level
differences between torch and the C++ BLAS cannot flip a choice. The routing and expert math
live in reference.py (route, swiglu_mlp, relu2_mlp, combine).
Run from the repository root: /usr/bin/python3 tests/golden/gen_moe.py
"""
import h5py
import torch

import reference
from reference import combine, relu2_mlp, swiglu_mlp

T, D, E, TOP_K, INTER, SHARED = 24, 64, 8, 2, 32, 32
N_GROUP, TOPK_GROUP, RHO, LATENT = 2, 1, 2.5, 32
MARGIN = 1e-4

gen = torch.Generator().manual_seed(20261202)


def randn(*shape, std=1.0):
    return reference.bf16_randn(gen, *shape, std=std)


def route(x, gate_w, bias):
    """idx [T, k] (best first) and weights [T, k] (model-math §6, DS32 Gate), margins asserted."""
    idx, w, margin = reference.route(x, gate_w, bias, TOP_K, N_GROUP, TOPK_GROUP, RHO)
    assert margin >= MARGIN, f"routing near-tie: margin {margin:.3g}"
    return idx, w


def write(f, group, tensors):
    for name, t in tensors.items():
        arr = t.numpy()
        if arr.size > 64:
            f.create_dataset(f"{group}/{name}", data=arr, compression="gzip",
                             compression_opts=9, shuffle=True, track_times=False)
        else:
            f.create_dataset(f"{group}/{name}", data=arr, track_times=False)


def deepseek_case(x):
    p = "model.layers.1.mlp."
    w = {p + "gate.weight": randn(E, D, std=D ** -0.5),
         p + "gate.e_score_correction_bias": randn(E, std=0.1)}
    for e in range(E):
        w[f"{p}experts.{e}.gate_proj.weight"] = randn(INTER, D, std=D ** -0.5)
        w[f"{p}experts.{e}.up_proj.weight"] = randn(INTER, D, std=D ** -0.5)
        w[f"{p}experts.{e}.down_proj.weight"] = randn(D, INTER, std=INTER ** -0.5)
    for n in ("gate_proj", "up_proj"):
        w[f"{p}shared_experts.{n}.weight"] = randn(SHARED, D, std=D ** -0.5)
    w[f"{p}shared_experts.down_proj.weight"] = randn(D, SHARED, std=SHARED ** -0.5)

    idx, wt = route(x, w[p + "gate.weight"], w[p + "gate.e_score_correction_bias"])

    def expert(e, t):
        q = f"{p}experts.{e}."
        return swiglu_mlp(x[t:t + 1], w[q + "gate_proj.weight"], w[q + "up_proj.weight"],
                          w[q + "down_proj.weight"])[0]

    shared = swiglu_mlp(x, *(w[f"{p}shared_experts.{n}.weight"]
                             for n in ("gate_proj", "up_proj", "down_proj")))
    y = combine(idx, wt, expert) + shared
    return w, idx, wt, y


def latent_case(x):
    p = "model.layers.3.mlp."
    w = {p + "gate.weight": randn(E, D, std=D ** -0.5),
         p + "gate.e_score_correction_bias": randn(E, std=0.1),
         p + "fc1_latent_proj.weight": randn(LATENT, D, std=D ** -0.5),
         p + "fc2_latent_proj.weight": randn(D, LATENT, std=LATENT ** -0.5)}
    for e in range(E):
        w[f"{p}experts.{e}.up_proj.weight"] = randn(INTER, LATENT, std=LATENT ** -0.5)
        w[f"{p}experts.{e}.down_proj.weight"] = randn(LATENT, INTER, std=INTER ** -0.5)
    w[f"{p}shared_experts.up_proj.weight"] = randn(SHARED, D, std=D ** -0.5)
    w[f"{p}shared_experts.down_proj.weight"] = randn(D, SHARED, std=SHARED ** -0.5)

    idx, wt = route(x, w[p + "gate.weight"], w[p + "gate.e_score_correction_bias"])
    z = x @ w[p + "fc1_latent_proj.weight"].t()              # [T, ℓ]

    def expert(e, t):
        q = f"{p}experts.{e}."
        return relu2_mlp(z[t:t + 1], w[q + "up_proj.weight"], w[q + "down_proj.weight"])[0]

    y_lat = combine(idx, wt, expert)                          # [T, ℓ]
    shared = relu2_mlp(x, w[p + "shared_experts.up_proj.weight"],
                       w[p + "shared_experts.down_proj.weight"])
    y = y_lat @ w[p + "fc2_latent_proj.weight"].t() + shared
    return w, idx, wt, y


def main():
    torch.set_num_threads(1)
    # No timestamps anywhere (root group, groups, datasets): the file is byte-reproducible.
    fcpl = h5py.h5p.create(h5py.h5p.FILE_CREATE)
    fcpl.set_obj_track_times(False)
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    fapl.set_libver_bounds(h5py.h5f.LIBVER_LATEST, h5py.h5f.LIBVER_LATEST)
    fid = h5py.h5f.create(b"tests/golden/moe.h5", h5py.h5f.ACC_TRUNC, fcpl=fcpl, fapl=fapl)
    with h5py.File(fid) as f:
        f.create_dataset("atol", data=torch.tensor([1e-5]).numpy(), track_times=False)
        for group, case in (("deepseek", deepseek_case), ("latent", latent_case)):
            gcpl = h5py.h5p.create(h5py.h5p.GROUP_CREATE)
            gcpl.set_obj_track_times(False)
            h5py.h5g.create(f.id, group.encode(), gcpl=gcpl)
            x = randn(T, D)
            w, idx, wt, y = case(x)
            write(f, group, w)
            write(f, group, {"x": x, "y": y, "idx": idx.to(torch.int64), "weight": wt})


if __name__ == "__main__":
    main()
