#!/usr/bin/python3
"""make_lora_results.py OUT_DIR [--seed N] [--steps S] [--drop PATH]...: writes a synthetic lora
results.h5 in the schema the trainer is to write (listed in the README's Analysis section), so the
lora paths of analysis/report.py and compare.py run before the trainer does. Curves are smooth
functions plus seeded noise: a decaying loss, cosine lr with warmup, eval every 10 steps (general
accuracy not measured: NaN), expert load drifting from uniform, and routing drift growing with
the steps. --drop leaves a group or dataset out (a run that lacks it). Not a reference for any
number."""
import argparse
import os

import h5py
import numpy as np

DECK = """job: {kind: lora, name: synthetic-lora, seed: %d, output: out}
model: {preset: tiny, init: random, dtype: fp32}
finetune:
  method: lora
  lora: {rank: 8, alpha: 16, target_modules: [q_proj, v_proj]}
  optimizer: {lr: 1.0e-3, scheduler: cosine, warmup_steps: 5}
  steps: %d
"""


def write(out_dir, seed=1, steps=60, drop=(), layers=(1, 2, 3), experts=8, every=10):
    rng = np.random.default_rng(seed)
    os.makedirs(out_dir, exist_ok=True)
    S, L, E = steps, len(layers), experts
    step = np.arange(1, S + 1, dtype=np.int64)
    warm = 5
    lr = np.where(step <= warm, 1e-3 * step / warm,
                  0.5e-3 * (1 + np.cos(np.pi * (step - warm) / (S - warm))))
    loss = 2.0 + 3.5 * np.exp(-step / 15.0) + 0.08 * rng.standard_normal(S)
    tokens = np.full(S, 2048.0)
    seconds = 0.5 + 0.02 * rng.standard_normal(S)
    ev = np.arange(every, S + 1, every, dtype=np.int64)
    dom = 2.1 + 3.0 * np.exp(-ev / 15.0)
    gen = 2.6 + 0.02 * ev / S
    dom_acc = 0.2 + 0.5 * (1 - np.exp(-ev / 20.0))
    logits = rng.standard_normal((L, E))[None] * (step[:, None, None] / S)  # [S, L, E]
    load = np.exp(logits) / np.exp(logits).sum(axis=2, keepdims=True)
    overlap = 1 - 0.4 * (step[:, None] / S) * np.linspace(0.5, 1, L)[None]  # [S, L]
    kl = 0.05 * (step[:, None] / S) ** 1.5 * np.linspace(0.5, 1, L)[None]
    path = os.path.join(out_dir, "results.h5")
    with h5py.File(path, "w") as f:
        deck = DECK % (seed, S)
        f["/meta/deck"] = deck
        f["/meta/deck_resolved"] = deck
        f["/meta/deck_path"] = "synthetic"
        f["/meta/build/git_sha"] = "synthetic"
        f["/meta/model"] = "tiny (synthetic lora results)"
        f["/train/step"] = step
        train = {"loss": loss, "lr": lr, "grad_norm": 1.0 / np.sqrt(step) + 0.1, "tokens": tokens,
                 "seconds": seconds, "tokens_per_s": tokens / seconds}
        for name, v in train.items():
            f["/train/" + name] = v.astype(np.float64)
        f["/eval/step"] = ev
        f["/eval/domain_loss"] = dom
        f["/eval/general_loss"] = gen
        f["/eval/domain_accuracy"] = dom_acc
        f["/eval/general_accuracy"] = np.full(len(ev), np.nan)
        f["/experts/layers"] = np.array(layers, dtype=np.int64)
        f["/experts/load"] = load
        f["/drift/top_k_overlap"] = overlap
        f["/drift/kl"] = kl
        for p in drop:
            del f[p]
    return path


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--drop", action="append", default=[], help="a group or dataset to leave out")
    a = ap.parse_args()
    print(write(a.out_dir, a.seed, a.steps, a.drop))
