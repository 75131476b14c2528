// The batch-invariant GEMM (gemm_invariant.h): one thread an element of C, a block a 16 × 16 tile,
// op(A) and op(B) staged 16 columns of k at a time in shared memory (zero outside the matrices),
// and each thread's sum one fmaf chain over k = 0, 1, ..., k − 1.
#include "gemm_invariant.h"
#include "kernels.h"

namespace hymoe::backend::cuda {

namespace {

constexpr int kTile = 16;

template <class Ti, class To>
__global__ void gemm_invariant_kernel(bool trans_a,
                                      bool trans_b,
                                      int64_t m,
                                      int64_t n,
                                      int64_t k,
                                      float alpha,
                                      const Ti* a,
                                      int64_t lda,
                                      const Ti* b,
                                      int64_t ldb,
                                      float beta,
                                      To* c,
                                      int64_t ldc) {
    __shared__ float as[kTile][kTile + 1];  // op(A) [row0 + y, k0 + x]
    __shared__ float bs[kTile][kTile + 1];  // op(B) [k0 + y, col0 + x]
    const int x = static_cast<int>(threadIdx.x), y = static_cast<int>(threadIdx.y);
    const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kTile;
    const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kTile;
    float acc = 0.0f;
    for (int64_t k0 = 0; k0 < k; k0 += kTile) {
        const int64_t ar = row0 + y, ak = k0 + x, bk = k0 + y, bc = col0 + x;
        as[y][x] = ar < m && ak < k ? load(a, trans_a ? ak * lda + ar : ar * lda + ak) : 0.0f;
        bs[y][x] = bk < k && bc < n ? load(b, trans_b ? bc * ldb + bk : bk * ldb + bc) : 0.0f;
        __syncthreads();
        const int64_t steps = k - k0 < kTile ? k - k0 : kTile;
        for (int kk = 0; kk < steps; ++kk)
            acc = fmaf(as[y][kk], bs[kk][x], acc);
        __syncthreads();
    }
    const int64_t row = row0 + y, col = col0 + x;
    if (row < m && col < n) {
        const int64_t i = row * ldc + col;
        store(c, i, beta == 0.0f ? alpha * acc : alpha * acc + beta * load(c, i));
    }
}

template <class Ti, class To>
void launch(const Stream& s,
            bool trans_a,
            bool trans_b,
            int64_t m,
            int64_t n,
            int64_t k,
            float alpha,
            const void* a,
            int64_t lda,
            const void* b,
            int64_t ldb,
            float beta,
            void* c,
            int64_t ldc) {
    const dim3 block(kTile, kTile);
    const dim3 grid(static_cast<unsigned>((n + kTile - 1) / kTile),
                    static_cast<unsigned>((m + kTile - 1) / kTile));
    gemm_invariant_kernel<Ti, To><<<grid, block, 0, s.get()>>>(trans_a,
                                                               trans_b,
                                                               m,
                                                               n,
                                                               k,
                                                               alpha,
                                                               static_cast<const Ti*>(a),
                                                               lda,
                                                               static_cast<const Ti*>(b),
                                                               ldb,
                                                               beta,
                                                               static_cast<To*>(c),
                                                               ldc);
    check_launch("gemm_invariant");
}

}  // namespace

void gemm_invariant(const Stream& s,
                    DType in,
                    DType out,
                    bool trans_a,
                    bool trans_b,
                    int64_t m,
                    int64_t n,
                    int64_t k,
                    float alpha,
                    const void* a,
                    int64_t lda,
                    const void* b,
                    int64_t ldb,
                    float beta,
                    void* c,
                    int64_t ldc) {
    HYMOE_CHECK((in == DType::f32 || in == DType::bf16) && (out == DType::f32 || out == in),
                "gemm_invariant: ",
                to_string(in),
                " inputs into ",
                to_string(out));
    HYMOE_CHECK((m + kTile - 1) / kTile <= 65535,
                "gemm_invariant: ",
                m,
                " rows exceed the grid's ",
                65535 * kTile);
    if (m == 0 || n == 0)
        return;
    if (in == DType::f32)
        launch<float, float>(s, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    else if (out == DType::f32)
        launch<bf16, float>(s, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    else
        launch<bf16, bf16>(s, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace hymoe::backend::cuda
