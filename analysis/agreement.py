"""Output agreement of two infer runs' results.h5, request by request (matched by /requests/id):
the token match rate (positions where both runs generated the same token, over the longer
output), the first divergence (the first position whose tokens differ, or the shorter length when
one output is a prefix of the other; -1 when identical), and the log-probability differences over
the matching prefix, where both runs scored the same tokens after the same context. With
prompt_logprobs in both runs, also the teacher-forced prompt log-probability differences."""
import numpy as np


def requests(run):
    """id -> (output tokens, output logprobs, prompt logprobs or None) of one run."""
    ids = run.get("results", "/requests/id")
    out = run.get("results", "/requests/output_offsets")
    tok = run.get("results", "/requests/output_tokens")
    lp = run.get("results", "/requests/output_logprobs").astype(np.float64)
    prompt = None
    if run.has("results", "/requests/prompt_logprobs"):
        off = run.get("results", "/requests/logprob_offsets")
        plp = run.get("results", "/requests/prompt_logprobs").astype(np.float64)
        prompt = [plp[off[i]:off[i + 1]] for i in range(len(ids))]
    return {str(r): (tok[out[i]:out[i + 1]], lp[out[i]:out[i + 1]], prompt[i] if prompt else None)
            for i, r in enumerate(ids)}


def first_divergence(a, b):
    n = min(len(a), len(b))
    diff = np.nonzero(a[:n] != b[:n])[0]
    if diff.size:
        return int(diff[0])
    return -1 if len(a) == len(b) else n


def compare(req_a, req_b):
    """Per request in both (file order of A) and totals; see the module docstring."""
    ids = [r for r in req_a if r in req_b]
    rows = []
    lp_diffs, lp_pos, prompt_diffs = [], [], []
    for r in ids:
        (ta, la, pa), (tb, lb, pb) = req_a[r], req_b[r]
        n = min(len(ta), len(tb))
        longest = max(len(ta), len(tb))
        matches = int(np.sum(ta[:n] == tb[:n]))
        div = first_divergence(ta, tb)
        prefix = n if div < 0 else div
        d = np.abs(la[:prefix] - lb[:prefix])
        lp_diffs.append(d)
        lp_pos.append(np.arange(prefix))
        if pa is not None and pb is not None and len(pa) == len(pb):
            prompt_diffs.append(np.abs(pa - pb))
        rows.append({"id": r, "len_a": len(ta), "len_b": len(tb), "matches": matches,
                     "rate": matches / longest if longest else 1.0, "first_divergence": div,
                     "lp_max": float(d.max()) if d.size else np.nan,
                     "lp_mean": float(d.mean()) if d.size else np.nan})
    lp = np.concatenate(lp_diffs) if lp_diffs else np.zeros(0)
    prompt = np.concatenate(prompt_diffs) if prompt_diffs else None
    total = sum(max(x["len_a"], x["len_b"]) for x in rows)
    return {
        "rows": rows,
        "only_a": [r for r in req_a if r not in req_b],
        "only_b": [r for r in req_b if r not in req_a],
        "matches": sum(x["matches"] for x in rows),
        "tokens": total,
        "rate": sum(x["matches"] for x in rows) / total if total else 1.0,
        "identical": sum(x["first_divergence"] < 0 for x in rows),
        "lp_diffs": lp,
        "lp_positions": np.concatenate(lp_pos) if lp_pos else np.zeros(0, dtype=int),
        "prompt_diffs": prompt,
    }
