#!/usr/bin/python3
"""Golden MoE input gradients for tests/unit/model/test_ffn_backward.cpp: torch fp32 autograd of
the MoE layer of spec/model-math.md §6-7 with the routing held fixed (the expert choice is taken
from the forward; the weights are gathered from the scores, so the gradient flows through them
into the router), independent of the C++ code: writes tests/golden/moe_backward.h5.

Each case has T=16 tokens, d=64, E=8 routed experts, top-2, moe_inter 32, one shared expert of
width 32 and a correction bias b (0.1·N(0,1)) used for selection; L = Σ dy ⊙ y, dx = ∂L/∂x:
  /deepseek  sigmoid, group-limited (n_group 2, topk_group 1), weights from s, renormalised,
             ρ = 2.5, SwiGLU experts; weights under model.layers.1.mlp.*
  /latent    the same routing, LatentMoE (ℓ = 32) with relu2 experts and shared expert;
             weights under model.layers.3.mlp.*
  /kimi      kimi_linear: sigmoid, one group, weights from the biased scores s + b, renormalised
             with Σ + 1e-20, ρ = 2.446, SwiGLU; weights under model.layers.1.block_sparse_moe.*
             (experts w1/w3/w2)
  /softmax   softmax scores, selection on p + b (one group), weights from p, renormalised,
             ρ = 2.5, SwiGLU; weights under model.layers.1.mlp.*
Each group holds x [T, d], dy [T, d], idx [T, 2] (int64, best first) and dx [T, d]; /rtol [1] is
the tolerance the C++ test applies to max|Δdx| / max|dx|. Inputs and weights are on the bf16
grid (exact in fp32); selection margins are asserted (≥ 1e-4) so that the C++ routing picks the
same experts. Routing and expert math from reference.py (route, swiglu_mlp, relu2_mlp, combine).
Run from the repository root: /usr/bin/python3 tests/golden/gen_moe_backward.py
"""
import h5py
import torch

import reference
from reference import combine, relu2_mlp, swiglu_mlp

T, D, E, TOP_K, INTER, SHARED, LATENT = 16, 64, 8, 2, 32, 32, 32
MARGIN = 1e-4

gen = torch.Generator().manual_seed(20261203)


def randn(*shape, std=1.0):
    return reference.bf16_randn(gen, *shape, std=std)


def select_sigmoid(x, gate_w, bias, n_group, topk_group):
    """idx [T, k] of the DS32/Kimi sigmoid gate (reference.route), margin asserted."""
    with torch.no_grad():
        idx, _, margin = reference.route(x, gate_w, bias, TOP_K, n_group, topk_group, 1.0)
    assert margin >= MARGIN, f"routing near-tie: margin {margin:.3g}"
    return idx


def select_softmax(x, gate_w, bias):
    """idx [T, k] = top-k of softmax(x Wᵍᵀ) + b (one group), margin asserted."""
    with torch.no_grad():
        choice = torch.softmax(x @ gate_w.t(), dim=-1) + bias
        c = choice.sort(dim=-1, descending=True)[0]
        margin = (c[:, :TOP_K] - c[:, 1:TOP_K + 1]).min().item()
    assert margin >= MARGIN, f"routing near-tie: margin {margin:.3g}"
    return choice.topk(TOP_K, dim=-1)[1]


def weights(u, rho, eps=0.0):
    """w = ρ·u / (Σu + ε) for the gathered scores u [T, k] (differentiable)."""
    return u / (u.sum(dim=-1, keepdim=True) + eps) * rho


def swiglu_experts(p, names, width):
    w = {}
    for e in range(E):
        w[f"{p}experts.{e}.{names[0]}.weight"] = randn(INTER, width, std=width ** -0.5)
        w[f"{p}experts.{e}.{names[1]}.weight"] = randn(INTER, width, std=width ** -0.5)
        w[f"{p}experts.{e}.{names[2]}.weight"] = randn(width, INTER, std=INTER ** -0.5)
    return w


def swiglu_shared(p):
    w = {f"{p}shared_experts.{n}.weight": randn(SHARED, D, std=D ** -0.5)
         for n in ("gate_proj", "up_proj")}
    w[f"{p}shared_experts.down_proj.weight"] = randn(D, SHARED, std=SHARED ** -0.5)
    return w


def swiglu_layer(x, w, p, names, idx, wt):
    """y = Σ_i w_i Expert_idx_i(x) + Shared(x), SwiGLU experts named `names` (gate, up, down)."""
    def expert(e, t):
        q = f"{p}experts.{e}."
        return swiglu_mlp(x[t:t + 1], *(w[q + n + ".weight"] for n in names))[0]

    shared = swiglu_mlp(x, *(w[f"{p}shared_experts.{n}.weight"]
                             for n in ("gate_proj", "up_proj", "down_proj")))
    return combine(idx, wt, expert) + shared


def router(p):
    return {p + "gate.weight": randn(E, D, std=D ** -0.5),
            p + "gate.e_score_correction_bias": randn(E, std=0.1)}


def deepseek_case(x):
    p, names = "model.layers.1.mlp.", ("gate_proj", "up_proj", "down_proj")
    w = {**router(p), **swiglu_experts(p, names, D), **swiglu_shared(p)}
    gate, bias = w[p + "gate.weight"], w[p + "gate.e_score_correction_bias"]
    idx = select_sigmoid(x, gate, bias, 2, 1)

    def forward(xg):
        s = torch.sigmoid(xg @ gate.t())
        return swiglu_layer(xg, w, p, names, idx, weights(s.gather(1, idx), 2.5))
    return w, idx, forward


def latent_case(x):
    p = "model.layers.3.mlp."
    w = {**router(p),
         p + "fc1_latent_proj.weight": randn(LATENT, D, std=D ** -0.5),
         p + "fc2_latent_proj.weight": randn(D, LATENT, std=LATENT ** -0.5)}
    for e in range(E):
        w[f"{p}experts.{e}.up_proj.weight"] = randn(INTER, LATENT, std=LATENT ** -0.5)
        w[f"{p}experts.{e}.down_proj.weight"] = randn(LATENT, INTER, std=INTER ** -0.5)
    w[f"{p}shared_experts.up_proj.weight"] = randn(SHARED, D, std=D ** -0.5)
    w[f"{p}shared_experts.down_proj.weight"] = randn(D, SHARED, std=SHARED ** -0.5)
    gate, bias = w[p + "gate.weight"], w[p + "gate.e_score_correction_bias"]
    idx = select_sigmoid(x, gate, bias, 2, 1)

    def forward(xg):
        wt = weights(torch.sigmoid(xg @ gate.t()).gather(1, idx), 2.5)
        z = xg @ w[p + "fc1_latent_proj.weight"].t()          # [T, ℓ]

        def expert(e, t):
            q = f"{p}experts.{e}."
            return relu2_mlp(z[t:t + 1], w[q + "up_proj.weight"], w[q + "down_proj.weight"])[0]

        y_lat = combine(idx, wt, expert)                      # [T, ℓ]
        shared = relu2_mlp(xg, w[p + "shared_experts.up_proj.weight"],
                           w[p + "shared_experts.down_proj.weight"])
        return y_lat @ w[p + "fc2_latent_proj.weight"].t() + shared
    return w, idx, forward


def kimi_case(x):
    p, names = "model.layers.1.block_sparse_moe.", ("w1", "w3", "w2")
    w = {**router(p), **swiglu_experts(p, names, D), **swiglu_shared(p)}
    gate, bias = w[p + "gate.weight"], w[p + "gate.e_score_correction_bias"]
    idx = select_sigmoid(x, gate, bias, 1, 1)

    def forward(xg):
        biased = torch.sigmoid(xg @ gate.t()) + bias           # HF Kimi: weights from s + b
        return swiglu_layer(xg, w, p, names, idx, weights(biased.gather(1, idx), 2.446, 1e-20))
    return w, idx, forward


def softmax_case(x):
    p, names = "model.layers.1.mlp.", ("gate_proj", "up_proj", "down_proj")
    w = {**router(p), **swiglu_experts(p, names, D), **swiglu_shared(p)}
    gate, bias = w[p + "gate.weight"], w[p + "gate.e_score_correction_bias"]
    idx = select_softmax(x, gate, bias)

    def forward(xg):
        prob = torch.softmax(xg @ gate.t(), dim=-1)
        return swiglu_layer(xg, w, p, names, idx, weights(prob.gather(1, idx), 2.5))
    return w, idx, forward


def write(f, group, tensors):
    for name, t in tensors.items():
        arr = t.detach().numpy()
        if arr.size > 64:
            f.create_dataset(f"{group}/{name}", data=arr, compression="gzip",
                             compression_opts=9, shuffle=True, track_times=False)
        else:
            f.create_dataset(f"{group}/{name}", data=arr, track_times=False)


def main():
    torch.set_num_threads(1)
    # No timestamps anywhere (root group, groups, datasets): the file is byte-reproducible.
    fcpl = h5py.h5p.create(h5py.h5p.FILE_CREATE)
    fcpl.set_obj_track_times(False)
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    fapl.set_libver_bounds(h5py.h5f.LIBVER_LATEST, h5py.h5f.LIBVER_LATEST)
    fid = h5py.h5f.create(b"tests/golden/moe_backward.h5", h5py.h5f.ACC_TRUNC, fcpl=fcpl,
                          fapl=fapl)
    with h5py.File(fid) as f:
        f.create_dataset("rtol", data=torch.tensor([1e-4]).numpy(), track_times=False)
        for group, case in (("deepseek", deepseek_case), ("latent", latent_case),
                            ("kimi", kimi_case), ("softmax", softmax_case)):
            gcpl = h5py.h5p.create(h5py.h5p.GROUP_CREATE)
            gcpl.set_obj_track_times(False)
            h5py.h5g.create(f.id, group.encode(), gcpl=gcpl)
            x, dy = randn(T, D), randn(T, D)
            w, idx, forward = case(x)
            xg = x.clone().requires_grad_(True)
            (forward(xg) * dy).sum().backward()
            write(f, group, w)
            write(f, group, {"x": x, "dy": dy, "idx": idx.to(torch.int64), "dx": xg.grad})


if __name__ == "__main__":
    main()
