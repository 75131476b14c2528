"""Plots of a lora job's results.h5: training loss with the domain and general eval losses, eval
accuracy, learning rate and gradient norm, throughput, expert load per MoE layer over the steps,
and routing drift (top-k overlap and KL of the routing). Schema: /train/*
[S], /eval/* [M] (NaN: not measured), /experts/layers [L], /experts/load [S, L, E],
/drift/{top_k_overlap,kl} [S, L]. Each function takes an h5read.Run and returns a Figure."""
import matplotlib.pyplot as plt
import numpy as np

from h5read import Missing


def _eval(run, name):
    """(steps, values) of /eval/NAME where measured; Missing if never."""
    step = run.get("results", "/eval/step")
    v = run.get("results", "/eval/" + name).astype(float)
    ok = ~np.isnan(v)
    if not ok.any():
        raise Missing(f"/eval/{name} has no measured value")
    return step[ok], v[ok]


def loss(run):
    step = run.get("results", "/train/step")
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(step, run.get("results", "/train/loss"), lw=1, label="train loss")
    notes = []
    for name, style in (("domain_loss", "o-"), ("general_loss", "s-")):
        try:
            s, v = _eval(run, name)
            ax.plot(s, v, style, label=f"eval {name.replace('_', ' ')}")
        except Missing as e:
            notes.append(str(e))
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per token)")
    ax.set_title("training and evaluation loss")
    ax.legend(fontsize=8)
    return fig, "; ".join(dict.fromkeys(notes))


def accuracy(run):
    curves = []
    for name in ("domain_accuracy", "general_accuracy"):
        try:
            curves.append((name, *_eval(run, name)))
        except Missing:
            pass
    if not curves:
        raise Missing("no eval accuracy was measured")
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for name, s, v in curves:
        ax.plot(s, v, "o-", label=name.replace("_", " "))
    ax.set_xlabel("step")
    ax.set_ylabel("next-token accuracy")
    ax.set_title("evaluation accuracy")
    ax.legend(fontsize=8)
    return fig


def optimizer(run):
    step = run.get("results", "/train/step")
    lr = run.get("results", "/train/lr")
    gn = run.get("results", "/train/grad_norm")
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 3.5))
    ax.plot(step, lr)
    ax.set_xlabel("step")
    ax.set_title("learning rate")
    ax2.plot(step, gn, color="C1")
    ax2.set_xlabel("step")
    ax2.set_title("gradient norm")
    fig.tight_layout()
    return fig


def throughput(run):
    step = run.get("results", "/train/step")
    tps = run.get("results", "/train/tokens_per_s")
    fig, ax = plt.subplots(figsize=(8, 3.2))
    ax.plot(step, tps)
    ax.set_xlabel("step")
    ax.set_ylabel("tokens/s")
    ax.set_title("training throughput")
    return fig


def expert_load(run):
    step = run.get("results", "/train/step")
    layers = run.get("results", "/experts/layers")
    load = run.get("results", "/experts/load").astype(float)  # [S, L, E]
    if load.ndim != 3 or load.shape[1] != len(layers):
        raise Missing(f"/experts/load has shape {load.shape}, not [S, {len(layers)}, E]")
    cols = min(len(layers), 4)
    rows = -(-len(layers) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.8 * rows), squeeze=False,
                             constrained_layout=True)
    for k, layer in enumerate(layers):
        ax = axes[k // cols, k % cols]
        im = ax.imshow(load[:, k, :].T, aspect="auto", origin="lower", cmap="magma", vmin=0,
                       extent=(step[0], step[-1], -0.5, load.shape[2] - 0.5))
        ax.set_title(f"layer {layer}")
        ax.set_xlabel("step")
        if k % cols == 0:
            ax.set_ylabel("expert")
    for k in range(len(layers), rows * cols):
        axes[k // cols, k % cols].axis("off")
    fig.colorbar(im, ax=axes, label="share of assignments")
    return fig


def drift(run):
    step = run.get("results", "/train/step")
    layers = (run.get("results", "/experts/layers") if run.has("results", "/experts/layers")
              else None)
    panels = [("/drift/top_k_overlap", "routing drift: top-k overlap with the base router"),
              ("/drift/kl", "routing drift: KL divergence of the routing")]
    have = [(p, t) for p, t in panels if run.has("results", p)]
    if not have:
        raise Missing("results.h5 has no /drift")
    fig, axes = plt.subplots(1, len(have), figsize=(5.5 * len(have), 3.6), squeeze=False)
    for ax, (path, title) in zip(axes[0], have):
        v = run.get("results", path)  # [S, L]
        for k in range(v.shape[1]):
            name = f"layer {layers[k]}" if layers is not None else f"column {k}"
            ax.plot(step, v[:, k], label=name)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig, "; ".join(f"results.h5 has no {p}" for p, _ in panels if not run.has("results", p))
