# The warp-level pieces of src/backend/cuda/mma.cuh emulated over a byte-addressed shared memory,
# for the kernel emulations of tests/emulate: ldmatrix (.x2/.x4, .trans) and mma.m16n8k16 (bf16
# in, fp32 accumulation) as the PTX ISA defines them, and the load_a / load_b helpers with
# mma.cuh's lane address formulas (every row address checked 16-byte aligned); the plans come
# from the C++ planner (plans.cpp, built by run.sh). Run alone, it checks each loader against the
# tile it claims to load.
import ast
import os
import subprocess

import numpy as np


def plan(*args):
    """The C++ planner's plan for args (plans.cpp), as a dict."""
    exe = os.environ.get("HYMOE_PLANS", "build/emulate/plans")
    return ast.literal_eval(subprocess.check_output([exe] + [str(a) for a in args]).decode())

def bf16_bits(x):
    x = np.atleast_1d(np.asarray(x, dtype=np.float32))
    b = x.view(np.uint32).astype(np.uint64)
    r = (((b + np.uint64(0x7FFF) + ((b >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)) & np.uint64(0xFFFF)).astype(np.uint16)
    return r

def bits_f32(h):
    a = np.asarray(h, dtype=np.uint32)
    r = (np.atleast_1d(a) << np.uint32(16)).view(np.float32)
    return r.reshape(a.shape) if a.ndim else r[0]

class Smem:
    def __init__(self, nbytes):
        self.mem = np.zeros(nbytes, dtype=np.uint8)
    def f32(self, off, n):
        assert off % 4 == 0
        return self.mem[off:off + 4 * n].view(np.float32)
    def u16(self, off, n):
        assert off % 2 == 0
        return self.mem[off:off + 2 * n].view(np.uint16)
    # element accessors by byte offset base + index
    def st_bf(self, base, idx, val):
        self.u16(base + 2 * idx, 1)[0] = bf16_bits(np.float32(val))[0]
    def ld_bf(self, base, idx):
        return float(bits_f32(self.u16(base + 2 * idx, 1)[0]))

def ldmatrix(sm, addrs, n, trans):
    # addrs: 32 byte addresses (one per lane); matrix i uses lanes 8i..8i+7 as its rows.
    # returns regs[lane][i] = (lo, hi) bf16 values (as float)
    regs = [[None] * n for _ in range(32)]
    for i in range(n):
        rows = []
        for r in range(8):
            a = addrs[8 * i + r]
            assert a % 16 == 0, f"ldmatrix row address {a} not 16-byte aligned"
            rows.append(bits_f32(sm.u16(a, 8)))
        M = np.array(rows)  # [8 rows][8 cols]
        for lane in range(32):
            g, t = lane // 4, lane % 4
            if not trans:
                regs[lane][i] = (M[g, 2 * t], M[g, 2 * t + 1])
            else:
                regs[lane][i] = (M[2 * t, g], M[2 * t + 1, g])
    return regs

# helpers mirroring mma.cuh; base = byte address of tile origin; ld in elements
def load_a(sm, base, ld):
    addrs = [base + 2 * ((l & 15) * ld + (l >> 4) * 8) for l in range(32)]
    return ldmatrix(sm, addrs, 4, False)
def load_a_trans(sm, base, ld):
    addrs = [base + 2 * (((l & 7) + (l >> 4) * 8) * ld + ((l >> 3) & 1) * 8) for l in range(32)]
    return ldmatrix(sm, addrs, 4, True)
def load_b(sm, base, ld):
    addrs = [base + 2 * (((l & 15) & 7) * ld + ((l & 15) >> 3) * 8) for l in range(32)]
    return ldmatrix(sm, addrs, 2, False)
def load_b2(sm, base, ld):
    addrs = [base + 2 * (((l & 7) + (l >> 4) * 8) * ld + ((l >> 3) & 1) * 8) for l in range(32)]
    r = ldmatrix(sm, addrs, 4, False)
    return [[x[0], x[1]] for x in r], [[x[2], x[3]] for x in r]
def load_b2_trans(sm, base, ld):
    addrs = [base + 2 * (((l & 7) + ((l >> 3) & 1) * 8) * ld + (l >> 4) * 8) for l in range(32)]
    r = ldmatrix(sm, addrs, 4, True)
    return [[x[0], x[1]] for x in r], [[x[2], x[3]] for x in r]

def frag_a_matrix(fa):
    A = np.zeros((16, 16), np.float32)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        A[g, 2*t:2*t+2] = fa[lane][0]; A[g+8, 2*t:2*t+2] = fa[lane][1]
        A[g, 2*t+8:2*t+10] = fa[lane][2]; A[g+8, 2*t+8:2*t+10] = fa[lane][3]
    return A
def frag_b_matrix(fb):
    B = np.zeros((16, 8), np.float32)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        B[2*t:2*t+2, g] = fb[lane][0]; B[2*t+8:2*t+10, g] = fb[lane][1]
    return B

def new_c():
    return np.zeros((32, 4), np.float32)
def c_matrix(c):
    C = np.zeros((16, 8), np.float32)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        C[g, 2*t] = c[lane, 0]; C[g, 2*t+1] = c[lane, 1]; C[g+8, 2*t] = c[lane, 2]; C[g+8, 2*t+1] = c[lane, 3]
    return C
def c_from_matrix(C):
    c = new_c()
    for lane in range(32):
        g, t = lane // 4, lane % 4
        c[lane] = [C[g, 2*t], C[g, 2*t+1], C[g+8, 2*t], C[g+8, 2*t+1]]
    return c
def mma(c, fa, fb):
    return c_from_matrix((c_matrix(c).astype(np.float64) + frag_a_matrix(fa).astype(np.float64) @ frag_b_matrix(fb).astype(np.float64)).astype(np.float32))
def c_row(lane, i): return lane // 4 + (i >> 1) * 8
def c_col(lane, i): return (lane & 3) * 2 + (i & 1)
def store_c(sm, base_f32, ld, c, scale=1.0):
    for lane in range(32):
        for i in range(4):
            sm.f32(base_f32 + 4 * (c_row(lane, i) * ld + c_col(lane, i)), 1)[0] = c[lane, i] * scale
def store_c_bf16(sm, base, ld, c, scale=1.0):
    for lane in range(32):
        for i in range(4):
            sm.st_bf(base, c_row(lane, i) * ld + c_col(lane, i), c[lane, i] * scale)

if __name__ == "__main__":
    # self-check: every loader against the matrix it claims to load
    rng = np.random.default_rng(1)
    sm = Smem(1 << 16)
    ld = 24
    M = rng.standard_normal((16, ld)).astype(np.float32)
    for r in range(16):
        for c in range(ld):
            sm.st_bf(0, r * ld + c, M[r, c])
    Mb = bits_f32(bf16_bits(M))
    assert np.array_equal(frag_a_matrix(load_a(sm, 0, ld)), Mb[:, :16])
    assert np.array_equal(frag_a_matrix(load_a_trans(sm, 0, ld)), Mb[:16, :16].T)
    assert np.array_equal(frag_b_matrix(load_b(sm, 0, ld)), Mb[:8, :16].T)
    b0, b1 = load_b2(sm, 0, ld)
    assert np.array_equal(frag_b_matrix(b0), Mb[:8, :16].T) and np.array_equal(frag_b_matrix(b1), Mb[8:16, :16].T)
    b0, b1 = load_b2_trans(sm, 0, ld)
    assert np.array_equal(frag_b_matrix(b0), Mb[:16, :8]) and np.array_equal(frag_b_matrix(b1), Mb[:16, 8:16])
    print("loaders ok")
