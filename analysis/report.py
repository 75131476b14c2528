#!/usr/bin/python3
"""report.py OUT_DIR [--html PATH]: plots of one job's outputs. Reads OUT_DIR's results.h5,
profile.h5 and plan.h5 (those present; OUT_DIR may also be the job folder holding out/), writes one
PNG per plot into OUT_DIR/report/ and a one-page OUT_DIR/report/index.html (or PATH) that shows
them, with a note for each plot whose data the run does not have. Exit 0; 1 if a plot failed for
another reason than missing data (the page is still written); 2 if OUT_DIR has no HDF5 output."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import plots_infer  # noqa: E402
import plots_lora  # noqa: E402
import plots_plan  # noqa: E402
from h5read import Run  # noqa: E402
from page import Page, run_summary  # noqa: E402

# (section, [(png name, title, draw function)]) per family of outputs
PROFILE = [
    ("Latency", [("layers", "per-layer latency by phase, min/max over ranks",
                  plots_infer.layer_latency),
                 ("rank_layers", "layer time per rank", plots_infer.rank_layer_time),
                 ("roofline", "roofline of each layer class", plots_infer.roofline)]),
    ("Experts and communication", [
        ("expert_load", "expert utilisation", plots_infer.expert_load),
        ("moe_comm", "MoE communication bytes and time per phase", plots_infer.moe_comm)]),
    ("Memory", [("memory", "memory per rank", plots_infer.memory_ranks)]),
]
INFER = [
    ("Requests and throughput", [
        ("requests", "requests: lengths, finish reasons, log-probabilities", plots_infer.requests),
        ("progress", "throughput and KV pages in use over time", plots_infer.progress)]),
]
LORA = [
    ("Training", [("loss", "loss: train, domain and general eval", plots_lora.loss),
                  ("accuracy", "eval accuracy", plots_lora.accuracy),
                  ("optimizer", "learning rate and gradient norm", plots_lora.optimizer),
                  ("throughput", "training throughput", plots_lora.throughput)]),
    ("Experts over the steps", [
        ("train_expert_load", "expert utilisation per layer over steps", plots_lora.expert_load),
        ("drift", "routing drift", plots_lora.drift)]),
]
PLAN = [
    ("Plan", [("plan_memory", "planned memory per rank", plots_plan.plan_memory),
              ("plan_time", "estimated step time per phase", plots_plan.plan_step_time),
              ("plan_comm", "planned communication per phase", plots_plan.plan_comm),
              ("plan_search", "layout search", plots_plan.plan_search)]),
]


def families(run, kind):
    """The plot families to draw: by job kind, plus those of the other files present."""
    out = {"infer": INFER + PROFILE, "lora": LORA, "plan": PLAN}.get(kind, [])
    if kind == "lora" and "profile" in run.files:
        out = out + PROFILE
    if kind != "plan" and "plan" in run.files:
        out = out + PLAN
    return out


def report(out_dir, html_path=None):
    """Writes the plots and the page; returns (page, html path)."""
    run = Run(out_dir)
    if not run.files:
        raise FileNotFoundError(f"{run.dir}: no results.h5, profile.h5 or plan.h5")
    kind = run.kind()
    page = Page(os.path.join(run.dir, "report"), f"hymoe report: {run.dir} ({kind})")
    page.section("Run")
    page.raw(run_summary(run))
    for section, plots in families(run, kind):
        page.section(section)
        for name, title, draw in plots:
            page.plot(name, title, draw, run)
    html_path = html_path or os.path.join(page.out_dir, "index.html")
    page.write(html_path)
    run.close()
    return page, html_path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir", help="a job's out/ folder (or the job folder)")
    ap.add_argument("--html", help="the page's path (default OUT_DIR/report/index.html)")
    a = ap.parse_args()
    try:
        page, path = report(a.out_dir, a.html)
    except FileNotFoundError as e:
        print(f"report.py: {e}", file=sys.stderr)
        return 2
    print(f"{path}: {len(page.pngs)} plots in {page.out_dir}")
    return 1 if page.errors else 0


if __name__ == "__main__":
    sys.exit(main())
