# src/backend/cuda/moe_gemm.cu's grouped GEMMs and combine, and moe_route.cu's dispatch plan,
# emulated with the kernels' index expressions, against model/moe.cpp's plan (exact) and the
# experts in float64 (normalised error below 1e-2). Usage: moe.py E top_k n_tok d inter
import sys

import numpy as np

from fragments import *
f32 = np.float32
kBM, kBK, kLd, kStages, kUpCols, kDownCols, kRankTile = 128, 32, 40, 3, 64, 128, 256

def bfr(x): return bits_f32(bf16_bits(np.asarray(x, f32))).reshape(np.shape(x))

def dispatch_plan(idx, E, k):
    n = len(idx); tiles = (n + kRankTile - 1) // kRankTile
    counts = np.zeros((tiles, E), int)
    for b in range(tiles):
        for t in range(kRankTile):
            a = b * kRankTile + t
            if a < n and idx[a] >= 0: counts[b, idx[a]] += 1
    total = counts.sum(0); rows = np.cumsum(total); tl = np.cumsum((total + kBM - 1) // kBM)
    offset = np.zeros(E + 1, int); tile_start = np.zeros(E + 1, int)
    for e in range(E):
        offset[e] = rows[e] - total[e]; tile_start[e] = tl[e] - (total[e] + kBM - 1) // kBM
    offset[E] = rows[E - 1]; tile_start[E] = tl[E - 1]
    for e in range(E):
        running = offset[e]
        for b in range(tiles):
            c = counts[b, e]; counts[b, e] = running; running += c
    row_of = np.full(n, -1); token_of = np.zeros(n, int)
    for b in range(tiles):
        wc = np.zeros((8, E), int); info = []
        for tid in range(kRankTile):
            a = b * kRankTile + tid; e = idx[a] if a < n else -1
            warp, lane = tid >> 5, tid & 31
            peers = [l for l in range(32) if ((b * kRankTile + warp * 32 + l) < n and idx[b * kRankTile + warp * 32 + l] == e) or ((b * kRankTile + warp * 32 + l) >= n and e == -1)]
            rank = sum(1 for l in peers if l < lane)
            if e >= 0 and rank == 0: wc[warp, e] = len(peers)
            info.append((a, e, rank, warp))
        for a, e, rank, warp in info:
            if a >= n or e < 0: continue
            row = counts[b, e] + rank + sum(wc[w, e] for w in range(warp))
            row_of[a] = row; token_of[row] = a // k
    return offset, tile_start, row_of, token_of

def find_tile(tile_start, offset, E, m):
    if m >= tile_start[E]: return None
    lo, hi = 0, E - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if tile_start[mid] <= m: lo = mid
        else: hi = mid - 1
    row0 = offset[lo] + (m - tile_start[lo]) * kBM
    return lo, row0, min(kBM, offset[lo + 1] - row0)

def run_up(D, P, m, ny, H):
    t = find_tile(D['tile_start'], D['offset'], D['E'], m)
    if t is None: return
    e, row0, rows = t
    n0 = ny * kUpCols
    smem_bytes = 2 * kStages * (kBM + 2 * kUpCols) * kLd
    sm = Smem(smem_bytes)
    a_s = 0; g_s = a_s + 2 * kStages * kBM * kLd; u_s = g_s + 2 * kStages * kUpCols * kLd
    d, inter = P['d'], P['inter']
    gate = {(w, i, j): new_c() for w in range(8) for i in range(4) for j in range(2)}
    up = {(w, i, j): new_c() for w in range(8) for i in range(4) for j in range(2)}
    for k0 in range(0, d, kBK):
        s = (k0 // kBK) % kStages
        for tid in range(256):
            a_row0, part = tid // 4, tid % 4; a_row1 = a_row0 + 64
            for r in (a_row0, a_row1):
                tok = D['token_of'][row0 + r] if r < rows else 0
                vals = P['x'][tok, k0 + part * 8: k0 + part * 8 + 8] if r < rows else np.zeros(8)
                base = a_s + 2 * (s * kBM * kLd + r * kLd + part * 8)
                sm.u16(base, 8)[:] = bf16_bits(vals)
            b_row = tid // 4
            for arr, off in ((P['w1'], g_s), (P['w3'], u_s)):
                vals = arr[e, n0 + b_row, k0 + part * 8: k0 + part * 8 + 8]
                sm.u16(off + 2 * (s * kUpCols * kLd + b_row * kLd + part * 8), 8)[:] = bf16_bits(vals)
        for warp in range(8):
            wm, wn = warp // 4, warp % 4
            a = a_s + 2 * (s * kBM * kLd + wm * 64 * kLd)
            g = g_s + 2 * (s * kUpCols * kLd + wn * 16 * kLd)
            u = u_s + 2 * (s * kUpCols * kLd + wn * 16 * kLd)
            for kk in range(0, kBK, 16):
                g0, g1 = load_b2(sm, g + 2 * kk, kLd); u0, u1 = load_b2(sm, u + 2 * kk, kLd)
                for i in range(4):
                    fa = load_a(sm, a + 2 * (i * 16 * kLd + kk), kLd)
                    gate[(warp, i, 0)] = mma(gate[(warp, i, 0)], fa, g0); gate[(warp, i, 1)] = mma(gate[(warp, i, 1)], fa, g1)
                    up[(warp, i, 0)] = mma(up[(warp, i, 0)], fa, u0); up[(warp, i, 1)] = mma(up[(warp, i, 1)], fa, u1)
    for warp in range(8):
        wm, wn = warp // 4, warp % 4
        for lane in range(32):
            for i in range(4):
                for j in range(2):
                    for half in range(2):
                        r = wm * 64 + i * 16 + c_row(lane, 2 * half)
                        if r >= rows: continue
                        v = []
                        for c in range(2):
                            gv = gate[(warp, i, j)][lane, 2 * half + c]; uv = up[(warp, i, j)][lane, 2 * half + c]
                            v.append(gv / (1 + np.exp(-gv)) * uv)
                        col = n0 + wn * 16 + j * 8 + c_col(lane, 2 * half)
                        H[row0 + r, col:col + 2] = bfr(np.array(v, f32))

def run_down(D, P, m, ny, H, OUT):
    t = find_tile(D['tile_start'], D['offset'], D['E'], m)
    if t is None: return
    e, row0, rows = t
    n0 = ny * kDownCols
    sm = Smem(2 * kStages * (kBM + kDownCols) * kLd)
    a_s = 0; b_s = 2 * kStages * kBM * kLd
    d, inter = P['d'], P['inter']
    acc = {(w, i, j): new_c() for w in range(8) for i in range(4) for j in range(4)}
    for k0 in range(0, inter, kBK):
        s = (k0 // kBK) % kStages
        for tid in range(256):
            r0, part = tid // 4, tid % 4
            for r in (r0, r0 + 64):
                vals = H[row0 + (r if r < rows else 0), k0 + part * 8: k0 + part * 8 + 8] if r < rows else np.zeros(8)
                sm.u16(a_s + 2 * (s * kBM * kLd + r * kLd + part * 8), 8)[:] = bf16_bits(vals)
                vals = P['w2'][e, n0 + r, k0 + part * 8: k0 + part * 8 + 8]
                sm.u16(b_s + 2 * (s * kDownCols * kLd + r * kLd + part * 8), 8)[:] = bf16_bits(vals)
        for warp in range(8):
            wm, wn = warp // 4, warp % 4
            a = a_s + 2 * (s * kBM * kLd + wm * 64 * kLd)
            b = b_s + 2 * (s * kDownCols * kLd + wn * 32 * kLd)
            for kk in range(0, kBK, 16):
                fb0, fb1 = load_b2(sm, b + 2 * kk, kLd); fb2, fb3 = load_b2(sm, b + 2 * (16 * kLd + kk), kLd)
                fb = [fb0, fb1, fb2, fb3]
                for i in range(4):
                    fa = load_a(sm, a + 2 * (i * 16 * kLd + kk), kLd)
                    for j in range(4):
                        acc[(warp, i, j)] = mma(acc[(warp, i, j)], fa, fb[j])
    for warp in range(8):
        wm, wn = warp // 4, warp % 4
        for lane in range(32):
            for i in range(4):
                for j in range(4):
                    for half in range(2):
                        r = wm * 64 + i * 16 + c_row(lane, 2 * half)
                        if r >= rows: continue
                        col = n0 + wn * 32 + j * 8 + c_col(lane, 2 * half)
                        OUT[row0 + r, col:col + 2] = bfr(acc[(warp, i, j)][lane, 2 * half:2 * half + 2])

def main(E=4, k=2, n_tok=150, d=128, inter=64):
    rng = np.random.default_rng(2)
    x = bfr(rng.standard_normal((n_tok, d)))
    w1 = bfr(rng.standard_normal((E, inter, d)) / np.sqrt(d)); w3 = bfr(rng.standard_normal((E, inter, d)) / np.sqrt(d))
    w2 = bfr(rng.standard_normal((E, d, inter)) / np.sqrt(inter))
    idx = np.array([rng.choice(E, k, replace=False) for _ in range(n_tok)]).reshape(-1)
    idx[5] = 0; idx[7] = 0
    wts = rng.random(n_tok * k).astype(f32)
    offset, tile_start, row_of, token_of = dispatch_plan(idx, E, k)
    # check the plan against plan_dispatch
    cur = list(offset[:E]); want = []
    for a in range(len(idx)):
        want.append(cur[idx[a]]); cur[idx[a]] += 1
    assert list(row_of) == want, "row_of"
    D = dict(E=E, offset=offset, tile_start=tile_start, token_of=token_of)
    P = dict(d=d, inter=inter, x=x, w1=w1, w3=w3, w2=w2)
    n_assign = n_tok * k
    row_tiles = (n_assign + kBM - 1) // kBM + min(E, n_assign)
    H = np.zeros((n_assign, inter), f32); OUT = np.zeros((n_assign, d), f32)
    for m in range(row_tiles):
        for ny in range(inter // kUpCols): run_up(D, P, m, ny, H)
    for m in range(row_tiles):
        for ny in range(d // kDownCols): run_down(D, P, m, ny, H, OUT)
    y = np.zeros((n_tok, d), f32)
    for t in range(n_tok):
        for i in range(k):
            r = row_of[t * k + i]
            y[t] += wts[t * k + i] * OUT[r]
    ref = np.zeros((n_tok, d))
    for t in range(n_tok):
        for i in range(k):
            e = idx[t * k + i]
            g = w1[e] @ x[t].astype(np.float64); u = w3[e] @ x[t].astype(np.float64)
            h = g / (1 + np.exp(-g)) * u
            ref[t] += wts[t * k + i] * (w2[e] @ h)
    err = np.linalg.norm(y - ref) / np.linalg.norm(ref)
    print(f"moe E {E} k {k} n_tok {n_tok} d {d} I {inter} row tiles {row_tiles} (used {tile_start[E]}): err {err:.2e}")
    assert err < 1e-2, "moe emulation off the reference"

if __name__ == '__main__':
    main(*[int(a) for a in sys.argv[1:]])
