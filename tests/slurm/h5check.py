"""Checks on hymoe's results.h5 for the slurm tier (tests/slurm/run), with Debian's python3-h5py.

  h5check.py requests FILE N          FILE holds N finished requests, indices 0..N-1 in order
  h5check.py same FILE REF            the same requests, ids and output tokens as REF, and
                                      log-probabilities within 1e-5 * max(1, |ref|)
  h5check.py meta FILE NAME=VALUE...  /meta/slurm/NAME == VALUE (VALUE '-': the dataset is absent)
  h5check.py curve FILE REF           a lora results.h5: /train/loss and /eval/* bit-identical to REF

Prints one line saying what it found; exit 0 when the check holds, 1 when not.
"""

import sys

import h5py
import numpy as np


def fail(msg):
    print(msg)
    sys.exit(1)


def read(path):
    with h5py.File(path, "r") as f:
        r = f["/requests"]
        return {k: r[k][()] for k in r}


def requests(path, n):
    r = read(path)
    idx = r["index"]
    if len(idx) != n or not np.array_equal(idx, np.arange(n)):
        fail(f"{path}: {len(idx)} requests, indices {idx[:5]}..., not 0..{n - 1}")
    if not np.all(r["done"] == 1):
        fail(f"{path}: {int(np.sum(r['done'] != 1))} requests not done")
    print(f"{path}: {n} requests, {len(r['output_tokens'])} tokens")


def same(path, ref_path):
    a, b = read(path), read(ref_path)
    for k in ("index", "id", "finish_reason", "output_offsets", "output_tokens"):
        if not np.array_equal(a[k], b[k]):
            bad = np.flatnonzero(a[k] != b[k]) if a[k].shape == b[k].shape else []
            fail(f"{path}: /requests/{k} differs from {ref_path} (shapes {a[k].shape} "
                 f"{b[k].shape}, first differing element {bad[:1]})")
    la, lb = a["output_logprobs"], b["output_logprobs"]
    err = np.abs(la - lb) / np.maximum(1.0, np.abs(lb))
    if err.size and err.max() > 1e-5:
        fail(f"{path}: output_logprobs differ from {ref_path} by {err.max():.3g} (> 1e-5)")
    print(f"{path}: {len(a['index'])} requests, {len(la)} tokens equal to {ref_path}"
          f" (logprobs within {err.max() if err.size else 0:.2g})")


def curve(path, ref_path):
    with h5py.File(path, "r") as f, h5py.File(ref_path, "r") as g:
        for k in ("train/step", "train/loss", "train/grad_norm", "eval/domain_loss"):
            if not np.array_equal(f[k][()], g[k][()]):
                fail(f"{path}: /{k} differs from {ref_path}")
        print(f"{path}: {len(f['train/loss'])} steps, losses bit-identical to {ref_path}")


def meta(path, pairs):
    with h5py.File(path, "r") as f:
        for pair in pairs:
            name, want = pair.split("=", 1)
            key = "/meta/slurm/" + name
            got = f[key][()].decode() if key in f else "-"
            if got != want:
                fail(f"{path}: {key} is '{got}', not '{want}'")
    print(f"{path}: /meta/slurm has {' '.join(pairs)}")


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "requests":
        requests(args[0], int(args[1]))
    elif cmd == "same":
        same(args[0], args[1])
    elif cmd == "meta":
        meta(args[0], args[1:])
    elif cmd == "curve":
        curve(args[0], args[1])
    else:
        fail(f"unknown check {cmd}")
