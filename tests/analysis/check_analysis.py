#!/usr/bin/python3
"""check_analysis.py: hand cases for analysis/ that need no hymoe run: agreement.py's match rate,
first divergence and prefix log-probability differences on built request tables; the progress
parser of h5read.py on log lines in the engine's format (only the last run of an appended log);
the min/max over the ranks that ran a layer; the page's notes for missing data and failed
plots; and the plan plots drawing the search's best layout (not the deck's) in GiB. Run by the e2e tier (tests/e2e/test_analysis.cpp); prints one line per failure and
"check_analysis: N passed, N failed", exit 1 on a failure."""
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "analysis"))

import numpy as np  # noqa: E402

import agreement  # noqa: E402
import plots_infer  # noqa: E402
import plots_plan  # noqa: E402
from h5read import Missing, Run  # noqa: E402
from page import Page  # noqa: E402


def req(tokens, logprobs, prompt=None):
    return (np.array(tokens), np.array(logprobs, dtype=float),
            None if prompt is None else np.array(prompt, dtype=float))


def check_first_divergence():
    fd = agreement.first_divergence
    assert fd(np.array([1, 2, 3]), np.array([1, 2, 3])) == -1
    assert fd(np.array([1, 2, 3]), np.array([1, 5, 3])) == 1
    assert fd(np.array([1, 2]), np.array([1, 2, 3])) == 2  # a prefix diverges at its end
    assert fd(np.array([], dtype=int), np.array([], dtype=int)) == -1


def check_compare():
    a = {"same": req([1, 2, 3], [-1.0, -2.0, -3.0], [-0.5, -0.25]),
         "split": req([4, 5, 6, 7], [-1.0, -1.0, -9.0, -9.0], [-1.0]),
         "short": req([8, 9], [-0.5, -0.5]),
         "only_a": req([1], [-1.0])}
    b = {"short": req([8, 9, 10], [-0.5, -0.75, -1.0]),
         "same": req([1, 2, 3], [-1.0, -2.5, -3.0], [-0.5, -0.5]),
         "split": req([4, 0, 6, 0], [-1.25, -1.0, -1.0, -1.0], [-1.0]),
         "only_b": req([2], [-1.0])}
    r = agreement.compare(a, b)
    rows = {x["id"]: x for x in r["rows"]}
    assert [x["id"] for x in r["rows"]] == ["same", "split", "short"]  # A's order
    assert r["only_a"] == ["only_a"] and r["only_b"] == ["only_b"]
    assert rows["same"]["rate"] == 1.0 and rows["same"]["first_divergence"] == -1
    assert rows["same"]["lp_max"] == 0.5 and abs(rows["same"]["lp_mean"] - 0.5 / 3) < 1e-12
    # split: positions 0 and 2 match (rate 2/4); the prefix is position 0 only, so the -9 vs -1
    # after the divergence does not count
    assert rows["split"]["matches"] == 2 and rows["split"]["rate"] == 0.5
    assert rows["split"]["first_divergence"] == 1 and rows["split"]["lp_max"] == 0.25
    assert rows["short"]["rate"] == 2 / 3 and rows["short"]["first_divergence"] == 2
    assert rows["short"]["lp_max"] == 0.25
    assert r["matches"] == 3 + 2 + 2 and r["tokens"] == 3 + 4 + 3 and r["identical"] == 1
    assert sorted(r["lp_diffs"].tolist()) == [0, 0, 0, 0.25, 0.25, 0.5]  # 3 + 1 + 2 prefix tokens
    assert sorted(r["prompt_diffs"].tolist()) == [0, 0, 0.25]  # "short" has none


LOG = """[   0.001 s] hymoe: job 'q' (infer) from deck.yaml on 1 ranks
[   5.000 s] progress: 1 requests done / 2 read / 9 in the file, ETA 40 s, 10.0 prompt tokens/s, 5.0 generated tokens/s, 1 running, 1 of 50 KV pages in use
[   0.001 s] hymoe: job 'q' (infer) from deck.yaml on 2 ranks
[   0.002 s] resolved deck:
[   5.078 s] progress: 13 requests done / 14 read / 320 in the file (replica 0), ETA 57 s, 60.5 prompt tokens/s, 458.0 generated tokens/s, 1 running, 2 of 405468 KV pages in use
[  10.078 s] progress: 31 requests done / 32 read / 320 in the file (replica 0), ETA 42 s, 76.8 prompt tokens/s, 530.8 generated tokens/s, 3 running, 7 of 405468 KV pages in use
[  12.000 s] done: 320 requests
"""


def check_progress():
    with tempfile.TemporaryDirectory() as d:
        run = Run(d)
        try:
            run.progress()
            raise AssertionError("no log: Missing expected")
        except Missing:
            pass
        with open(os.path.join(d, "log"), "w") as f:
            f.write(LOG)
        p = Run(d).progress()
        assert p["seconds"].tolist() == [5.078, 10.078]  # the last run only
        assert p["gen_tok_s"].tolist() == [458.0, 530.8]
        assert p["prompt_tok_s"].tolist() == [60.5, 76.8]
        assert p["running"].tolist() == [1, 3] and p["pages"].tolist() == [2, 7]
        assert p["pages_total"].tolist() == [405468, 405468]
        with open(os.path.join(d, "log"), "w") as f:  # one run at dp 1: no "(replica 0)"
            f.write("\n".join(LOG.splitlines()[:2]))
        p = Run(d).progress()
        assert p["seconds"].tolist() == [5.0] and p["pages"].tolist() == [1]


def check_rank_spread():
    v = np.array([[1.0, 0.0, 0.0], [3.0, 2.0, 0.0], [2.0, 4.0, 0.0]])  # [W=3, 3]
    lo, hi = plots_infer._rank_spread(v)
    assert lo[:2].tolist() == [1.0, 2.0] and hi[:2].tolist() == [3.0, 4.0]
    assert np.isnan(lo[2]) and np.isnan(hi[2])  # no rank ran it


def check_page_notes():
    import matplotlib.pyplot as plt

    def fine():
        return plt.subplots()[0]

    def absent():
        raise Missing("profile.h5 has no /x")

    def broken():
        raise ValueError("bad shape")

    with tempfile.TemporaryDirectory() as d:
        page = Page(d, "t")
        page.plot("a", "A", fine)
        page.plot("b", "B", absent)
        page.plot("c", "C", broken)
        page.write(os.path.join(d, "index.html"))
        html = open(os.path.join(d, "index.html")).read()
        assert os.path.getsize(os.path.join(d, "a.png")) > 0
        assert not os.path.exists(os.path.join(d, "b.png"))
        assert "skipped: profile.h5 has no /x" in html and "failed: ValueError: bad shape" in html
        assert page.errors == 1 and len(page.pngs) == 1


class FakePlan:
    """A plan.h5 as h5read.Run.get sees it: the deck's layout, and with best the search's."""

    def __init__(self, best):
        items = np.array(["weights", "kv_cache", "peak"], dtype=object)
        self.data = {"/plan/layout": np.array([1, 8, 1, 8, 1, 1]), "/plan/memory_items": items,
                     "/plan/memory_bytes": np.array([[5000.0, 10.0, 5010.0]]) * 2**30}
        if best:
            best_bytes = np.array([[60.0, 40.0, 100.0]] * 8) * 2**30  # [pp 8, items]
            self.data.update({"/search/best/layout": np.array([8, 8, 8, 64, 1, 8]),
                              "/search/best/memory_items": items,
                              "/search/best/memory_bytes": best_bytes})

    def get(self, file, path):
        if path not in self.data:
            raise Missing(f"{file}.h5 has no {path}")
        return self.data[path]


def check_plan_plots_draw_the_best_layout():
    fig = plots_plan.plan_memory(FakePlan(best=True))
    ax = fig.axes[0]
    assert "best layout found: tp8 dp8 pp8 ep64 etp1" in ax.get_title(), ax.get_title()
    widths = [p.get_width() for p in ax.patches]
    assert len(widths) == 16 and max(widths) == 60.0  # 8 stages x (weights, kv_cache) in GiB
    assert "GiB" in ax.get_xlabel()
    deck = plots_plan.plan_memory(FakePlan(best=False)).axes[0]
    assert "deck's layout: tp1 dp8 pp1 ep8 etp1" in deck.get_title(), deck.get_title()
    assert max(p.get_width() for p in deck.patches) == 5000.0


def main():
    checks = [v for k, v in sorted(globals().items()) if k.startswith("check_")]
    failed = 0
    for c in checks:
        try:
            c()
        except Exception as e:  # report every failing check, not only the first
            failed += 1
            import traceback
            print(f"FAILED {c.__name__}: {type(e).__name__} {e}\n{traceback.format_exc()}")
    print(f"check_analysis: {len(checks) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
