#!/usr/bin/python3
"""compare.py RUN_A RUN_B [--out DIR]: two runs side by side, e.g. hymoe against another layout,
backend or build (the precision-alignment check). RUN_A and RUN_B are out/ folders (or job
folders). Infer runs: output agreement (token match rate per request and overall, first
divergence, log-probability differences over the matching prefixes; agreement.py) and per-layer
timings; lora runs: loss curves. Writes PNGs and index.html into DIR (default RUN_A/compare) and a
short summary on stdout. Exit 0; 1 if a plot failed for another reason than missing data; 2 if a
run has no HDF5 output."""
import argparse
import html
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import matplotlib.pyplot as plt  # noqa: E402  (page.py selects the Agg backend first)
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

import agreement  # noqa: E402
from h5read import Missing, Run  # noqa: E402
from page import Page, table  # noqa: E402
from plots_infer import COLOURS, layer_phases  # noqa: E402


def agreement_plot(res):
    rows = res["rows"]
    if not rows:
        raise Missing("no request id is in both runs")
    rate = np.array([r["rate"] for r in rows])
    div = np.array([r["first_divergence"] for r in rows])
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 3.6))
    ax.plot(np.arange(len(rows)), rate, ".", ms=4)
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("request (file order of A)")
    ax.set_ylabel("token match rate")
    ax.set_title(f"overall {res['rate']:.4f} ({res['matches']} of {res['tokens']} tokens)")
    if (div >= 0).any():
        ax2.hist(div[div >= 0], bins=np.arange(div.max() + 2) - 0.5, color="C3")
        ax2.set_xlabel("first divergent output position")
        ax2.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax2.set_ylabel("requests")
    else:
        ax2.text(0.5, 0.5, f"all {len(rows)} requests identical", ha="center", va="center",
                 transform=ax2.transAxes)
        ax2.set_xticks([])
        ax2.set_yticks([])
    ax2.set_title(f"first divergence ({len(rows) - res['identical']} of {len(rows)} diverge)")
    fig.tight_layout()
    return fig


def logprob_plot(res):
    d, pos = res["lp_diffs"], res["lp_positions"]
    if d.size == 0:
        raise Missing("no matching output prefix to compare log-probabilities over")
    prompt = res["prompt_diffs"]
    fig, axes = plt.subplots(1, 2 if prompt is not None else 1, figsize=(11, 3.6), squeeze=False)
    ax = axes[0, 0]
    floor = 1e-9  # exact agreement drawn at the floor of the log axis
    ax.semilogy(pos, np.maximum(d, floor), ".", ms=3, alpha=0.5)
    ax.set_xlabel("output position (matching prefix)")
    ax.set_ylabel("|logprob A − logprob B|")
    ax.set_title(f"output tokens: max {d.max():.3g}, mean {d.mean():.3g}")
    if prompt is not None:
        ax2 = axes[0, 1]
        ax2.hist(np.log10(np.maximum(prompt, floor)), bins=40, color="C2")
        ax2.set_xlabel("log10 |Δ prompt logprob| (teacher-forced)")
        ax2.set_title(f"prompt tokens: max {prompt.max():.3g}, mean {prompt.mean():.3g}")
    fig.tight_layout()
    return fig, f"exact agreement (0) is drawn at {floor:g}"


def layers_plot(a, b):
    pa, pb = layer_phases(a), layer_phases(b)
    L = len(a.get("profile", "/layers/mixer"))
    if len(b.get("profile", "/layers/mixer")) != L:
        raise Missing("the runs have different numbers of layers")
    x = np.arange(L)
    fig, ax = plt.subplots(figsize=(10, 4))
    labelled = set()
    for phases, dx, hatch in ((pa, -0.2, ""), (pb, 0.2, "//")):
        bottom = np.zeros(L)
        for k, v in phases:
            ax.bar(x + dx, v, width=0.38, bottom=bottom, color=COLOURS[k], hatch=hatch,
                   edgecolor="w", label=None if k in labelled else k)
            labelled.add(k)
            bottom += v
    ax.set_xticks(x, [f"{i}\nA | B" for i in range(L)])
    ax.set_ylabel("seconds (all forward steps)")
    ax.set_title("per-layer time by phase: A (plain) vs B (hatched)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1, 1))
    fig.tight_layout()
    return fig


def loss_plot(a, b):
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
    for run, name, style in ((a, "A", "-"), (b, "B", "--")):
        ax.plot(run.get("results", "/train/step"), run.get("results", "/train/loss"), style,
                label=f"{name} train")
        for ev in ("domain_loss", "general_loss"):
            if run.has("results", "/eval/" + ev):
                v = run.get("results", "/eval/" + ev).astype(float)
                ok = ~np.isnan(v)
                ax2.plot(run.get("results", "/eval/step")[ok], v[ok], "o" + style,
                         label=f"{name} {ev.replace('_', ' ')}")
    for x, t in ((ax, "train loss"), (ax2, "eval loss")):
        x.set_xlabel("step")
        x.set_title(t)
        x.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _last(run, path):
    v = run.get("results", path).astype(float)
    v = v[~np.isnan(v)]
    return f"{v[-1]:.4f}" if v.size else "n/a"


def summary(a, b, res):
    """The stdout lines."""
    out = [f"A: {a.dir} ({a.kind()}, {a.meta('build/git_sha', '?')}, {a.meta('deck_path', '?')})",
           f"B: {b.dir} ({b.kind()}, {b.meta('build/git_sha', '?')}, {b.meta('deck_path', '?')})"]
    if res is not None and not res["rows"]:
        out.append(f"requests: none in both ({len(res['only_a'])} in A, {len(res['only_b'])} in B)")
    elif res is not None:
        n = len(res["rows"])
        out.append(f"requests: {n} in both ({len(res['only_a'])} only in A, {len(res['only_b'])} "
                   f"only in B); identical: {res['identical']} of {n}")
        out.append(f"tokens: {res['matches']} of {res['tokens']} match (rate {res['rate']:.4f})")
        div = [r["first_divergence"] for r in res["rows"] if r["first_divergence"] >= 0]
        if div:
            out.append(f"first divergence: position {min(div)} at the earliest, median "
                       f"{int(np.median(div))}, over {len(div)} requests")
        d = res["lp_diffs"]
        if d.size:
            out.append(f"logprobs over matching prefixes ({d.size} tokens): max |diff| "
                       f"{d.max():.3g}, mean |diff| {d.mean():.3g}")
        if res["prompt_diffs"] is not None and res["prompt_diffs"].size:
            p = res["prompt_diffs"]
            out.append(f"prompt logprobs ({p.size} tokens): max |diff| {p.max():.3g}, "
                       f"mean |diff| {p.mean():.3g}")
    if a.has("profile", "/layers/mixer_seconds") and b.has("profile", "/layers/mixer_seconds"):
        ta, tb = (float(r.get("profile", "/layers/mixer_seconds").sum()
                        + r.get("profile", "/layers/ffn_seconds").sum()) for r in (a, b))
        out.append(f"layer seconds: A {ta:.4f}, B {tb:.4f} (B/A {tb / ta if ta else np.nan:.3f})")
    if a.has("results", "/train/loss") and b.has("results", "/train/loss"):
        out.append(f"final train loss: A {_last(a, '/train/loss')}, B {_last(b, '/train/loss')}")
        if a.has("results", "/eval/domain_loss") and b.has("results", "/eval/domain_loss"):
            out.append(f"last domain eval loss: A {_last(a, '/eval/domain_loss')}, "
                       f"B {_last(b, '/eval/domain_loss')}")
    return out


def compare(dir_a, dir_b, out=None):
    a, b = Run(dir_a), Run(dir_b)
    for r in (a, b):
        if not r.files:
            raise FileNotFoundError(f"{r.dir}: no results.h5, profile.h5 or plan.h5")
    page = Page(out or os.path.join(a.dir, "compare"), f"hymoe compare: {a.dir} vs {b.dir}")
    res = None
    if a.has("results", "/requests/id") and b.has("results", "/requests/id"):
        res = agreement.compare(agreement.requests(a), agreement.requests(b))
    lines = summary(a, b, res)
    page.section("Summary")
    page.raw(f"<pre>{html.escape(chr(10).join(lines))}</pre>")
    if a.kind() == "lora" or b.kind() == "lora":
        page.section("Training")
        page.plot("loss", "loss curves", loss_plot, a, b)
    else:
        page.section("Output agreement")
        page.plot("agreement", "token match rate and first divergence", agreement_plot,
                  res or {"rows": []})
        page.plot("logprobs", "log-probability differences over matching prefixes",
                  logprob_plot, res or {"lp_diffs": np.zeros(0), "lp_positions": None})
        if res and res["rows"]:
            worst = sorted(res["rows"], key=lambda r: (r["rate"], -np.nan_to_num(r["lp_max"])))[:10]
            page.raw("<p>least agreeing requests</p>" + table(
                [(r["id"], r["len_a"], r["len_b"], f"{r['rate']:.3f}", r["first_divergence"],
                  f"{r['lp_max']:.3g}") for r in worst],
                ["id", "tokens A", "tokens B", "match rate", "first divergence",
                 "max |Δ logprob|"]))
    page.section("Timings")
    page.plot("layers", "per-layer time by phase", layers_plot, a, b)
    path = os.path.join(page.out_dir, "index.html")
    page.write(path)
    a.close()
    b.close()
    return page, path, lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_a")
    ap.add_argument("run_b")
    ap.add_argument("--out", help="folder for the PNGs and index.html (default RUN_A/compare)")
    a = ap.parse_args()
    try:
        page, path, lines = compare(a.run_a, a.run_b, a.out)
    except FileNotFoundError as e:
        print(f"compare.py: {e}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    print(f"{path}: {len(page.pngs)} plots in {page.out_dir}")
    return 1 if page.errors else 0


if __name__ == "__main__":
    sys.exit(main())
