# src/backend/cuda/indexer_topk.cu and mla_sparse.cu emulated block by block with the kernels'
# index expressions and the C++ planner's plans, against the CPU definitions: indexer scores and
# top-k with ties to the smaller key (equal, or differing only within 1e-5 of the k-th score),
# softmax attention over the valid selected keys (normalised error below 1e-2).
# Usage: dsa.py indexer n_q n_k H d top_k one_sequence n_sm pos_first [negative_w]
#        dsa.py mla n_q H r_kv d_r n_keys n_selected
#        dsa.py step H_I d_I top_k H r_kv d_r pos0:count,... (the GPU model's fused DSA step)
import sys

import numpy as np

from fragments import *

f32 = np.float32

def bfr(x):  # round to bf16
    return bits_f32(bf16_bits(np.asarray(x, f32))).reshape(np.shape(x))

def ordered(score):
    b = int(np.array([score], f32).view(np.uint32)[0])
    return (~b & 0xFFFFFFFF) if b & 0x80000000 else (b | 0x80000000)
def candidate(score, key):
    return (ordered(score) << 32) | (~key & 0xFFFFFFFF)
def candidate_score(c):
    o = c >> 32
    b = (o & 0x7FFFFFFF) if o & 0x80000000 else (~o & 0xFFFFFFFF)
    return float(np.array([b], np.uint32).view(f32)[0])
def candidate_key(c):
    return -1 if c == 0 else ((~c) & 0xFFFFFFFF)

def bitonic_sort_desc(a, n):
    size = 2
    while size <= n:
        stride = size >> 1
        while stride > 0:
            for i in range(n // 2):
                lo = 2 * i - (i & (stride - 1)); hi = lo + stride
                desc = (lo & size) == 0
                x, y = a[lo], a[hi]
                if (x < y) == desc:
                    a[lo], a[hi] = y, x
            stride >>= 1
        size <<= 1

def indexer_block(P, Pl, by, split, scratch, idx):
    H, d, top_k, nq_all = P['H'], P['d'], P['top_k'], P['n_q']
    qb, BK, cap = Pl['qb'], Pl['BK'], Pl['cap']
    sm = Smem(Pl['smem'])
    rows = qb * H
    r0 = by * qb
    nq = min(qb, nq_all - r0)
    visible = [P['visible'][r0 + t] if t < nq else 0 for t in range(2)]
    count = [0, 0]; full = [0, 0]; bar = [0.0, 0.0]
    cand = [[0] * cap for _ in range(qb)]
    for e in range(rows * d):
        row, x = e // d, e % d
        sm.st_bf(Pl['q_off'], row * Pl['ld_q'] + x, P['q'].reshape(-1)[(r0 * H + row) * d + x] if row // H < nq else 0.0)
    ws = [P['w'].reshape(-1)[r0 * H + row] if row // H < nq else 0.0 for row in range(rows)]
    seq = P['seq'][r0] if P.get('seq') is not None else 0  # qb = 2 only without seq
    vmax = max(visible[:qb])
    chunk = ((vmax + Pl['n_split'] - 1) // Pl['n_split'] + BK - 1) // BK * BK
    lo = split * chunk; hi = min(vmax, lo + chunk)
    m_tiles = rows // 16
    logit = np.zeros((rows, Pl['ld_logit']), f32)
    kt = lo
    while kt < hi:
        for e in range(BK * d):
            i, x = e // d, e % d; u = kt + i
            sm.st_bf(Pl['k_off'], i * Pl['ld_q'] + x, P['key'](seq, u)[x] if u < hi else 0.0)
        for job in range(m_tiles * (BK // 16)):
            mt, nt = job % m_tiles, job // m_tiles
            c = [new_c(), new_c()]
            for kk in range(0, d, 16):
                a = load_a(sm, Pl['q_off'] + 2 * (mt * 16 * Pl['ld_q'] + kk), Pl['ld_q'])
                b0, b1 = load_b2(sm, Pl['k_off'] + 2 * (nt * 16 * Pl['ld_q'] + kk), Pl['ld_q'])
                c[0] = mma(c[0], a, b0); c[1] = mma(c[1], a, b1)
            for f in range(2):
                for lane in range(32):
                    for i in range(4):
                        row = mt * 16 + c_row(lane, i)
                        logit[row, nt * 16 + f * 8 + c_col(lane, i)] = f32(ws[row]) * max(c[f][lane, i], f32(0))
        for tid in range(qb * BK):
            qi, i = tid // BK, tid % BK; u = kt + i
            score = f32(0)
            for j in range(H):
                score = f32(score + logit[qi * H + j, i])
            if u < hi and u < visible[qi] and (not full[qi] or score > bar[qi]):
                cand[qi][count[qi]] = candidate(float(score), u); count[qi] += 1
        for qi in range(qb):
            if count[qi] <= cap - BK:
                continue
            for e in range(count[qi], cap):
                cand[qi][e] = 0
            bitonic_sort_desc(cand[qi], cap)
            count[qi] = top_k; full[qi] = 1; bar[qi] = candidate_score(cand[qi][top_k - 1])
        kt += BK
    for qi in range(nq):
        for e in range(count[qi], cap):
            cand[qi][e] = 0
        bitonic_sort_desc(cand[qi], cap)
        r = r0 + qi
        for e in range(top_k):
            if Pl['n_split'] == 1:
                idx[r, e] = candidate_key(cand[qi][e])
            else:
                scratch[(r * Pl['n_split'] + split) * top_k + e] = cand[qi][e]

def indexer(P, Pl):
    n_q, top_k = P['n_q'], P['top_k']
    idx = np.full((n_q, top_k), -7, np.int64)
    scratch = [0] * (n_q * Pl['n_split'] * top_k)
    for by in range((n_q + Pl['qb'] - 1) // Pl['qb']):
        for split in range(Pl['n_split']):
            indexer_block(P, Pl, by, split, scratch, idx)
    if Pl['n_split'] > 1:
        n = Pl['merge'] // 8; total = Pl['n_split'] * top_k
        for r in range(n_q):
            c = [scratch[r * total + e] if e < total else 0 for e in range(n)]
            bitonic_sort_desc(c, n)
            for e in range(top_k):
                idx[r, e] = candidate_key(c[e])
    return idx

def check_indexer(n_q, n_k, H, d, top_k, one_seq, n_sm, pos_first, neg=0):
    rng = np.random.default_rng(3)
    q = bfr(rng.standard_normal((n_q, H * d))); k = bfr(rng.standard_normal((n_k, d)))
    w = (rng.standard_normal((n_q, H)) * 0.1).astype(f32)
    if neg: w = -np.abs(w)
    visible = [pos_first + i + 1 for i in range(n_q)]
    Pl = plan('indexer', n_q, max(visible), H, d, top_k, int(one_seq), n_sm)
    P = dict(H=H, d=d, top_k=top_k, n_q=n_q, q=q, key=lambda s, u: k[u], w=w, visible=visible)
    idx = indexer(P, Pl)
    bad = 0; exact = 0
    for r in range(n_q):
        logits = q[r].reshape(H, d).astype(np.float64) @ k.T.astype(np.float64)
        s = (w[r][:, None] * np.maximum(logits, 0)).sum(0)[:visible[r]]
        order = sorted(range(visible[r]), key=lambda u: (-s[u], u))
        kr = min(top_k, visible[r])
        want = order[:kr] + [-1] * (top_k - kr)
        got = list(idx[r])
        exact += got == want
        if got != want:
            # near-ties only: every differing key's score within 1e-5 of the bar
            thr = s[order[kr - 1]]
            diff = set(got) ^ set(want)
            if any(u < 0 or abs(s[u] - thr) > 1e-5 for u in diff) or len(set(got) - {-1}) != kr:
                bad += 1
    print(f"indexer n_q {n_q} n_k {n_k} H {H} d {d} top {top_k} qb {Pl['qb']} splits {Pl['n_split']} cap {Pl['cap']}: {exact} rows exact, {bad} rows differ")
    assert bad == 0, "indexer emulation off the CPU's top-k"

def mla_block(P, Pl, bx, r, o_bar):
    H, r_kv, d_r, tau = P['H'], P['r_kv'], P['d_r'], P['tau']
    RB, BK = Pl['RB'], Pl['BK']; CS = 8 // RB; rows = 16 * RB
    d_lat = r_kv + d_r; h0 = bx * rows
    sm = Smem(Pl['smem'])
    visible = P['visible'][r]; n_sel = P['selected'].shape[1]
    seq = P['seq'][r] if P.get('seq') is not None else 0
    for e in range(rows * d_lat):
        i, x = e // d_lat, e % d_lat; h = h0 + i
        sm.st_bf(Pl['q_off'], i * Pl['ld_lat'] + x, P['q_hat'][r, h, x] if h < H else 0.0)
    m_run = [-np.inf] * rows; l_run = [f32(0)] * rows; alpha = [f32(1)] * rows
    key_width = BK // CS; col_width = r_kv // CS; o_tiles = col_width // 8
    o = {(w, j): new_c() for w in range(8) for j in range(16)}
    sc = np.zeros((rows, Pl['ld_score']), f32)
    kt = 0
    while kt < n_sel:
        kid = []
        for t in range(BK):
            j = kt + t
            u = P['selected'][r, j] if j < n_sel else -1
            kid.append(u if 0 <= u < visible else -1)
        for e in range(BK * d_lat):
            i, x = e // d_lat, e % d_lat; u = kid[i]
            sm.st_bf(Pl['k_off'], i * Pl['ld_lat'] + x, P['row'](seq, u)[x] if u >= 0 else 0.0)
        for warp in range(8):
            rb, cs = warp // CS, warp % CS
            c = [new_c(), new_c()]
            a_rows = Pl['q_off'] + 2 * (rb * 16 * Pl['ld_lat']); b_rows = Pl['k_off'] + 2 * (cs * key_width * Pl['ld_lat'])
            for kk in range(0, d_lat, 16):
                a = load_a(sm, a_rows + 2 * kk, Pl['ld_lat'])
                if key_width == 16:
                    b0, b1 = load_b2(sm, b_rows + 2 * kk, Pl['ld_lat'])
                    c[0] = mma(c[0], a, b0); c[1] = mma(c[1], a, b1)
                else:
                    b0 = load_b(sm, b_rows + 2 * kk, Pl['ld_lat'])
                    c[0] = mma(c[0], a, b0)
            for f in range(2):
                for lane in range(32):
                    for i in range(4):
                        if f * 8 >= key_width: continue
                        col = cs * key_width + f * 8 + c_col(lane, i)
                        sc[rb * 16 + c_row(lane, i), col] = c[f][lane, i] * f32(tau) if kid[col] >= 0 else -np.inf
        for warp in range(8):
            rb, cs = warp // CS, warp % CS
            if cs != 0: continue
            for row in range(rb * 16, rb * 16 + 16):
                mx = max(sc[row, :BK])
                m_old = m_run[row]; m_new = max(m_old, mx)
                a = f32(1) if m_new == -np.inf else f32(np.exp(f32(m_old - m_new)))
                s_ = f32(0)
                for kk in range(BK):
                    e_ = 0.0 if sc[row, kk] == -np.inf else np.exp(f32(sc[row, kk] - m_new))
                    sm.st_bf(Pl['prob_off'], row * Pl['ld_prob'] + kk, e_)
                    s_ = f32(s_ + sm.ld_bf(Pl['prob_off'], row * Pl['ld_prob'] + kk))
                m_run[row] = m_new; l_run[row] = f32(l_run[row] * a + s_); alpha[row] = a
        for warp in range(8):
            rb, cs = warp // CS, warp % CS
            for j in range(16):
                for lane in range(32):
                    g = lane >> 2
                    o[(warp, j)][lane, 0:2] *= alpha[rb * 16 + g]; o[(warp, j)][lane, 2:4] *= alpha[rb * 16 + g + 8]
            for kk in range(0, BK, 16):
                a = load_a(sm, Pl['prob_off'] + 2 * (rb * 16 * Pl['ld_prob'] + kk), Pl['ld_prob'])
                for j in range(0, 16, 2):
                    if j < o_tiles:
                        b0, b1 = load_b2_trans(sm, Pl['k_off'] + 2 * (kk * Pl['ld_lat'] + cs * col_width + j * 8), Pl['ld_lat'])
                        o[(warp, j)] = mma(o[(warp, j)], a, b0); o[(warp, j + 1)] = mma(o[(warp, j + 1)], a, b1)
        kt += BK
    for warp in range(8):
        rb, cs = warp // CS, warp % CS
        for lane in range(32):
            g = lane >> 2
            l_lo, l_hi = l_run[rb * 16 + g], l_run[rb * 16 + g + 8]
            inv_lo = 1 / l_lo if l_lo > 0 else 0; inv_hi = 1 / l_hi if l_hi > 0 else 0
            for j in range(o_tiles):
                for i in range(4):
                    h = h0 + rb * 16 + c_row(lane, i)
                    if h < H:
                        o_bar[r, h, cs * col_width + j * 8 + c_col(lane, i)] = o[(warp, j)][lane, i] * (inv_lo if i < 2 else inv_hi)

def check_mla(n_q, H, r_kv, d_r, n_keys, n_sel):
    rng = np.random.default_rng(4)
    d_lat = r_kv + d_r
    Pl = plan('mla', H, r_kv, d_r)
    q_hat = bfr(rng.standard_normal((n_q, H, d_lat)) * 0.5)
    cache = bfr(rng.standard_normal((n_keys, d_lat)))
    visible = [n_keys - (r % 3) * 10 for r in range(n_q)]
    sel = np.full((n_q, n_sel), -1, np.int64)
    for r in range(n_q):
        m = min(n_sel - 5, n_keys)
        sel[r, :m] = rng.choice(n_keys, m, replace=False)
    sel[0, :] = -1  # a query with no key
    tau = 0.07
    P = dict(H=H, r_kv=r_kv, d_r=d_r, tau=tau, q_hat=q_hat, row=lambda s, u: cache[u], visible=visible, selected=sel)
    o_bar = np.zeros((n_q, H, r_kv), f32)
    for r in range(n_q):
        for bx in range(Pl['head_tiles']):
            mla_block(P, Pl, bx, r, o_bar)
    want = np.zeros_like(o_bar, dtype=np.float64)
    for r in range(n_q):
        keys = [u for u in sel[r] if 0 <= u < visible[r]]
        if not keys: continue
        L = cache[keys].astype(np.float64)
        s = tau * q_hat[r].astype(np.float64) @ L.T
        p = np.exp(s - s.max(1, keepdims=True)); p /= p.sum(1, keepdims=True)
        want[r] = p @ L[:, :r_kv]
    err = np.linalg.norm(o_bar - want) / np.linalg.norm(want)
    print(f"mla n_q {n_q} H {H} r_kv {r_kv} d_r {d_r} RB {Pl['RB']} tiles {Pl['head_tiles']}: err {err:.2e}, zero row max {np.abs(o_bar[0]).max()}")
    assert err < 1e-2 and np.abs(o_bar[0]).max() == 0, "sparse MLA emulation off the reference"

def check_step(H_I, d_I, top_k, H, r_kv, d_r, parts, n_sm=132):
    """The GPU model's fused DSA step (src/backend/cuda/mla_attend.cpp attend_fused): every row
    of a step (parts: pos0:count per sequence) through the indexer with queries_per_block and seq
    as the model passes them, visible = position + 1, top_k = min(top_k, longest context), keys at
    column d_lat of paged rows [c_kv | k_r | k_idx]; then sparse MLA over the selection. Against
    ops::indexer_mask + attend_absorbed: each row's top min(top_k, visible) keys of its own
    visible ones (near-ties aside), then softmax attention over them."""
    rng = np.random.default_rng(5)
    seqs = [tuple(int(v) for v in p.split(':')) for p in parts.split(',')]
    d_lat = r_kv + d_r; row_stride = d_lat + d_I + 4; pt = 8; layer_off = 12
    page_stride = layer_off + pt * row_stride + 8
    lengths = [p0 + c for p0, c in seqs]
    n_pages = sum((n + pt - 1) // pt for n in lengths); max_pages = max((n + pt - 1) // pt for n in lengths)
    flat = bfr(rng.standard_normal(n_pages * page_stride))
    table = np.full((len(seqs), max_pages), -1, np.int64); nxt = 0
    for b, n in enumerate(lengths):  # pages in a shuffled order (7 coprime to most counts)
        for j in range((n + pt - 1) // pt):
            table[b, j] = (nxt * 7 + 3) % n_pages; nxt += 1
    def paged(col, width):  # fused_common.cuh paged_row over the layer's rows from column col
        return lambda b, u: flat[table[b, u // pt] * page_stride + layer_off + (u % pt) * row_stride + col:][:width]
    row_seq, visible = [], []
    for b, (p0, c) in enumerate(seqs):
        row_seq += [b] * c; visible += [p0 + t + 1 for t in range(c)]
    n = len(row_seq); max_visible = max(lengths); one_seq = len(seqs) == 1
    k_sel = min(top_k, max_visible)
    q = bfr(rng.standard_normal((n, H_I * d_I))); w = (rng.standard_normal((n, H_I)) * 0.1).astype(f32)
    q_hat = bfr(rng.standard_normal((n, H, d_lat)) * 0.5); tau = 0.1
    Pi = plan('indexer', n, max_visible, H_I, d_I, k_sel, int(one_seq), n_sm)
    assert Pi['supported'], "indexer plan refused"
    P = dict(H=H_I, d=d_I, top_k=k_sel, n_q=n, q=q, w=w, visible=visible,
             seq=None if Pi['qb'] == 2 else row_seq, key=paged(d_lat, d_I))
    idx = indexer(P, Pi)
    Pm = plan('mla', H, r_kv, d_r)
    Pa = dict(H=H, r_kv=r_kv, d_r=d_r, tau=tau, q_hat=q_hat, row=paged(0, d_lat), visible=visible,
              selected=idx, seq=row_seq)
    o_bar = np.zeros((n, H, r_kv), f32)
    for r in range(n):
        for bx in range(Pm['head_tiles']):
            mla_block(Pa, Pm, bx, r, o_bar)
    want = np.zeros((n, H, r_kv)); bad = 0
    for r in range(n):
        b, v = row_seq[r], visible[r]
        K = np.array([paged(d_lat, d_I)(b, u) for u in range(v)], np.float64)
        s_ = (w[r][:, None] * np.maximum(q[r].reshape(H_I, d_I).astype(np.float64) @ K.T, 0)).sum(0)
        order = sorted(range(v), key=lambda u: (-s_[u], u)); kr = min(top_k, v)
        got = [u for u in idx[r] if u >= 0]
        if set(got) != set(order[:kr]) and (len(got) != kr or any(abs(s_[u] - s_[order[kr - 1]]) > 1e-5 for u in set(got) ^ set(order[:kr]))):
            bad += 1
        L = np.array([paged(0, d_lat)(b, u) for u in got], np.float64)
        sc = tau * q_hat[r].astype(np.float64) @ L.T
        pr = np.exp(sc - sc.max(1, keepdims=True)); pr /= pr.sum(1, keepdims=True)
        want[r] = pr @ L[:, :r_kv]
    err = np.linalg.norm(o_bar - want) / np.linalg.norm(want)
    print(f"step {parts} H_I {H_I} top {top_k} (k {k_sel}) qb {Pi['qb']} splits {Pi['n_split']}: {bad} rows off the CPU's top-k, ō err {err:.2e}")
    assert bad == 0 and err < 1e-2, "fused DSA step emulation off the CPU model's semantics"

if __name__ == '__main__':
    which = sys.argv[1]
    if which == 'indexer':
        check_indexer(*[int(a) for a in sys.argv[2:]])
    elif which == 'step':
        check_step(*[int(a) for a in sys.argv[2:8]], sys.argv[8])
    else:
        check_mla(*[int(a) for a in sys.argv[2:]])
