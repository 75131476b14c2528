// Warp-level tensor-core pieces of the fused kernels (src/backend/cuda/*.cu only): the bf16
// mma.sync m16n8k16 with fp32 accumulation, ldmatrix loads of its operands from shared memory,
// and cp.async copies. Fragment layouts are the PTX ISA's; with g = lane / 4 and t = lane % 4:
//   A 16×16 (m × k):  x[0] = A[g][2t, 2t+1]    x[1] = A[g+8][2t, 2t+1]
//                     x[2] = A[g][2t+8, 2t+9]  x[3] = A[g+8][2t+8, 2t+9]
//   B 16×8  (k × n):  x[0] = B[2t, 2t+1][g]    x[1] = B[2t+8, 2t+9][g]
//   C 16×8  (m × n):  x[0], x[1] = C[g][2t, 2t+1]   x[2], x[3] = C[g+8][2t, 2t+1]
// (two bf16 per 32-bit register, the lower index in the low half). Operands in shared memory are
// bf16 tiles with a row stride `ld` (elements) that is a multiple of 8, so that every 8-element
// row segment an ldmatrix lane points at is 16-byte aligned; ld ≡ 8 (mod 64) also puts the eight
// rows of one 8×8 matrix in distinct banks. Names say how the operand is stored:
//   load_a        A stored [m][k] (k contiguous)      load_a_trans   A stored [k][m]
//   load_b, _b2   B stored [n][k] (k contiguous)      load_b2_trans  B stored [k][n]
// where _b2 loads the two n8 fragments of a 16-column slice.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

namespace hymoe::backend::cuda::mma {

struct FragA {
    uint32_t x[4];
};
struct FragB {
    uint32_t x[2];
};
struct FragC {
    float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
};

__device__ inline uint32_t smem_address(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ inline void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_address(row))
                 : "memory");
}
__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_address(row))
                 : "memory");
}
__device__ inline void ldmatrix_x2(uint32_t (&r)[2], const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(smem_address(row))
                 : "memory");
}

// The 16×16 A tile at `a` (row-major, stride ld). ldmatrix matrices 0..3 are (rows 0-7, k 0-7),
// (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15): lane l points at row l % 16,
// column 8·(l / 16).
__device__ inline void load_a(FragA& f, const __nv_bfloat16* a, int ld) {
    const int lane = threadIdx.x & 31;
    ldmatrix_x4(f.x, a + (lane & 15) * ld + (lane >> 4) * 8);
}

// The 16×16 A tile stored transposed at `at` (at[k][m], stride ld): the same four matrices read
// through .trans from the stored rows k: lane l points at stored row (l % 8) + 8·(l / 16),
// column 8·((l / 8) % 2).
__device__ inline void load_a_trans(FragA& f, const __nv_bfloat16* at, int ld) {
    const int lane = threadIdx.x & 31;
    ldmatrix_x4_trans(f.x, at + ((lane & 7) + (lane >> 4) * 8) * ld + ((lane >> 3) & 1) * 8);
}

// One n8 B fragment from b[n][k] (stride ld): matrices (n 0-7, k 0-7), (n 0-7, k 8-15); lanes
// 0..15 point at row l % 8, column 8·(l / 8) (lanes 16..31 repeat them).
__device__ inline void load_b(FragB& f, const __nv_bfloat16* b, int ld) {
    const int lane = threadIdx.x & 15;
    ldmatrix_x2(f.x, b + (lane & 7) * ld + (lane >> 3) * 8);
}

// Two n8 B fragments (columns 0-7 and 8-15) from b[n][k]: matrices (n 0-7, k 0-7),
// (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15); lane l points at row (l % 8) + 8·(l / 16),
// column 8·((l / 8) % 2).
__device__ inline void load_b2(FragB& f0, FragB& f1, const __nv_bfloat16* b, int ld) {
    const int lane = threadIdx.x & 31;
    uint32_t r[4];
    ldmatrix_x4(r, b + ((lane & 7) + (lane >> 4) * 8) * ld + ((lane >> 3) & 1) * 8);
    f0.x[0] = r[0];
    f0.x[1] = r[1];
    f1.x[0] = r[2];
    f1.x[1] = r[3];
}

// Two n8 B fragments from b stored [k][n] (stride ld), through .trans: matrices (k 0-7, n 0-7),
// (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15); lane l points at stored row
// (l % 8) + 8·((l / 8) % 2), column 8·(l / 16).
__device__ inline void load_b2_trans(FragB& f0, FragB& f1, const __nv_bfloat16* b, int ld) {
    const int lane = threadIdx.x & 31;
    uint32_t r[4];
    ldmatrix_x4_trans(r, b + ((lane & 7) + ((lane >> 3) & 1) * 8) * ld + (lane >> 4) * 8);
    f0.x[0] = r[0];
    f0.x[1] = r[1];
    f1.x[0] = r[2];
    f1.x[1] = r[3];
}

// c += a · b
__device__ inline void mma_bf16(FragC& c, const FragA& a, const FragB& b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c.x[0]), "+f"(c.x[1]), "+f"(c.x[2]), "+f"(c.x[3])
        : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(b.x[0]), "r"(b.x[1]));
}

// Two floats as one register of two bf16 (lo in the low half), rounded to nearest even.
__device__ inline uint32_t pack_bf16(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
}

// Row and column of C fragment element i within its 16×8 tile.
__device__ inline int c_row(int i) {
    return ((threadIdx.x & 31) >> 2) + (i >> 1) * 8;
}
__device__ inline int c_col(int i) {
    return (threadIdx.x & 3) * 2 + (i & 1);
}

// c (a 16×8 tile) · scale into fp32 rows at `out` (stride ld).
__device__ inline void store_c(float* out, int ld, const FragC& c, float scale = 1.0f) {
    const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    *reinterpret_cast<float2*>(out + g * ld + 2 * t) = make_float2(c.x[0] * scale, c.x[1] * scale);
    *reinterpret_cast<float2*>(out + (g + 8) * ld + 2 * t) =
        make_float2(c.x[2] * scale, c.x[3] * scale);
}

// c (a 16×8 tile) · scale into bf16 rows at `out` (stride ld, even).
__device__ inline void store_c_bf16(__nv_bfloat16* out,
                                    int ld,
                                    const FragC& c,
                                    float scale = 1.0f) {
    const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    *reinterpret_cast<uint32_t*>(out + g * ld + 2 * t) = pack_bf16(c.x[0] * scale, c.x[1] * scale);
    *reinterpret_cast<uint32_t*>(out + (g + 8) * ld + 2 * t) =
        pack_bf16(c.x[2] * scale, c.x[3] * scale);
}

// ---- cp.async (global -> shared, 16 bytes, bypassing L1) ---------------------------------------

// Copies 16 bytes, or writes 16 zero bytes when !valid (src must still be a valid address).
__device__ inline void cp_async16(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)),
                 "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
}
__device__ inline void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most n committed groups are still in flight.
template <int n>
__device__ inline void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(n) : "memory");
}

}  // namespace hymoe::backend::cuda::mma
