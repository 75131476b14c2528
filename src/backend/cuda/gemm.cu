// Blas (hymoe/backend/cuda_gemm.h): row-major products on cuBLAS's column-major interface. A
// row-major C [m, n] is the column-major Cᵀ [n, m], and Cᵀ = op(B)ᵀ op(A)ᵀ, so every call passes
// B before A with m and n swapped and the same transpose flags. Compute type is always
// CUBLAS_COMPUTE_32F (fp32 accumulation; with fp32 inputs no TF32, the default math mode).
// Under ops::set_batch_invariant (inference.batch_invariant) every product goes to
// gemm_invariant.h instead, whose rows do not depend on the call's other rows or its shape.
#include <climits>
#include <cstring>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "../cpu/weight_kernels.h"  // ops::detail::batch_invariant_on
#include "check.h"
#include "gemm_invariant.h"
#include "hymoe/backend/cuda_gemm.h"

namespace hymoe::backend::cuda {

namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // cuBLAS's recommendation for Hopper

cudaDataType_t cuda_type(DType t) {
    HYMOE_CHECK(t == DType::f32 || t == DType::bf16, "cuBLAS: dtype ", to_string(t));
    return t == DType::f32 ? CUDA_R_32F : CUDA_R_16BF;
}

int as_int(int64_t v, const char* what) {
    HYMOE_CHECK(v >= 0 && v <= INT_MAX, "cuBLAS: ", what, " = ", v, " exceeds the 32-bit API");
    return static_cast<int>(v);
}

int64_t rows_of(const Tensor& t) {
    return t.dim(-1) == 0 ? 0 : t.numel() / t.dim(-1);
}

void check_device(const Tensor& t, const char* op) {
    HYMOE_CHECK(t.device == Device::cuda, op, ": expected a device tensor, got a host one");
}

}  // namespace

Blas::Blas(const Stream& stream, DeviceArena& arena, int max_groups)
    : stream_(stream),
      arena_(arena),
      max_groups_(max_groups),
      host_tables_(3 * static_cast<size_t>(max_groups) * sizeof(void*)) {
    HYMOE_CUBLAS_CHECK(cublasCreate(&handle_), "new cuBLAS handle");
    workspace_ = arena_.allocate(kWorkspaceBytes);
    tables_ =
        static_cast<void**>(arena_.allocate(3 * static_cast<size_t>(max_groups) * sizeof(void*)));
    cudaEvent_t ev = nullptr;
    HYMOE_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "table event");
    tables_copied_ = ev;
    // cublasSetStream resets the workspace to cuBLAS's own pool: the stream first.
    HYMOE_CUBLAS_CHECK(cublasSetStream(handle_, stream_.get()), "cuBLAS stream");
    HYMOE_CUBLAS_CHECK(cublasSetWorkspace(handle_, workspace_, kWorkspaceBytes), "workspace");
    HYMOE_CUBLAS_CHECK(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH), "math mode");
}

Blas::~Blas() {
    cudaStreamSynchronize(stream_.get());  // the workspace and tables are in use until then
    cublasDestroy(handle_);
    cudaEventDestroy(tables_copied_);
    arena_.free(tables_);
    arena_.free(workspace_);
}

void Blas::gemm(DType in,
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
    HYMOE_CHECK(
        out == DType::f32 || out == in, "gemm: ", to_string(in), " inputs into ", to_string(out));
    if (m == 0 || n == 0)
        return;
    if (ops::detail::batch_invariant_on()) {
        gemm_invariant(
            stream_, in, out, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    HYMOE_CUBLAS_CHECK(cublasGemmEx(handle_,
                                    op_b,
                                    op_a,
                                    as_int(n, "n"),
                                    as_int(m, "m"),
                                    as_int(k, "k"),
                                    &alpha,
                                    b,
                                    cuda_type(in),
                                    as_int(ldb, "ldb"),
                                    a,
                                    cuda_type(in),
                                    as_int(lda, "lda"),
                                    &beta,
                                    c,
                                    cuda_type(out),
                                    as_int(ldc, "ldc"),
                                    CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT),
                       "gemm ",
                       m,
                       "x",
                       n,
                       "x",
                       k);
}

void Blas::linear(const Tensor& x, const Tensor& w, Tensor& y, float beta) {
    check_device(x, "linear");
    check_device(w, "linear");
    check_device(y, "linear");
    HYMOE_CHECK(w.shape.size() == 2 && x.dim(-1) == w.dim(1) && y.dim(-1) == w.dim(0) &&
                    rows_of(x) == rows_of(y) && x.dtype == w.dtype,
                "linear: x ",
                to_string(x.dtype),
                shape_string(x.shape),
                " w ",
                to_string(w.dtype),
                shape_string(w.shape),
                " y ",
                to_string(y.dtype),
                shape_string(y.shape));
    const int64_t n = rows_of(x), in = w.dim(1), out = w.dim(0);
    gemm(
        x.dtype, y.dtype, false, true, n, out, in, 1.0f, x.data, in, w.data, in, beta, y.data, out);
}

void Blas::grouped_linear(const Tensor& x,
                          const Tensor& w,
                          const std::vector<int64_t>& rows,
                          Tensor& y) {
    check_device(x, "grouped_linear");
    check_device(w, "grouped_linear");
    check_device(y, "grouped_linear");
    int64_t total = 0;
    for (int64_t r : rows) {
        HYMOE_CHECK(r >= 0, "grouped_linear: negative row count ", r);
        total += r;
    }
    HYMOE_CHECK(w.shape.size() == 3 && x.shape.size() == 2 && y.shape.size() == 2 &&
                    w.dim(0) == static_cast<int64_t>(rows.size()) && x.dim(1) == w.dim(2) &&
                    y.dim(1) == w.dim(1) && x.dim(0) == total && y.dim(0) == total &&
                    x.dtype == w.dtype &&
                    (y.dtype == w.dtype || (w.dtype == DType::bf16 && y.dtype == DType::f32)),
                "grouped_linear: x ",
                to_string(x.dtype),
                shape_string(x.shape),
                " w ",
                to_string(w.dtype),
                shape_string(w.shape),
                " y ",
                to_string(y.dtype),
                shape_string(y.shape),
                " rows of ",
                rows.size(),
                " experts summing to ",
                total);
    const int64_t out = w.dim(1), in = w.dim(2);
    const size_t es = dtype_size(x.dtype);
    // Each expert's rows as a product of its own: batch-invariant runs, and bf16 products into an
    // f32 y (cublasGemmGroupedBatchedEx writes C in its inputs' 16-bit type under
    // CUBLAS_COMPUTE_32F; cublasGemmEx, Blas::gemm, writes fp32).
    if (ops::detail::batch_invariant_on() || y.dtype != x.dtype) {
        int64_t row = 0;
        for (size_t e = 0; e < rows.size(); ++e) {
            gemm(x.dtype,
                 y.dtype,
                 false,
                 true,
                 rows[e],
                 out,
                 in,
                 1.0f,
                 x.ptr<char>() + row * in * static_cast<int64_t>(es),
                 in,
                 w.ptr<char>() + static_cast<int64_t>(e) * out * in * static_cast<int64_t>(es),
                 in,
                 0.0f,
                 y.ptr<char>() + row * out * static_cast<int64_t>(dtype_size(y.dtype)),
                 out);
            row += rows[e];
        }
        return;
    }
    // One group of one problem per expert with rows (groups may differ in m); column-major:
    // yᵀ_e [out, r_e] = (w_e as [in, out])ᵀ · (x_e as [in, r_e]).
    std::vector<int> m_arr, n_arr, k_arr, lda, ldb, ldc, group_size;
    std::vector<cublasOperation_t> op_a, op_b;
    std::vector<float> alpha, beta;
    std::vector<const void*> a_ptr, b_ptr;
    std::vector<void*> c_ptr;
    int64_t offset = 0;
    for (size_t e = 0; e < rows.size(); ++e) {
        if (rows[e] > 0) {
            op_a.push_back(CUBLAS_OP_T);
            op_b.push_back(CUBLAS_OP_N);
            m_arr.push_back(as_int(out, "out"));
            n_arr.push_back(as_int(rows[e], "rows"));
            k_arr.push_back(as_int(in, "in"));
            lda.push_back(static_cast<int>(in));
            ldb.push_back(static_cast<int>(in));
            ldc.push_back(static_cast<int>(out));
            alpha.push_back(1.0f);
            beta.push_back(0.0f);
            group_size.push_back(1);
            a_ptr.push_back(w.ptr<char>() + static_cast<int64_t>(e) * out * in * es);
            b_ptr.push_back(x.ptr<char>() + offset * in * es);
            c_ptr.push_back(y.ptr<char>() + offset * out * es);
        }
        offset += rows[e];
    }
    const int groups = static_cast<int>(group_size.size());
    if (groups == 0)
        return;
    HYMOE_CHECK(groups <= max_groups_, "grouped_linear: ", groups, " experts > ", max_groups_);
    // The pointer tables go through host staging read at copy time: not capturable in a graph.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    HYMOE_CUDA_CHECK(cudaStreamIsCapturing(stream_.get(), &capture), "grouped GEMM");
    HYMOE_CHECK(capture == cudaStreamCaptureStatusNone,
                "grouped_linear: called while its stream is captured into a CUDA graph (its "
                "pointer tables are staged from the host at each call)");
    // The staging may still feed the previous call's copy: wait for that copy, not the GEMM.
    HYMOE_CUDA_CHECK(cudaEventSynchronize(tables_copied_), "grouped GEMM tables");
    void** host = static_cast<void**>(host_tables_.data());
    const size_t g = static_cast<size_t>(groups);
    std::memcpy(host, a_ptr.data(), g * sizeof(void*));
    std::memcpy(host + g, b_ptr.data(), g * sizeof(void*));
    std::memcpy(host + 2 * g, c_ptr.data(), g * sizeof(void*));
    copy_to_device(tables_, host, 3 * g * sizeof(void*), stream_);
    HYMOE_CUDA_CHECK(cudaEventRecord(tables_copied_, stream_.get()), "grouped GEMM tables");
    const cudaDataType_t t = cuda_type(x.dtype);
    const void* const* a_tab = tables_;
    const void* const* b_tab = tables_ + g;
    HYMOE_CUBLAS_CHECK(cublasGemmGroupedBatchedEx(handle_,
                                                  op_a.data(),
                                                  op_b.data(),
                                                  m_arr.data(),
                                                  n_arr.data(),
                                                  k_arr.data(),
                                                  alpha.data(),
                                                  a_tab,
                                                  t,
                                                  lda.data(),
                                                  b_tab,
                                                  t,
                                                  ldb.data(),
                                                  beta.data(),
                                                  tables_ + 2 * g,
                                                  t,
                                                  ldc.data(),
                                                  groups,
                                                  group_size.data(),
                                                  CUBLAS_COMPUTE_32F),
                       "grouped GEMM of ",
                       groups,
                       " experts, out ",
                       out,
                       " in ",
                       in);
}

}  // namespace hymoe::backend::cuda
