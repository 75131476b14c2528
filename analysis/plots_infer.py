"""Plots of an infer job's profile.h5 and log: per-layer latency stacked by phase with the min and
max over ranks, layer time per rank, expert load heatmaps, MoE communication, the roofline of each
layer class against the measured peaks, memory per rank, the requests of results.h5 (lengths,
finish reasons, log-probabilities), and throughput and KV pages over time
(from the log's progress lines; the HDF5 outputs hold no time series). Each function takes an
h5read.Run and returns a Figure, or (Figure, note); it raises Missing when the data is absent."""
import matplotlib.pyplot as plt
import numpy as np

from h5read import Missing

ATTENTION = ("mla", "dsa")
MOE = ("moe", "latent_moe")
PHASES = ("KDA", "attention (MLA/DSA, indexer incl.)", "dense FFN", "MoE route + experts",
          "MoE dispatch", "MoE combine")  # layer_phases' labels; a phase keeps its colour
COLOURS = {k: f"C{i}" for i, k in enumerate(PHASES)}


def _optional(run, path, default):
    return run.get("profile", path) if run.has("profile", path) else default


def _rank_spread(values):
    """[W, n] per-rank values -> (min, max) over the ranks where the value is > 0 (the ranks that
    ran it; a pipeline stage's ranks own only its layers); NaN where no rank did."""
    v = np.where(values > 0, values, np.nan)
    ran = ~np.all(np.isnan(v), axis=0)
    lo, hi = np.full(v.shape[1], np.nan), np.full(v.shape[1], np.nan)
    lo[ran], hi[ran] = np.nanmin(v[:, ran], axis=0), np.nanmax(v[:, ran], axis=0)
    return lo, hi


def _whiskers(ax, x, top, lo, hi):
    ok = ~np.isnan(lo)
    if ok.any():
        err = np.vstack([np.clip(top - lo, 0, None), np.clip(hi - top, 0, None)])[:, ok]
        ax.errorbar(np.asarray(x)[ok], top[ok], yerr=err, fmt="none", ecolor="k", capsize=4,
                    label="min / max over ranks")


def layer_phases(run):
    """[(label, seconds [L])] per layer: the mixer by kind, the FFN's compute and the MoE
    dispatch and combine (inside the FFN's time), all phases that are nonzero somewhere."""
    mixer = run.get("profile", "/layers/mixer")
    ffn = run.get("profile", "/layers/ffn")
    mixer_s = run.get("profile", "/layers/mixer_seconds").astype(float)
    ffn_s = run.get("profile", "/layers/ffn_seconds").astype(float)
    zero = np.zeros(len(mixer))
    disp = _optional(run, "/experts/dispatch_seconds", zero).astype(float)
    comb = _optional(run, "/experts/combine_seconds", zero).astype(float)
    compute = np.clip(ffn_s - disp - comb, 0, None)
    is_att = np.isin(mixer, ATTENTION)
    is_moe = np.isin(ffn, MOE)
    values = [np.where(mixer == "kda", mixer_s, 0), np.where(is_att, mixer_s, 0),
              np.where(is_moe, 0, compute), np.where(is_moe, compute, 0), disp, comb]
    return [(k, v) for k, v in zip(PHASES, values) if np.any(v > 0)]


def layer_latency(run):
    mixer = run.get("profile", "/layers/mixer")
    ffn = run.get("profile", "/layers/ffn")
    phases = layer_phases(run)
    L = len(mixer)
    x = np.arange(L)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12.5, 4.2), gridspec_kw={"width_ratios": [3, 1.6]})
    bottom = np.zeros(L)
    for label, v in phases:
        ax.bar(x, v, bottom=bottom, label=label, color=COLOURS[label])
        bottom += v
    notes = ["the MoE route is timed with the experts (no separate route timer)"]
    if run.has("profile", "/ranks/layer_seconds"):
        r = run.get("profile", "/ranks/layer_seconds").astype(float)  # [W, 4, L]
        lo, hi = _rank_spread(r[:, 0, :] + r[:, 1, :])
        _whiskers(ax, x, bottom, lo, hi)
    else:
        notes.append("no /ranks/layer_seconds: bars are the mean over ranks, without min/max")
    ax.set_xticks(x, [f"{i}\n{m}\n{f}" for i, (m, f) in enumerate(zip(mixer, ffn))])
    ax.set_ylabel("seconds (all forward steps)")
    ax.set_title("per-layer time by phase (mean over the stage's ranks)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0, -0.2), ncol=4)
    # the phases outside the layers, and the attention layers' indexer share
    names = ["embedding + head", "DSA indexer", "attention rest", "pipeline wait"]
    paths = ["/head_seconds", "/attention/indexer_seconds", "/attention/other_seconds",
             "/pipeline_seconds"]
    mean = np.array([float(_optional(run, p, np.zeros(1))[0]) for p in paths])
    ax2.bar(np.arange(4), mean, color=["C7", "C8", "C1", "C9"])
    if run.has("profile", "/ranks/seconds"):
        lo, hi = _rank_spread(run.get("profile", "/ranks/seconds").astype(float))
        _whiskers(ax2, np.arange(4), mean, lo, hi)
    ax2.set_xticks(np.arange(4), [n.replace(" ", "\n", 1) for n in names])
    ax2.set_title("outside the layers; attention split")
    fig.tight_layout()
    return fig, "; ".join(notes)


def rank_layer_time(run):
    r = run.get("profile", "/ranks/layer_seconds").astype(float)  # [W, 4, L]
    t = r[:, 0, :] + r[:, 1, :]
    fig, ax = plt.subplots(figsize=(1.2 + 0.6 * t.shape[1], 1.2 + 0.45 * t.shape[0]))
    im = ax.imshow(t, aspect="auto", cmap="viridis")
    ax.set_xlabel("layer")
    ax.set_ylabel("rank")
    ax.set_xticks(range(t.shape[1]))
    ax.set_yticks(range(t.shape[0]))
    fig.colorbar(im, ax=ax, label="mixer + FFN seconds (0: another stage's layer)")
    ax.set_title("layer time per rank")
    return fig


def _moe_rows(run, table):
    rows = np.nonzero(table.sum(axis=1) > 0)[0]
    if rows.size == 0:
        raise Missing("no MoE layer computed any assignment")
    return rows


def _share_map(ax, fig, table, rows, xlabel, title):
    share = table[rows] / table[rows].sum(axis=1, keepdims=True)
    im = ax.imshow(share, aspect="auto", cmap="magma", vmin=0)
    ax.set_yticks(range(len(rows)), [f"layer {i}" for i in rows])
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    fig.colorbar(im, ax=ax, label="share of the layer's assignments")


def expert_load(run):
    tpe = run.get("profile", "/experts/tokens_per_expert").astype(float)  # [L, E]
    rows = _moe_rows(run, tpe)
    has_rank = run.has("profile", "/experts/tokens_per_rank")
    fig, axes = plt.subplots(1, 2 if has_rank else 1, squeeze=False,
                             figsize=(12 if has_rank else 7, 1.5 + 0.5 * len(rows)))
    _share_map(axes[0, 0], fig, tpe, rows, "routed expert", "assignments per expert")
    if has_rank:
        tpr = run.get("profile", "/experts/tokens_per_rank").astype(float)  # [L, W]
        imb = _optional(run, "/experts/imbalance", np.zeros(tpe.shape[0]))
        _share_map(axes[0, 1], fig, tpr, rows, "rank", "assignments per rank")
        axes[0, 1].set_yticks(range(len(rows)), [f"layer {i} (imb {imb[i]:.2f})" for i in rows])
        axes[0, 1].set_xticks(range(tpr.shape[1]))
    fig.tight_layout()
    return fig


def moe_comm(run):
    disp = run.get("profile", "/experts/dispatch_seconds").astype(float)
    comb = run.get("profile", "/experts/combine_seconds").astype(float)
    remote = run.get("profile", "/experts/remote_bytes").astype(float)
    ffn = run.get("profile", "/layers/ffn")
    rows = np.nonzero(np.isin(ffn, MOE))[0]
    if rows.size == 0:
        raise Missing("the model has no MoE layer")
    x = np.arange(len(rows))
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    ax.bar(x, disp[rows], label="dispatch")
    ax.bar(x, comb[rows], bottom=disp[rows], label="combine")
    if run.has("profile", "/ranks/layer_seconds"):
        r = run.get("profile", "/ranks/layer_seconds").astype(float)
        lo, hi = _rank_spread(r[:, 2, rows] + r[:, 3, rows])
        _whiskers(ax, x, disp[rows] + comb[rows], lo, hi)
    ax.set_xticks(x, [f"layer {i}" for i in rows])
    ax.set_ylabel("seconds (mean over the stage's ranks)")
    ax.set_title("MoE communication time")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0, -0.1), ncol=3)
    ax2.bar(x, remote[rows] / 1e6, color="C2")
    ax2.set_xticks(x, [f"layer {i}" for i in rows])
    ax2.set_ylabel("MB sent to other ranks (all ranks)")
    ax2.set_title("MoE dispatch + combine bytes")
    fig.tight_layout()
    notes = ["profile.h5 times no other phase apart: the tp all-reduce counts in the mixer and "
             "FFN times, and the pp send only as the next stage's pipeline wait"]
    if not (remote.any() or disp.any()):
        notes.append("no dispatch or combine between ranks (tp·ep = 1)")
    return fig, "; ".join(notes)


def roofline(run):
    gflops = run.get("profile", "/layers/gflops").astype(float)
    gb_s = run.get("profile", "/layers/weight_gb_s").astype(float)
    peak_gflops, read_gb_s = run.get("profile", "/peaks").astype(float)[:2]
    mixer = run.get("profile", "/layers/mixer")
    ffn = run.get("profile", "/layers/ffn")
    ok = (gflops > 0) & (gb_s > 0)
    if not ok.any():
        raise Missing("no layer has GEMM FLOP/s and weight GB/s")
    ai = np.where(ok, gflops / np.where(gb_s > 0, gb_s, 1), np.nan)  # FLOP per weight byte
    ridge = peak_gflops / read_gb_s
    xs = np.geomspace(min(np.nanmin(ai), ridge) / 4, max(np.nanmax(ai), ridge) * 4, 200)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.loglog(xs, np.minimum(peak_gflops, xs * read_gb_s), "k-",
              label=f"roof: sgemm {peak_gflops:.0f} GFLOP/s, read {read_gb_s:.1f} GB/s")
    classes = sorted({f"{m} + {f}" for m, f in zip(mixer, ffn)})
    for k, cls in enumerate(classes):
        sel = ok & np.array([f"{m} + {f}" == cls for m, f in zip(mixer, ffn)])
        ax.scatter(ai[sel], gflops[sel], marker="os^vD<>"[k % 7], s=50, label=cls, zorder=3)
        for i in np.nonzero(sel)[0]:
            ax.annotate(str(i), (ai[i], gflops[i]), textcoords="offset points", xytext=(4, 4))
    ax.set_xlabel("GEMM FLOPs per weight byte")
    ax.set_ylabel("GFLOP/s")
    ax.set_title("roofline by layer class (mixer + FFN; labels: layer)")
    ax.legend(fontsize=8)
    return fig, ("MoE layers' weight bytes count every expert (an upper bound: untouched experts "
                 "are not read)")


def memory_ranks(run):
    m = run.get("profile", "/memory/ranks").astype(float) / 1e6  # [W, 9]
    cols = run.attr("profile", "/memory/ranks", "columns").split()
    want = ["weights", "kv_pages", "allocated", "resident", "planned_total"]
    if not all(c in cols for c in want):
        raise Missing("/memory/ranks lacks the columns " + " ".join(want))
    x = np.arange(m.shape[0])
    w = 0.8 / len(want)
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * m.shape[0]), 3.8))
    for k, c in enumerate(want):
        ax.bar(x + (k - 2) * w, m[:, cols.index(c)], width=w, label=c)
    ax.set_xticks(x, [f"rank {r}" for r in x])
    ax.set_ylabel("MB")
    ax.set_title("memory per rank against its plan")
    ax.legend(fontsize=8)
    return fig


def progress(run):
    try:
        p = run.progress()
    except Missing as e:
        raise Missing(f"{e}; the HDF5 outputs record no throughput or KV-page time series") from e
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
    ax.plot(p["seconds"], p["prompt_tok_s"], "o-", label="prompt tokens/s")
    ax.plot(p["seconds"], p["gen_tok_s"], "o-", label="generated tokens/s")
    ax.set_xlabel("seconds")
    ax.set_title("throughput (average since the start)")
    ax.legend(fontsize=8)
    ax2.plot(p["seconds"], p["pages"], "o-", color="C2", label="KV pages in use")
    ax2.set_xlabel("seconds")
    ax2.set_ylabel("pages", color="C2")
    twin = ax2.twinx()
    twin.plot(p["seconds"], p["running"], "s--", color="C3", label="running sequences")
    twin.set_ylabel("running sequences", color="C3")
    ax2.set_title(f"KV pages in use (of {int(p['pages_total'][-1])}) and running sequences")
    fig.tight_layout()
    return fig, "from out/log's progress lines (rank 0's replica, every 5 s)"


def requests(run):
    prompt = run.get("results", "/requests/prompt_len")
    out = run.get("results", "/requests/output_offsets")
    lp = run.get("results", "/requests/output_logprobs").astype(float)
    finish = run.get("results", "/requests/finish_reason")
    n_out = np.diff(out)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 3.6))
    for reason in sorted(set(finish)):
        sel = finish == reason
        ax.scatter(prompt[sel], n_out[sel], s=12, alpha=0.6, label=f"{reason} ({sel.sum()})")
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("generated tokens")
    ax.set_title(f"{len(prompt)} requests by finish reason")
    ax.legend(fontsize=8)
    if lp.size:
        ax2.hist(lp, bins=50, color="C2")
    ax2.set_xlabel("log-probability of each generated token")
    ax2.set_title(f"{lp.size} generated tokens")
    fig.tight_layout()
    return fig
