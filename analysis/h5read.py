"""Reads a hymoe job's out/ folder: results.h5, profile.h5 and plan.h5 when present (README,
"HDF5 schema"), datasets that may be absent, strings as str, and the engine's progress lines from
out/log. A dataset a plot needs and the run lacks raises Missing, which names it."""
import os
import re

import h5py
import numpy as np

FILES = ("results", "profile", "plan")

# [ 12.345 s] progress: 100 requests done / 120 read / 320 in the file, ETA 3 s, 1234.5 prompt
# tokens/s, 234.5 generated tokens/s, 32 running, 12 of 861379 KV pages in use
_PROGRESS = re.compile(
    r"^\[\s*([\d.]+) s\] progress: (\d+) requests done / (\d+) read / (\d+) in the file.*?, "
    r"([\d.]+) prompt tokens/s, ([\d.]+) generated tokens/s, (\d+) running, "
    r"(\d+) of (\d+) KV pages in use")
_JOB_LINE = re.compile(r"^\[\s*[\d.]+ s\] hymoe: job ")


class Missing(Exception):
    """The data a plot needs is not in this run; the message says what is absent."""


def out_dir(path):
    """A job folder (holding out/) or its out/ folder itself -> the out/ folder."""
    inner = os.path.join(path, "out")
    has_h5 = any(os.path.exists(os.path.join(path, f + ".h5")) for f in FILES)
    if not has_h5 and os.path.isdir(inner):
        return inner
    return path


class Run:
    """The HDF5 files of one out/ folder, opened read-only (absent ones are skipped)."""

    def __init__(self, path):
        self.dir = out_dir(path)
        self.files = {}
        for name in FILES:
            p = os.path.join(self.dir, name + ".h5")
            if os.path.exists(p):
                self.files[name] = h5py.File(p, "r")
        log = os.path.join(self.dir, "log")
        self.log = ""
        if os.path.exists(log):
            with open(log, encoding="utf-8", errors="replace") as f:
                self.log = f.read()

    def close(self):
        for f in self.files.values():
            f.close()

    def has(self, file, path):
        return file in self.files and path in self.files[file]

    def get(self, file, path):
        """The dataset as a numpy array (strings as str); Missing when absent."""
        if file not in self.files:
            raise Missing(f"{file}.h5 is absent")
        if path not in self.files[file]:
            raise Missing(f"{file}.h5 has no {path}")
        ds = self.files[file][path]
        if h5py.check_string_dtype(ds.dtype) is not None:
            return np.array(ds.asstr()[()], dtype=object)
        return ds[()]

    def attr(self, file, path, name, default=""):
        if not self.has(file, path) or name not in self.files[file][path].attrs:
            return default
        v = self.files[file][path].attrs[name]
        return v.decode() if isinstance(v, bytes) else str(v)

    def meta(self, name, default=""):
        """/meta/NAME as text, from the first file that has it."""
        for f in self.files.values():
            if "/meta/" + name in f:
                v = f["/meta/" + name][()]
                return v.decode() if isinstance(v, bytes) else str(v)
        return default

    def kind(self):
        """lora, infer or plan: by the datasets present, else by the deck's job.kind."""
        if self.has("results", "/train") or self.has("results", "/eval"):
            return "lora"
        if self.has("results", "/requests") or self.has("profile", "/layers"):
            return "infer"
        if "plan" in self.files:
            return "plan"
        m = re.search(r"^\s*kind:\s*(\w+)", self.meta("deck_resolved"), re.M)
        return m.group(1) if m else "unknown"

    def progress(self):
        """The last run's progress lines in out/log as columns: seconds, requests, prompt_tok_s,
        gen_tok_s (averages since the start), running, pages, pages_total. Missing if none."""
        lines = self.log.splitlines()
        starts = [i for i, l in enumerate(lines) if _JOB_LINE.match(l)]
        rows = [m.groups() for m in map(_PROGRESS.match, lines[starts[-1] if starts else 0:]) if m]
        if not rows:
            raise Missing("out/log has no progress lines (the engine logs one every 5 s)")
        a = np.array(rows, dtype=float)
        return {"seconds": a[:, 0], "requests": a[:, 1], "prompt_tok_s": a[:, 4],
                "gen_tok_s": a[:, 5], "running": a[:, 6], "pages": a[:, 7], "pages_total": a[:, 8]}
