#!/usr/bin/python3
"""Whole-model goldens for tests/unit/model/test_model_golden.cpp: writes
tests/golden/model_<preset>.h5 for the 4-layer presets tiny (native hymoe: KKKG / -EEE),
tiny-kimi (kimi_linear: KKKM, NoPE MLA without query latent, Kimi MoE names) and tiny-deepseek
(deepseek_v32: DDDD with YaRN, grouped routing); spec/model-math.md §1-7 and §13.

The forward is the decoder of model-math §1 in torch fp32 from the block references of
reference.py (the same functions the block goldens use): embedding → per layer
h += mixer(RMSNorm(h; input_layernorm)), h += ffn(RMSNorm(h; post_attention_layernorm)) → final
RMSNorm (model.norm) → lm_head. Two independent sequences of 13 and 24 tokens, packed: KDA
states start at zero and attention sees only its own sequence (positions from 0).
Weights are random at the block goldens' scales (projections N(0, fan_in^{-1/2}), norm weights
1 + 0.1·N, correction bias 0.1·N, KDA decay/gates as gen_kda.py, embedding N(0, 1)), rounded to
a subset of the bf16 grid (vectors bf16, matrices 5 mantissa bits; exact in fp32) so that
shuffle + gzip keeps each file under 600 kB (plain bf16 gives ~630 kB); every computation is
fp32. A seed is kept only when no decision can flip between torch and the C++ code: MoE selection
margins ≥ 1e-4 (groups, k-th vs (k+1)-th, order within the top-k) and DSA index scores with a
relative gap ≥ 1e-3 between the k-th and (k+1)-th visible key; otherwise the next seed is tried.

Datasets (all at the root, no timestamps: regeneration is byte-identical):
  <HF name>        every weight under the name model_tensors() gives it, with its HF shape
  weight_names     [n] those names (fixed-length strings)
  tokens           [n_tok] int64, the sequences packed;  offsets [n_seq + 1] int64
  logits           [n_tok, V] fp32
  config.keys / config.values   [m] the ModelConfig fields this script uses ("section.field"; bools
                   and enums as 0/1, kda.gate_lower_bound 0 = none) and config.model_type,
                   config.layer_pattern, config.ffn_pattern (strings); the C++ test checks them
                   against preset_config(<preset>)
Run from the repository root: /usr/bin/python3 tests/golden/gen_model.py
"""
import math
import os

import h5py
import numpy as np
import torch

from reference import (Attn, attn_weights, indexer_gap, kda_layer, kda_weights, mla_layer,
                       moe_swiglu, rms_norm, round_mantissa, route, softmax_scale, swiglu_mlp)

LENGTHS = (13, 24)
ROUTE_MARGIN = 1e-4  # absolute, on sigmoid scores
INDEX_GAP = 1e-3     # relative to the row's largest |score|
MAX_BYTES = 600_000
MATRIX_BITS = 5  # mantissa bits kept in matrices (bf16 has 7): ~15% smaller files
MAX_TRIES = 100

# The presets of src/model/config_presets.cpp, field by field (the C++ test compares them).
COMMON = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "rms_norm_eps": 1e-5,
          "tie_word_embeddings": 0}
KDA = {"kda.n_head": 4, "kda.head_dim": 16, "kda.conv_kernel": 4, "kda.gate_lower_bound": 0.0}
MLA = {"mla.n_head": 4, "mla.q_lora_rank": 32, "mla.kv_lora_rank": 32,
       "mla.qk_nope_head_dim": 16, "mla.qk_rope_head_dim": 8, "mla.v_head_dim": 16,
       "mla.nope": 0, "mla.rope_theta": 10000.0, "mla.rope_yarn": 0, "mla.softmax_scale_yarn": 0,
       "mla.norm_eps": 1e-6}
INDEXER = {"indexer.n_head": 16, "indexer.head_dim": 16, "indexer.top_k": 8}
MOE = {"moe.n_routed_experts": 8, "moe.top_k": 2, "moe.n_shared_experts": 1,
       "moe.moe_intermediate": 32, "moe.shared_intermediate": 32, "moe.n_group": 2,
       "moe.topk_group": 1, "moe.scoring_sigmoid": 1, "moe.renormalize": 1,
       "moe.routed_scaling_factor": 2.5, "moe.correction_bias": 1,
       "moe.weights_from_biased_scores": 0, "moe.capacity_factor": 0.0,
       "moe.expert_act_swiglu": 1}
YARN = {"mla.yarn_factor": 4.0, "mla.yarn_original_max_position": 64, "mla.yarn_beta_fast": 32.0,
        "mla.yarn_beta_slow": 1.0, "mla.yarn_mscale": 1.0, "mla.yarn_mscale_all_dim": 1.0}

PRESETS = {
    "tiny": ("hymoe", "KKKG", "-EEE", {**COMMON, **KDA, **MLA, **INDEXER, **MOE}),
    "tiny-kimi": ("kimi_linear", "KKKM", "-EEE",
                  {**COMMON, **KDA, **MLA, "mla.q_lora_rank": 0, "mla.nope": 1, **MOE,
                   "moe.n_group": 1, "moe.routed_scaling_factor": 2.446}),
    "tiny-deepseek": ("deepseek_v32", "DDDD", "-EEE",
                      {**COMMON, "rms_norm_eps": 1e-6, **MLA, "mla.rope_yarn": 1,
                       "mla.softmax_scale_yarn": 1, **YARN, **INDEXER, **MOE}),
}
SEEDS = {"tiny": 20261210, "tiny-kimi": 20261310, "tiny-deepseek": 20261410}


def on_grid(t):
    """Matrices (≥ 2 dims, > 64 values) to MATRIX_BITS mantissa bits, the rest to bf16."""
    return round_mantissa(t, MATRIX_BITS if t.dim() >= 2 and t.numel() > 64 else 7)


def attn_config(c, letter):
    """Attn of a layer letter: M mla, A gated mla, D dsa, G gated dsa."""
    yarn = None
    if c["mla.rope_yarn"]:
        assert c["mla.yarn_mscale"] == c["mla.yarn_mscale_all_dim"]  # cos/sin unscaled
        yarn = {"factor": c["mla.yarn_factor"], "original": c["mla.yarn_original_max_position"],
                "beta_fast": c["mla.yarn_beta_fast"], "beta_slow": c["mla.yarn_beta_slow"]}
    d_n, d_r = c["mla.qk_nope_head_dim"], c["mla.qk_rope_head_dim"]
    tau = (softmax_scale(d_n, d_r, c["mla.yarn_factor"], c["mla.yarn_mscale_all_dim"])
           if c["mla.softmax_scale_yarn"] else softmax_scale(d_n, d_r))
    dsa = letter in "DG"
    return Attn(n_head=c["mla.n_head"], q_lora_rank=c["mla.q_lora_rank"],
                kv_lora_rank=c["mla.kv_lora_rank"], d_nope=d_n, d_rope=d_r,
                d_v=c["mla.v_head_dim"], tau=tau, theta=c["mla.rope_theta"], yarn=yarn,
                norm_eps=c["mla.norm_eps"], nope=bool(c["mla.nope"]), gated=letter in "AG",
                index_heads=c["indexer.n_head"] if dsa else 0,
                index_dim=c["indexer.head_dim"] if dsa else 0,
                index_topk=c["indexer.top_k"] if dsa else 0)


def expert_names(model_type):
    """(gate, up, down) of a routed expert: Kimi's w1/w3/w2, else the HF MLP names."""
    return ("w1", "w3", "w2") if model_type == "kimi_linear" else ("gate_proj", "up_proj",
                                                                    "down_proj")


def ffn_prefix(model_type, i, ffn):
    moe = model_type == "kimi_linear" and ffn != "-"
    return f"model.layers.{i}." + ("block_sparse_moe." if moe else "mlp.")


def make_weights(gen, model_type, layers, ffns, c):
    """Every tensor by its full HF name, in model_tensors() order, rounded by on_grid."""
    d, V = c["hidden_size"], c["vocab_size"]

    def lin(out, inp):
        return torch.randn(out, inp, generator=gen) * inp ** -0.5

    def near_one(n):
        return 1.0 + 0.1 * torch.randn(n, generator=gen)

    w = {"model.embed_tokens.weight": torch.randn(V, d, generator=gen)}
    for i, (letter, ffn) in enumerate(zip(layers, ffns)):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = near_one(d)
        if letter == "K":
            mixer = kda_weights(gen, d, c["kda.n_head"], c["kda.head_dim"], c["kda.conv_kernel"])
        else:
            mixer = attn_weights(gen, d, attn_config(c, letter))
        w.update({p + "self_attn." + k: t for k, t in mixer.items()})
        w[p + "post_attention_layernorm.weight"] = near_one(d)
        q = ffn_prefix(model_type, i, ffn)
        if ffn == "-":
            inter = c["intermediate_size"]
            w[q + "gate_proj.weight"] = lin(inter, d)
            w[q + "up_proj.weight"] = lin(inter, d)
            w[q + "down_proj.weight"] = lin(d, inter)
            continue
        assert ffn == "E", f"ffn letter {ffn} not supported"
        E, inter = c["moe.n_routed_experts"], c["moe.moe_intermediate"]
        w[q + "gate.weight"] = lin(E, d)
        w[q + "gate.e_score_correction_bias"] = 0.1 * torch.randn(E, generator=gen)
        g, u, dn = expert_names(model_type)
        for e in range(E):
            w[f"{q}experts.{e}.{g}.weight"] = lin(inter, d)
            w[f"{q}experts.{e}.{u}.weight"] = lin(inter, d)
            w[f"{q}experts.{e}.{dn}.weight"] = lin(d, inter)
        shared = c["moe.shared_intermediate"]
        w[q + "shared_experts.gate_proj.weight"] = lin(shared, d)
        w[q + "shared_experts.up_proj.weight"] = lin(shared, d)
        w[q + "shared_experts.down_proj.weight"] = lin(d, shared)
    w["model.norm.weight"] = near_one(d)
    w["lm_head.weight"] = lin(V, d)
    return {name: on_grid(t) for name, t in w.items()}


def sub(w, prefix):
    return {k[len(prefix):]: t for k, t in w.items() if k.startswith(prefix)}


def forward(model_type, layers, ffns, c, w, tokens, offsets):
    """logits [n_tok, V] and the smallest routing margin / index-score gap seen."""
    eps = c["rms_norm_eps"]
    margin, gap = math.inf, math.inf
    h = w["model.embed_tokens.weight"][tokens]  # [n_tok, d]
    for i, (letter, ffn) in enumerate(zip(layers, ffns)):
        p = f"model.layers.{i}."
        xn = rms_norm(h, w[p + "input_layernorm.weight"], eps)
        mw = sub(w, p + "self_attn.")
        ys = []
        for s in range(len(offsets) - 1):  # each sequence alone, from position 0
            xs = xn[offsets[s]:offsets[s + 1]]
            if letter == "K":
                lb = c["kda.gate_lower_bound"] or None
                y, _ = kda_layer(mw, xs, c["kda.n_head"], c["kda.head_dim"], eps, lb)
            else:
                a = attn_config(c, letter)
                y, extra = mla_layer(mw, xs, a)
                if extra:
                    n = xs.shape[0]
                    causal = torch.full((n, n), float("-inf")).triu(1)
                    gap = min(gap, indexer_gap(extra["index_scores"] + causal, a.index_topk))
            ys.append(y)
        h = h + torch.cat(ys)
        xn = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
        q = ffn_prefix(model_type, i, ffn)
        if ffn == "-":
            y = swiglu_mlp(xn, *(w[q + n + ".weight"] for n in ("gate_proj", "up_proj",
                                                                  "down_proj")))
        else:
            idx, wt, m = route(xn, w[q + "gate.weight"], w[q + "gate.e_score_correction_bias"],
                               c["moe.top_k"], c["moe.n_group"], c["moe.topk_group"],
                               c["moe.routed_scaling_factor"],
                               1e-20 if model_type == "kimi_linear" else 0.0)
            margin = min(margin, m)
            names = expert_names(model_type)
            experts = [tuple(w[f"{q}experts.{e}.{n}.weight"] for n in names)
                       for e in range(c["moe.n_routed_experts"])]
            shared = tuple(w[f"{q}shared_experts.{n}.weight"]
                           for n in ("gate_proj", "up_proj", "down_proj"))
            y = moe_swiglu(xn, idx, wt, experts, shared)
        h = h + y
    logits = rms_norm(h, w["model.norm.weight"], eps) @ w["lm_head.weight"].T
    return logits, margin, gap


def strings(values):
    return np.array([v.encode() for v in values])


def write(path, preset, seed, w, tokens, offsets, logits):
    model_type, layers, ffns, c = PRESETS[preset]
    # No timestamps anywhere (root group, datasets): the file is byte-reproducible.
    fcpl = h5py.h5p.create(h5py.h5p.FILE_CREATE)
    fcpl.set_obj_track_times(False)
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    fapl.set_libver_bounds(h5py.h5f.LIBVER_LATEST, h5py.h5f.LIBVER_LATEST)
    fid = h5py.h5f.create(path.encode(), h5py.h5f.ACC_TRUNC, fcpl=fcpl, fapl=fapl)
    with h5py.File(fid) as f:
        f.attrs["generator"] = "tests/golden/gen_model.py"
        f.attrs["preset"] = preset
        f.attrs["seed"] = seed

        def put(name, arr):
            kw = dict(compression="gzip", compression_opts=9, shuffle=True) if arr.size > 64 else {}
            f.create_dataset(name, data=arr, track_times=False, **kw)

        for name, t in w.items():
            put(name, t.numpy())
        put("weight_names", strings(w.keys()))
        put("tokens", tokens.numpy())
        put("offsets", np.array(offsets, dtype=np.int64))
        put("logits", logits.numpy())
        put("config.keys", strings(c.keys()))
        put("config.values", np.array([float(v) for v in c.values()], dtype=np.float64))
        for key, value in (("model_type", model_type), ("layer_pattern", layers),
                           ("ffn_pattern", ffns)):
            f.create_dataset("config." + key, data=np.bytes_(value), track_times=False)


def generate(preset, out_dir):
    model_type, layers, ffns, c = PRESETS[preset]
    offsets = [0]
    for n in LENGTHS:
        offsets.append(offsets[-1] + n)
    for seed in range(SEEDS[preset], SEEDS[preset] + MAX_TRIES):
        gen = torch.Generator().manual_seed(seed)
        w = make_weights(gen, model_type, layers, ffns, c)
        tokens = torch.randint(0, c["vocab_size"], (offsets[-1],), generator=gen)
        logits, margin, gap = forward(model_type, layers, ffns, c, w, tokens, offsets)
        if margin >= ROUTE_MARGIN and gap >= INDEX_GAP:
            break
        print(f"{preset}: seed {seed} rejected (routing margin {margin:.3g}, "
              f"index gap {gap:.3g})")
    else:
        raise SystemExit(f"{preset}: no seed in {MAX_TRIES} tries without near-ties")
    path = os.path.join(out_dir, f"model_{preset}.h5")
    write(path, preset, seed, w, tokens, offsets, logits)
    size = os.path.getsize(path)
    print(f"wrote {path}: seed {seed}, {size} bytes, |logits| max {logits.abs().max():.3f}, "
          f"routing margin {margin:.3g}, index gap {gap:.3g}")
    assert size < MAX_BYTES, f"{path} is {size} bytes (limit {MAX_BYTES})"


def main():
    torch.set_num_threads(1)
    out_dir = os.path.dirname(os.path.abspath(__file__))
    for preset in PRESETS:
        generate(preset, out_dir)


if __name__ == "__main__":
    main()
