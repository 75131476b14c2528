"""Plots of a plan job's plan.h5: memory per rank by item for each pipeline stage, the estimated
step time and communication bytes per phase for prefill, decode and training, and with plan.gpus
the best fitting layouts of the search. With a search (plan.gpus) the memory, time and
communication plots show the best layout found (/search/best), not the deck's own (/plan), which
may not fit at all; the title names the layout. Units: memory and bytes in GiB (2^30 bytes), as
the log's tables.
Each function takes an h5read.Run and returns a Figure; Missing when plan.h5 lacks the data."""
import matplotlib.pyplot as plt
import numpy as np

from h5read import Missing

TOTALS = ("inference", "training", "peak", "kv_host")  # totals and off-device: not stacked
GIB = 2**30


def _plan(run):
    """The group of the plan to draw and its layout in words: the search's best when there is
    one, else the deck's."""
    try:
        g = "/search/best"
        layout = run.get("plan", g + "/layout")
        what = "best layout found"
    except Missing:
        g = "/plan"
        layout = run.get("plan", g + "/layout")
        what = "deck's layout"
    words = "tp{} dp{} pp{} ep{} etp{}".format(*layout[:5])
    return g, f"{what}: {words}"


def plan_memory(run):
    g, title = _plan(run)
    items = list(run.get("plan", g + "/memory_items"))
    b = run.get("plan", g + "/memory_bytes").astype(float) / GIB  # [pp, items] GiB
    keep = [k for k, i in enumerate(items) if i not in TOTALS and b[:, k].any()]
    y = np.arange(b.shape[0])
    fig, ax = plt.subplots(figsize=(8, 1.8 + 0.5 * b.shape[0]))
    left = np.zeros(b.shape[0])
    for k in keep:
        ax.barh(y, b[:, k], left=left, label=items[k])
        left += b[:, k]
    ax.set_yticks(y, [f"stage {s}" for s in y])
    ax.set_xlabel("GiB per rank (every item the plan counts, inference and training alike)")
    ax.set_title(f"planned memory per rank ({title})")
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    return fig


def _steps(run):
    g, title = _plan(run)
    steps = list(run.get("plan", g + "/steps"))
    phases = list(run.get("plan", g + "/phases"))
    return g, title, steps, phases, np.arange(len(steps))


def plan_step_time(run):
    """Per step: compute and HBM time side by side (the model takes their max), then the
    communication phases stacked, and the model's total t = max(compute, hbm) + communication."""
    g, title, steps, phases, x = _steps(run)
    v = run.get("plan", g + "/step_seconds").astype(float)  # [steps, phases]
    total = run.get("plan", g + "/step_total_seconds").astype(float)
    fig, ax = plt.subplots(figsize=(8, 3.8))
    w = 0.27
    ax.bar(x - w, v[:, 0], width=w, label=phases[0])
    ax.bar(x, v[:, 1], width=w, label=phases[1])
    bottom = np.zeros(len(steps))
    for k in range(2, len(phases)):
        if v[:, k].any():
            ax.bar(x + w, v[:, k], width=w, bottom=bottom, label=phases[k])
            bottom += v[:, k]
    ax.plot(x, total, "k_", markersize=40, mew=2, label="total: max(compute, hbm) + comm")
    ax.set_xticks(x, steps)
    ax.set_ylabel("seconds per step")
    ax.set_title(f"estimated step time by phase ({title})")
    ax.legend(fontsize=8)
    return fig


def plan_comm(run):
    g, title, steps, phases, x = _steps(run)
    v = run.get("plan", g + "/step_comm_bytes").astype(float) / GIB  # [steps, phases] GiB
    fig, ax = plt.subplots(figsize=(7, 3.8))
    w = 0.8 / len(phases)
    for k, ph in enumerate(phases):
        ax.bar(x + (k - len(phases) / 2 + 0.5) * w, v[:, k], width=w, label=ph)
    ax.set_xticks(x, steps)
    ax.set_ylabel("GiB sent per rank and step")
    ax.set_title(f"planned communication by phase ({title})")
    ax.legend(fontsize=8)
    return fig, "" if v.any() else "no communication planned at this layout"


def plan_search(run):
    layouts = run.get("plan", "/search/layouts")  # [n, 6] tp dp pp ep etp edp
    fits = run.get("plan", "/search/fits").astype(bool)
    spt = run.get("plan", "/search/seconds_per_token").astype(float)
    best = np.nonzero(fits)[0][:15]
    if best.size == 0:
        raise Missing("no layout fits")
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.3 * best.size))
    ax.barh(np.arange(best.size), spt[best] * 1e3)
    ax.set_yticks(np.arange(best.size),
                  ["tp{} dp{} pp{} ep{} etp{}".format(*layouts[i][:5]) for i in best])
    ax.invert_yaxis()
    ax.set_xlabel("ms per token")
    ax.set_title(f"best fitting layouts ({fits.sum()} of {len(fits)} fit)")
    return fig
