"""Torch fp32 references of the model blocks, written from spec/model-math.md (§1 RMSNorm, §3 KDA,
§4 MLA, §5 DSA indexer + top-k + output gate, §6 MoE routing and experts), shared by the golden
generators gen_kda.py, gen_attention.py, gen_moe.py and gen_model.py (imported as a module: the
generators run as /usr/bin/python3 tests/golden/gen_*.py, so this folder is on sys.path).

Every function takes its sizes as arguments (no module constants) and works on one sequence at
positions 0..n-1 (the callers reset KDA states and attention per sequence). Operation order is
part of the contract: the block goldens (kda.h5, attention.h5, moe.h5) regenerate byte for byte
through these functions, so change the arithmetic only together with those files.
"""
import dataclasses
import math
from typing import Optional

import torch
import torch.nn.functional as F


def rms_norm(x, w, eps):
    """w ⊙ x·(mean(x²) + ε)^{-1/2} over the last dim (model-math §1)."""
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def round_mantissa(x, bits):
    """x rounded to the nearest fp32 value with `bits` explicit mantissa bits (ties to even):
    bits = 7 is the bf16 grid; fewer bits give a subset of it (smaller gzip-ed golden files)."""
    shift = 23 - bits
    b = x.contiguous().view(torch.int32)
    b = (b + ((1 << (shift - 1)) - 1) + ((b >> shift) & 1)) & ~((1 << shift) - 1)
    return b.view(torch.float32)


def bf16_randn(gen, *shape, std=1.0):
    """N(0, std²) rounded to the bf16 grid (exact in fp32): small gzip-ed golden files."""
    x = torch.randn(*shape, generator=gen, dtype=torch.float32) * std
    return x.to(torch.bfloat16).to(torch.float32)


# ---- KDA (§3) ------------------------------------------------------------------------------------

def kda_weights(gen, d, n_head, head_dim, conv):
    """One KDA layer's tensors, names relative to "self_attn.". Projections N(0, fan_in^{-1/2});
    conv and the up-projections of the low-rank gates at std 0.5 so that decays reach ~-2 per
    step and the output gate moves away from 0.5; A_log and dt_bias by the fla init."""
    K, D = head_dim, n_head * head_dim

    def normal(*shape, std):
        return torch.randn(*shape, generator=gen) * std

    def uniform(*shape, lo, hi):
        return lo + (hi - lo) * torch.rand(*shape, generator=gen)

    dt = torch.exp(uniform(D, lo=math.log(1e-3), hi=math.log(1e-1))).clamp(min=1e-4)
    return {
        "q_proj.weight": normal(D, d, std=d**-0.5),
        "k_proj.weight": normal(D, d, std=d**-0.5),
        "v_proj.weight": normal(D, d, std=d**-0.5),
        "q_conv1d.weight": normal(D, 1, conv, std=0.5),
        "k_conv1d.weight": normal(D, 1, conv, std=0.5),
        "v_conv1d.weight": normal(D, 1, conv, std=0.5),
        "f_a_proj.weight": normal(K, d, std=d**-0.5),
        "f_b_proj.weight": normal(D, K, std=0.5),
        "dt_bias": dt + torch.log(-torch.expm1(-dt)),  # inverse softplus (fla init)
        "A_log": torch.log(uniform(1, 1, n_head, 1, lo=1.0, hi=16.0)),
        "b_proj.weight": normal(n_head, d, std=d**-0.5),
        "g_a_proj.weight": normal(K, d, std=d**-0.5),
        "g_b_proj.weight": normal(D, K, std=0.5),
        "o_norm.weight": 1.0 + normal(K, std=0.2),
        "o_proj.weight": normal(d, D, std=D**-0.5),
    }


def causal_conv_silu(u, w):
    """SiLU(c), c_t[ch] = Σ_i w[ch, 0, i]·u_{t-W+1+i}[ch], u_{<0} = 0. u [T, D], w [D, 1, W]."""
    n, width = u.shape[0], w.shape[-1]
    padded = torch.cat([torch.zeros(width - 1, u.shape[1]), u])
    c = sum(w[:, 0, i] * padded[i : i + n] for i in range(width))
    return F.silu(c)


def l2norm(x):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def kda_layer(w, x, n_head, head_dim, eps, lower_bound=None):
    """One sequence x [T, d] (input-normed) from a zero state -> (y [T, d], S [H, K, V]), the
    naive per-token recurrence. lower_bound: fla's safe gate g = lb·σ(e^{A_log}(f + dt_bias))."""
    n, H, K = x.shape[0], n_head, head_dim
    D = H * K
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
    o = o * torch.rsqrt((o * o).mean(-1, keepdim=True) + eps) * w["o_norm.weight"]
    o = o * torch.sigmoid(gate.view(n, H, K))
    return o.reshape(n, D) @ w["o_proj.weight"].T, S


# ---- MLA / DSA (§4-5) ----------------------------------------------------------------------------

@dataclasses.dataclass
class Attn:
    """Sizes and rules of one MLA/DSA layer (MlaConfig + IndexerConfig + the layer's letter)."""
    n_head: int
    q_lora_rank: int  # 0: full-rank q_proj (Kimi-Linear)
    kv_lora_rank: int
    d_nope: int
    d_rope: int
    d_v: int
    tau: float  # softmax scale, see softmax_scale()
    theta: float = 10000.0
    yarn: Optional[dict] = None  # factor, original, beta_fast, beta_slow (mscale ratio 1)
    norm_eps: float = 1e-6  # q_a_layernorm / kv_a_layernorm
    nope: bool = False  # no RoPE on q_r / k_r (the indexer keeps its RoPE)
    gated: bool = False  # o ⊙ σ(g_proj x) before o_proj
    index_heads: int = 0  # > 0: DSA (indexer + top-k mask)
    index_dim: int = 0
    index_topk: int = 0


def softmax_scale(d_nope, d_rope, yarn_factor=None, mscale_all_dim=1.0):
    """τ = (d_n + d_r)^{-1/2}, × m² with m = 0.1·mscale_all_dim·ln(factor) + 1 under YaRN."""
    tau = (d_nope + d_rope) ** -0.5
    if yarn_factor is None:
        return tau
    m = 0.1 * mscale_all_dim * math.log(yarn_factor) + 1.0
    return tau * m * m


def attn_weights(gen, d, a):
    """HF-named tensors of one MLA/DSA layer (relative to "self_attn."); projections
    N(0, fan_in^{-1/2}) so activations stay O(1), norm weights 1 + 0.1·N, k_norm bias 0.1·N."""
    def lin(out, inp):
        return torch.randn(out, inp, generator=gen) / math.sqrt(inp)

    def near_one(n):
        return 1.0 + 0.1 * torch.randn(n, generator=gen)

    d_qk = a.d_nope + a.d_rope
    w = {}
    if a.q_lora_rank > 0:
        w["q_a_proj.weight"] = lin(a.q_lora_rank, d)
        w["q_a_layernorm.weight"] = near_one(a.q_lora_rank)
        w["q_b_proj.weight"] = lin(a.n_head * d_qk, a.q_lora_rank)
    else:
        w["q_proj.weight"] = lin(a.n_head * d_qk, d)
    w["kv_a_proj_with_mqa.weight"] = lin(a.kv_lora_rank + a.d_rope, d)
    w["kv_a_layernorm.weight"] = near_one(a.kv_lora_rank)
    w["kv_b_proj.weight"] = lin(a.n_head * (a.d_nope + a.d_v), a.kv_lora_rank)
    w["o_proj.weight"] = lin(d, a.n_head * a.d_v)
    if a.gated:
        w["g_proj.weight"] = lin(a.n_head * a.d_v, d)
    if a.index_heads > 0:
        w["indexer.wq_b.weight"] = lin(a.index_heads * a.index_dim, a.q_lora_rank)
        w["indexer.wk.weight"] = lin(a.index_dim, d)
        w["indexer.k_norm.weight"] = near_one(a.index_dim)
        w["indexer.k_norm.bias"] = 0.1 * torch.randn(a.index_dim, generator=gen)
        w["indexer.weights_proj.weight"] = lin(a.index_heads, d)
    return w


def rope_theta(dim, base, yarn):
    """θ_i = base^{-2i/dim}; YaRN: θ'_i = θ_i/factor·(1−smooth) + θ_i·smooth (spec §4)."""
    theta = torch.tensor([base ** (-2.0 * i / dim) for i in range(dim // 2)], dtype=torch.float64)
    if yarn is None:
        return theta.float()

    def corr_dim(rot):
        return dim * math.log(yarn["original"] / (rot * 2 * math.pi)) / (2 * math.log(base))

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


def indexer_scores(w, x, c_q, pos, theta, a):
    """I(t, s) = Σ_j w_t,j·H_I^{-1/2}·d_I^{-1/2}·ReLU(q^I_t,j·k^I_s), unmasked [T, T]."""
    n, h_i, d_i, d_r = x.shape[0], a.index_heads, a.index_dim, a.d_rope
    q = (c_q @ w["indexer.wq_b.weight"].T).view(n, h_i, d_i)
    q = torch.cat([rope_half(q[..., :d_r], pos, theta), q[..., d_r:]], dim=-1)  # rope first
    k = F.layer_norm(x @ w["indexer.wk.weight"].T, (d_i,),
                     w["indexer.k_norm.weight"], w["indexer.k_norm.bias"], 1e-6)
    k = torch.cat([rope_half(k[..., :d_r], pos, theta), k[..., d_r:]], dim=-1)
    hw = (x @ w["indexer.weights_proj.weight"].T) * h_i ** -0.5 * d_i ** -0.5  # [T, H_I]
    logits = torch.einsum("tjd,sd->tjs", q, k).relu()
    return torch.einsum("tj,tjs->ts", hw, logits)


def indexer_gap(scores, top_k):
    """Smallest (k-th − (k+1)-th largest visible score) / max|visible score| over the queries
    that see more than k keys; inf when none does. scores [T, T] causally masked (−inf)."""
    gap = math.inf
    for t in range(top_k, scores.shape[0]):
        row = scores[t, : t + 1].sort(descending=True).values
        gap = min(gap, (row[top_k - 1] - row[top_k]).item() / row.abs().max().item())
    return gap


def mla_layer(w, x, a, top_k=True):
    """y [T, d] of one sequence x [T, d] (input-normed) at positions 0..T-1, dense MHA form with
    explicit masks (DS32 prefill). DSA (a.index_heads > 0 and top_k): top-k of the causally
    masked index scores, then the causal mask re-added. Returns (y, extra): extra holds
    "index_scores" [T, T] (unmasked) and "selected" [T, T] int8 for DSA, else nothing."""
    n, H, d_n, d_r, r_kv = x.shape[0], a.n_head, a.d_nope, a.d_rope, a.kv_lora_rank
    pos = torch.arange(n)
    theta = rope_theta(d_r, a.theta, a.yarn)
    if a.q_lora_rank > 0:
        c_q = rms_norm(x @ w["q_a_proj.weight"].T, w["q_a_layernorm.weight"], a.norm_eps)
        q = (c_q @ w["q_b_proj.weight"].T).view(n, H, d_n + d_r)
    else:
        c_q = None
        q = (x @ w["q_proj.weight"].T).view(n, H, d_n + d_r)
    kv = x @ w["kv_a_proj_with_mqa.weight"].T
    c_kv = rms_norm(kv[:, :r_kv], w["kv_a_layernorm.weight"], a.norm_eps)
    if a.nope:
        q_n, q_r, k_r = q[..., :d_n], q[..., d_n:], kv[:, r_kv:]
    else:
        q_n, q_r = q[..., :d_n], rope_interleaved(q[..., d_n:], pos, theta)
        k_r = rope_interleaved(kv[:, r_kv:], pos, theta)  # [T, d_r], shared by the heads
    kvb = (c_kv @ w["kv_b_proj.weight"].T).view(n, H, d_n + a.d_v)
    k_n, v = kvb[..., :d_n], kvb[..., d_n:]
    s = (torch.einsum("thd,uhd->htu", q_n, k_n) + torch.einsum("thd,ud->htu", q_r, k_r)) * a.tau
    causal = torch.full((n, n), float("-inf")).triu(1)
    mask = causal
    extra = {}
    if a.index_heads > 0 and top_k:  # DS32: top-k over the causally masked scores
        scores = indexer_scores(w, x, c_q, pos, theta, a)
        idx = (scores + causal).topk(min(a.index_topk, n), dim=-1).indices
        mask = torch.full((n, n), float("-inf")).scatter_(1, idx, 0.0) + causal
        extra = {"index_scores": scores, "selected": (mask == 0).to(torch.int8)}
    p = torch.softmax(s + mask, dim=-1)
    o = torch.einsum("htu,uhd->thd", p, v).reshape(n, H * a.d_v)
    if a.gated:
        o = o * torch.sigmoid(x @ w["g_proj.weight"].T)
    return o @ w["o_proj.weight"].T, extra


# ---- MoE (§6-7) ----------------------------------------------------------------------------------

def route(x, gate_w, bias, top_k, n_group, topk_group, rho, renorm_eps=0.0):
    """DS32 Gate (noaux_tc, sigmoid): s = σ(x Wᵍᵀ), selection on s + b (group-limited when
    n_group > 1: group score = sum of its top-2, other groups −inf), weights from the unbiased s,
    renormalised (Kimi: Σ + 1e-20) and × ρ. Returns idx [T, k] (best first), weights [T, k] and
    the smallest selection margin: of the kept groups over the rest, of the k-th expert over the
    (k+1)-th and between consecutive chosen experts (near-ties could flip between fp32 codes)."""
    n, n_exp = x.shape[0], gate_w.shape[0]
    s = torch.sigmoid(x @ gate_w.t())                        # [T, E]
    sb = s + bias                                             # selection only
    groups = sb.view(n, n_group, n_exp // n_group)
    margin = math.inf
    if n_group > 1:
        top2 = groups.topk(2, dim=-1)[0]                      # [T, G, 2]
        group_score = top2.sum(dim=-1)                        # [T, G]
        gs_sorted = group_score.sort(dim=-1, descending=True)[0]
        margin = (gs_sorted[:, topk_group - 1] - gs_sorted[:, topk_group]).min().item()
        keep = group_score.topk(topk_group, dim=-1)[1]        # [T, topk_group]
        mask = torch.ones(n, n_group, dtype=torch.bool).scatter_(1, keep, False)
        choice = groups.masked_fill(mask.unsqueeze(-1), float("-inf")).reshape(n, n_exp)
    else:
        choice = sb
    c_sorted = choice.sort(dim=-1, descending=True)[0]
    margin = min(margin, (c_sorted[:, top_k - 1] - c_sorted[:, top_k]).min().item())
    if top_k > 1:  # within-top-k order (best first)
        margin = min(margin, (c_sorted[:, :top_k - 1] - c_sorted[:, 1:top_k]).min().item())
    idx = choice.topk(top_k, dim=-1)[1]                       # [T, k] best first
    w = s.gather(1, idx)                                      # unbiased scores
    if renorm_eps == 0.0:
        w = w / w.sum(dim=-1, keepdim=True)
    else:
        w = w / (w.sum(dim=-1, keepdim=True) + renorm_eps)
    return idx, w * rho, margin


def swiglu_mlp(x, gate, up, down):
    return (F.silu(x @ gate.t()) * (x @ up.t())) @ down.t()


def relu2_mlp(x, up, down):
    return torch.relu(x @ up.t()).square() @ down.t()


def combine(idx, w, expert_out):
    """y_t = Σ_i w_i · Expert_idx_i(z_t) in slot order; expert_out(e, t) -> one output row."""
    y = None
    for i in range(idx.shape[1]):
        out = torch.stack([expert_out(int(idx[t, i]), t) for t in range(idx.shape[0])])
        term = w[:, i:i + 1] * out
        y = term if y is None else y + term
    return y


def moe_swiglu(x, idx, wt, experts, shared):
    """y = Σ_i w_i·Expert_idx_i(x) + Shared(x) for routed (idx, wt); experts[e] and shared are
    (gate, up, down) matrices; each expert runs on one token row at a time."""
    def expert(e, t):
        return swiglu_mlp(x[t:t + 1], *experts[e])[0]

    return combine(idx, wt, expert) + swiglu_mlp(x, *shared)
