# src/backend/cuda/kda_chunk.cu emulated line by line (one block at a time) over the C++
# planner's layout, against the naive recurrence in float64: the scalar phases as loops over
# threads with the kernel's index expressions, the tensor-core jobs through fragments.py.
# Usage: kda_chunk.py K V len,len,... (fails above a normalised error of 1e-2).
import sys

import numpy as np

from fragments import *

kC, kB, kNB, kThreads, kWarps = 64, 16, 4, 256, 8
def pair_index(I, J): return I * (I - 1) // 2 + J
def pair_row(p): return 1 if p < 1 else 2 if p < 3 else 3
def pair_col(p): return p - pair_index(pair_row(p), 0)

def layout(K, V):
    return plan('kda', K, V)

f32 = np.float32
def run_block(P, L, h, seq, y0):
    K, V, H, BV = P['K'], P['V'], P['H'], L['bv']
    sm = Smem(L['bytes'])
    F = lambda name, idx: sm.f32(L[name] + 4 * idx, 1)   # fp32 element view
    def rdf(name, idx): return float(F(name, idx)[0])
    def wrf(name, idx, v): F(name, idx)[0] = np.float32(v)
    def rdb(name, idx): return sm.ld_bf(L[name], idx)
    def wrb(name, idx, v): sm.st_bf(L[name], idx, np.float32(v))
    begin, end = P['seq_start'][seq], P['seq_start'][seq + 1]
    slot = P['slot'][seq]
    S = P['S'][slot, h]  # [K, V] view
    for e in range(K * BV):
        x, y = e // BV, e % BV
        v = S[x, y0 + y]
        wrf('s32', x * L['ld_s'] + y, v); wrb('s16', x * L['ld_v'] + y, v)
    t0 = begin
    while t0 < end:
        Lc = min(kC, end - t0)
        # stage
        for e in range(kC * K):
            i, x = e // K, e % K
            gv = qv = kv = 0.0
            if i < Lc:
                gv = P['g'][t0 + i, h, x]; qv = P['q'][t0 + i, h, x]; kv = P['k'][t0 + i, h, x]
            wrf('a32', i * K + x, np.exp(np.float32(gv)))
            wrb('q16', i * L['ld_k'] + x, qv); wrb('k16', i * L['ld_k'] + x, kv)
        for i in range(kC):
            wrf('beta', i, P['beta'][t0 + i, h] if i < Lc else 0.0)
        # sub_block_factors
        for x in range(K):
            tot = [0.0] * kNB
            for b in range(kNB):
                f = f32(1)
                for r in range(kB):
                    i = b * kB + r
                    f = f32(f * rdf('a32', i * K + x))
                    if b > 0:
                        row = i - kB
                        wrb('qi16', row * L['ld_k'] + x, f32(rdb('q16', i * L['ld_k'] + x)) * f)
                        wrb('ki16', row * L['ld_k'] + x, f32(rdb('k16', i * L['ld_k'] + x)) * f)
                tot[b] = f
            for J in range(kNB - 1):
                e_ = f32(1)
                for r in range(kB - 1, -1, -1):
                    j = J * kB + r
                    kj = f32(f32(rdb('k16', j * L['ld_k'] + x)) * e_)
                    fac = f32(1)
                    for I in range(J + 1, kNB):
                        wrb('r16', (pair_index(I, J) * kB + r) * L['ld_k'] + x, f32(kj * fac))
                        fac = f32(fac * tot[I])
                    e_ = f32(e_ * rdf('a32', j * K + x))
        # triangles
        for warp in range(kWarps):
            for job in range(warp, 12, kWarps):
                qk = job >= 6
                pr = job % 6; I = pair_row(pr); J = pair_col(pr)
                a = L['qi16' if qk else 'ki16'] + 2 * ((I - 1) * kB * L['ld_k'])
                bb = L['r16'] + 2 * (pr * kB * L['ld_k'])
                c0, c1 = new_c(), new_c()
                for kk in range(0, K, 16):
                    fa = load_a(sm, a + 2 * kk, L['ld_k'])
                    b0, b1 = load_b2(sm, bb + 2 * kk, L['ld_k'])
                    c0 = mma(c0, fa, b0); c1 = mma(c1, fa, b1)
                out = L['aqk32' if qk else 'akk32'] + 4 * (I * kB * L['ld_cf'] + J * kB)
                store_c(sm, out, L['ld_cf'], c0); store_c(sm, out + 4 * 8, L['ld_cf'], c1)
            for i in range(warp, kC, kWarps):
                first = i // kB * kB
                qi = np.zeros((32, 4), f32); ki = np.zeros((32, 4), f32); E = np.ones((32, 4), f32)
                for lane in range(32):
                    for m in range(4):
                        x = lane + 32 * m
                        qi[lane, m] = rdb('q16', i * L['ld_k'] + x) if x < K else 0
                        ki[lane, m] = rdb('k16', i * L['ld_k'] + x) if x < K else 0
                for j in range(i, first - 1, -1):
                    pk = np.zeros(32, f32); pq = np.zeros(32, f32)
                    for lane in range(32):
                        for m in range(4):
                            x = lane + 32 * m
                            if x < K:
                                kj = f32(rdb('k16', j * L['ld_k'] + x) * E[lane, m])
                                pk[lane] += ki[lane, m] * kj; pq[lane] += qi[lane, m] * kj
                                E[lane, m] = f32(E[lane, m] * rdf('a32', j * K + x))
                    wrf('akk32', i * L['ld_cf'] + j, pk.sum(dtype=f32) if j < i else 0.0)
                    wrf('aqk32', i * L['ld_cf'] + j, pq.sum(dtype=f32))
                for lane in range(32):
                    for j in range(i + 1 + lane, kC, 32):
                        wrf('akk32', i * L['ld_cf'] + j, 0.0); wrf('aqk32', i * L['ld_cf'] + j, 0.0)
        # chunk_factors
        for x in range(K):
            pre = f32(1)
            for i in range(kC):
                pre = f32(pre * rdf('a32', i * K + x))
                wrb('qg16', i * L['ld_k'] + x, f32(rdb('q16', i * L['ld_k'] + x)) * pre)
                wrb('kg16', i * L['ld_k'] + x, f32(rdb('k16', i * L['ld_k'] + x)) * pre)
            wrf('dec', x, pre)
            suf = f32(1)
            for i in range(kC - 1, -1, -1):
                wrb('kl16', i * L['ld_k'] + x, f32(rdb('k16', i * L['ld_k'] + x)) * suf)
                suf = f32(suf * rdf('a32', i * K + x))
        # prepare
        for e in range(kC * kC):
            i, j = e // kC, e % kC
            wrb('aqk16', i * L['ld_c'] + j, rdf('aqk32', i * L['ld_cf'] + j))
            wrf('akk32', i * L['ld_cf'] + j, f32(rdf('akk32', i * L['ld_cf'] + j)) * f32(rdf('beta', i)))
        for e in range(kC * BV):
            i, y = e // BV, e % BV
            wrb('v16', i * L['ld_v'] + y, P['v'][t0 + i, h, y0 + y] if i < Lc else 0.0)
        # solve
        ld = L['ld_cf']
        M = lambda idx: rdf('akk32', idx)
        for tid in range(kNB * kB):
            o, jj = tid // kB * kB, tid % kB
            col = [f32(0)] * kB
            for i in range(kB):
                acc = f32(0)
                for l in range(i):
                    acc = f32(acc + f32(M((o + i) * ld + o + l)) * col[l])
                col[i] = f32(0) if i < jj else f32(1) if i == jj else f32(-acc)
            for i in range(kB):
                wrf('aqk32', (o + i) * ld + o + jj, col[i])
        for dist in range(1, kNB):
            n_blk = kNB - dist
            for e in range(n_blk * kB * kB):
                J, r, c, I = e // (kB * kB), e // kB % kB, e % kB, e // (kB * kB) + dist
                acc = f32(0)
                for l in range(J * kB, I * kB):
                    acc = f32(acc + f32(M((I * kB + r) * ld + l)) * f32(rdf('aqk32', l * ld + J * kB + c)))
                wrf('x32', (J * kB + r) * kB + c, acc)
            for e in range(n_blk * kB * kB):
                J, r, c, I = e // (kB * kB), e // kB % kB, e % kB, e // (kB * kB) + dist
                acc = f32(0)
                for l in range(kB):
                    acc = f32(acc + f32(rdf('aqk32', (I * kB + r) * ld + I * kB + l)) * f32(rdf('x32', (J * kB + l) * kB + c)))
                wrf('aqk32', (I * kB + r) * ld + J * kB + c, -acc)
        for e in range(kC * kC):
            i, j = e // kC, e % kC
            wrb('t16', i * L['ld_c'] + j, rdf('aqk32', i * ld + j) * rdf('beta', j) if j <= i else 0.0)
        # products_w
        for job in range(4 * (K // 16)):
            mt, nt = job % 4, job // 4
            c0, c1 = new_c(), new_c()
            for kk in range(0, mt * 16 + 1, 16):
                fa = load_a(sm, L['t16'] + 2 * (mt * 16 * L['ld_c'] + kk), L['ld_c'])
                b0, b1 = load_b2_trans(sm, L['kg16'] + 2 * (kk * L['ld_k'] + nt * 16), L['ld_k'])
                c0 = mma(c0, fa, b0); c1 = mma(c1, fa, b1)
            out = L['w16'] + 2 * (mt * 16 * L['ld_k'] + nt * 16)
            store_c_bf16(sm, out, L['ld_k'], c0, -1.0); store_c_bf16(sm, out + 16, L['ld_k'], c1, -1.0)
        # products_vp
        for job in range(4 * (BV // 16)):
            mt, nt = job % 4, job // 4
            c0, c1 = new_c(), new_c()
            for kk in range(0, mt * 16 + 1, 16):
                fa = load_a(sm, L['t16'] + 2 * (mt * 16 * L['ld_c'] + kk), L['ld_c'])
                b0, b1 = load_b2_trans(sm, L['v16'] + 2 * (kk * L['ld_v'] + nt * 16), L['ld_v'])
                c0 = mma(c0, fa, b0); c1 = mma(c1, fa, b1)
            for kk in range(0, K, 16):
                fa = load_a(sm, L['w16'] + 2 * (mt * 16 * L['ld_k'] + kk), L['ld_k'])
                b0, b1 = load_b2_trans(sm, L['s16'] + 2 * (kk * L['ld_v'] + nt * 16), L['ld_v'])
                c0 = mma(c0, fa, b0); c1 = mma(c1, fa, b1)
            out = L['vp16'] + 2 * (mt * 16 * L['ld_v'] + nt * 16)
            store_c_bf16(sm, out, L['ld_v'], c0); store_c_bf16(sm, out + 16, L['ld_v'], c1)
        # products_out
        o_jobs, s_jobs = 4 * (BV // 16), (K // 16) * (BV // 16)
        for job in range(o_jobs + s_jobs):
            c = [new_c(), new_c()]
            if job < o_jobs:
                mt, nt = job % 4, job // 4
                for kk in range(0, K, 16):
                    fa = load_a(sm, L['qg16'] + 2 * (mt * 16 * L['ld_k'] + kk), L['ld_k'])
                    b0, b1 = load_b2_trans(sm, L['s16'] + 2 * (kk * L['ld_v'] + nt * 16), L['ld_v'])
                    c[0] = mma(c[0], fa, b0); c[1] = mma(c[1], fa, b1)
                for kk in range(0, mt * 16 + 1, 16):
                    fa = load_a(sm, L['aqk16'] + 2 * (mt * 16 * L['ld_c'] + kk), L['ld_c'])
                    b0, b1 = load_b2_trans(sm, L['vp16'] + 2 * (kk * L['ld_v'] + nt * 16), L['ld_v'])
                    c[0] = mma(c[0], fa, b0); c[1] = mma(c[1], fa, b1)
                for f in range(2):
                    for lane in range(32):
                        for i in range(4):
                            row = mt * 16 + c_row(lane, i)
                            if row < Lc:
                                P['o'][t0 + row, h, y0 + nt * 16 + f * 8 + c_col(lane, i)] = c[f][lane, i]
            else:
                sj = job - o_jobs; xt = sj % (K // 16); nt = sj // (K // 16)
                base = L['s32'] + 4 * (xt * 16 * L['ld_s'] + nt * 16)
                for f in range(2):
                    for lane in range(32):
                        for i in range(4):
                            c[f][lane, i] = float(sm.f32(base + 4 * (c_row(lane, i) * L['ld_s'] + f * 8 + c_col(lane, i)), 1)[0]) * rdf('dec', xt * 16 + c_row(lane, i))
                for kk in range(0, kC, 16):
                    fa = load_a_trans(sm, L['kl16'] + 2 * (kk * L['ld_k'] + xt * 16), L['ld_k'])
                    b0, b1 = load_b2_trans(sm, L['vp16'] + 2 * (kk * L['ld_v'] + nt * 16), L['ld_v'])
                    c[0] = mma(c[0], fa, b0); c[1] = mma(c[1], fa, b1)
                store_c(sm, base, L['ld_s'], c[0]); store_c(sm, base + 32, L['ld_s'], c[1])
        for e in range(K * BV):
            x, y = e // BV, e % BV
            wrb('s16', x * L['ld_v'] + y, rdf('s32', x * L['ld_s'] + y))
        t0 += kC
    for e in range(K * BV):
        x, y = e // BV, e % BV
        S[x, y0 + y] = rdf('s32', x * L['ld_s'] + y)

def recurrent(q, k, v, g, beta, S):
    S = S.astype(np.float64).copy()
    T, H, K = q.shape
    o = np.zeros((T, H, v.shape[2]))
    for h in range(H):
        for t in range(T):
            S[h] *= np.exp(g[t, h])[:, None]
            u = beta[t, h] * (v[t, h] - S[h].T @ k[t, h])
            S[h] += np.outer(k[t, h], u)
            o[t, h] = S[h].T @ q[t, h]
    return o, S

def main(K, V, lengths, H=1):
    rng = np.random.default_rng(5)
    L = layout(K, V)
    start = np.concatenate([[0], np.cumsum(lengths)]).astype(int)
    T = start[-1]; B = len(lengths)
    q = rng.standard_normal((T, H, K)).astype(f32); k = rng.standard_normal((T, H, K)).astype(f32)
    q /= np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6); q *= K ** -0.5
    k /= np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    q = bits_f32(bf16_bits(q)).reshape(q.shape); k = bits_f32(bf16_bits(k)).reshape(k.shape)
    v = bits_f32(bf16_bits(rng.standard_normal((T, H, V)))).reshape(T, H, V)
    g = -np.abs(rng.standard_normal((T, H, K)) * 2).astype(f32)
    beta = (1 / (1 + np.exp(-rng.standard_normal((T, H))))).astype(f32)
    S0 = (rng.standard_normal((B + 1, H, K, V)) * 0.3).astype(f32)
    slot = [B - b for b in range(B)]
    P = dict(K=K, V=V, H=H, seq_start=start, slot=slot, q=q, k=k, v=v, g=g, beta=beta,
             S=S0.copy(), o=np.zeros((T, H, V), f32))
    for seq in range(B):
        for h in range(H):
            for y0 in range(0, V, L['bv']):
                run_block(P, L, h, seq, y0)
    o_ref = np.zeros((T, H, V)); S_ref = S0.astype(np.float64).copy()
    for b in range(B):
        sl = slice(start[b], start[b + 1])
        o_ref[sl], S_ref[slot[b]] = recurrent(q[sl], k[sl], v[sl], g[sl], beta[sl], S0[slot[b]])
    eo = np.linalg.norm(P['o'] - o_ref) / np.linalg.norm(o_ref)
    eS = np.linalg.norm(P['S'] - S_ref) / np.linalg.norm(S_ref)
    print(f"kda chunk K {K} V {V} bv {L['bv']} lengths {lengths}: o {eo:.2e} S {eS:.2e}")
    assert eo < 1e-2 and eS < 1e-2, "kda chunk emulation off the recurrence"

if __name__ == '__main__':
    main(int(sys.argv[1]), int(sys.argv[2]), [int(x) for x in sys.argv[3].split(',')])
