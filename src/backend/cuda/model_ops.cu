// The GPU model's own kernels (hymoe/backend/cuda_model_ops.h). Element-wise and row moves are
// grid-stride loops; the softmax and the indexer's decode scores are one block per row, as
// softmax.cu and indexer.cu.
#include <cmath>

#include "hymoe/backend/cuda_model_ops.h"
#include "kernels.h"

namespace hymoe::backend::cuda {

namespace {

template <class S, class D>
__global__ void cast_kernel(const S* src, D* dst, int64_t n) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        store(dst, i, load(src, i));
    }
}

template <class T>
__global__ void gather_kernel(const T* src, const int64_t* idx, int64_t n, int64_t w, T* dst) {
    for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < n * w;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        dst[j] = src[idx[j / w] * w + j % w];
    }
}

template <class T>
__global__ void scatter_kernel(const T* src, const int64_t* idx, int64_t n, int64_t w, T* dst) {
    for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < n * w;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        dst[idx[j / w] * w + j % w] = src[j];
    }
}

template <class T>
__global__ void relu2_kernel(T* x, int64_t n) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const float r = fmaxf(load(x, i), 0.0f);
        store(x, i, r * r);
    }
}

__global__ void narrow_kernel(const int64_t* src, int32_t* dst, int64_t n) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        dst[i] = static_cast<int32_t>(src[i]);
    }
}

__device__ inline float* page_row(const KvPages& kv, int64_t seq, int64_t u) {
    const int32_t page = kv.block_table[seq * kv.max_pages + u / kv.page_tokens];
    return kv.pages + page * kv.page_stride + (u % kv.page_tokens) * kv.row_stride;
}

__global__ void kv_append_kernel(const KvPages kv,
                                 int64_t n_tok,
                                 const int32_t* row_seq,
                                 const int64_t* positions,
                                 const float* c_kv,
                                 int r_kv,
                                 const float* k_r,
                                 int d_r,
                                 const float* k_idx,
                                 int d_i) {
    const int64_t width = r_kv + d_r + d_i;
    for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < n_tok * width;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t t = j / width, c = j % width;
        float* row = page_row(kv, row_seq[t], positions[t]);
        row[c] = c < r_kv         ? c_kv[t * r_kv + c]
                 : c < r_kv + d_r ? k_r[t * d_r + c - r_kv]
                                  : k_idx[t * d_i + c - r_kv - d_r];
    }
}

__global__ void kv_gather_kernel(
    const KvPages kv, int seq, int64_t n, int64_t col, int64_t width, float* dst) {
    for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < n * width;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        dst[j] = page_row(kv, seq, j / width)[col + j % width];
    }
}

// Row r = (i, h) of scores [n_q, H, n_k]: causal cut, optional mask row i, softmax.
__global__ void causal_softmax_kernel(
    float* x, int64_t n_head, int64_t n_k, int64_t pos_first, const float* mask) {
    const int64_t r = blockIdx.x, i = r / n_head, visible = pos_first + i + 1;
    float* row = x + r * n_k;
    float mx = -INFINITY;
    for (int64_t u = threadIdx.x; u < n_k; u += blockDim.x) {
        const float v = u < visible ? row[u] + (mask ? mask[i * n_k + u] : 0.0f) : -INFINITY;
        row[u] = v;
        mx = fmaxf(mx, v);
    }
    mx = block_reduce(mx, Max{});  // also orders the writes above before the reads below
    if (mx == -INFINITY) {
        for (int64_t u = threadIdx.x; u < n_k; u += blockDim.x)
            row[u] = 0.0f;
        return;
    }
    float sum = 0.0f;
    for (int64_t u = threadIdx.x; u < n_k; u += blockDim.x)
        sum += expf(row[u] - mx);
    const float inv = 1.0f / block_reduce(sum, Sum{});
    for (int64_t u = threadIdx.x; u < n_k; u += blockDim.x)
        row[u] = expf(row[u] - mx) * inv;
}

constexpr int64_t kMaxIndexerQuery = 12288;  // floats of one query in shared memory (48 KiB)

__global__ void indexer_decode_kernel(const IndexerDecode p) {
    __shared__ float q_b[kMaxIndexerQuery];
    const int64_t b = blockIdx.y, hd = static_cast<int64_t>(p.n_head) * p.head_dim;
    for (int64_t i = threadIdx.x; i < hd; i += blockDim.x)
        q_b[i] = p.q[b * hd + i];
    __syncthreads();
    const int64_t u = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (u >= p.max_keys)
        return;
    float acc = -INFINITY;
    if (u < p.n_keys[b]) {
        const float* k_u = page_row(p.kv, b, u) + p.col;
        acc = 0.0f;
        for (int64_t j = 0; j < p.n_head; ++j) {
            float dot = 0.0f;
            for (int64_t x = 0; x < p.head_dim; ++x)
                dot += q_b[j * p.head_dim + x] * k_u[x];
            acc += p.w[b * p.n_head + j] * fmaxf(dot, 0.0f);
        }
    }
    p.scores[b * p.max_keys + u] = acc;
}

void check_rows(const Tensor& src, const Tensor& idx, const Tensor& dst, const char* op) {
    check_float(src, op, src.dtype);
    check_float(dst, op, src.dtype);
    HYMOE_CHECK(idx.device == Device::cuda && idx.dtype == DType::i64 && src.shape.size() == 2 &&
                    dst.shape.size() == 2 && src.dim(1) == dst.dim(1),
                op,
                ": src ",
                shape_string(src.shape),
                " dst ",
                shape_string(dst.shape),
                " idx ",
                to_string(idx.dtype),
                shape_string(idx.shape));
}

}  // namespace

size_t device_free_bytes() {
    size_t free = 0, total = 0;
    HYMOE_CUDA_CHECK(cudaMemGetInfo(&free, &total), "free device memory");
    return free;
}

int device_sm_count() {
    int device = 0, n = 0;
    HYMOE_CUDA_CHECK(cudaGetDevice(&device), "current device");
    HYMOE_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device),
                     "SM count");
    return n;
}

void zero(void* p, size_t bytes, const Stream& s) {
    if (bytes > 0)
        HYMOE_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, s.get()), "zero ", bytes, " bytes");
}

void cast(const Stream& s, const Tensor& src, Tensor& dst) {
    check_float(src, "cast", src.dtype);
    check_float(dst, "cast", dst.dtype);
    HYMOE_CHECK(src.numel() == dst.numel(),
                "cast: ",
                shape_string(src.shape),
                " into ",
                shape_string(dst.shape));
    const int64_t n = src.numel();
    if (n == 0)
        return;
    dispatch(src.dtype, [&](auto from) {
        dispatch(dst.dtype, [&](auto to) {
            using S = decltype(from);
            using D = decltype(to);
            cast_kernel<S, D>
                <<<grid_for(n, kBlock), kBlock, 0, s.get()>>>(src.ptr<S>(), dst.ptr<D>(), n);
        });
    });
    check_launch("cast");
}

void copy_2d(const Stream& s,
             DType dtype,
             const void* src,
             int64_t src_ld,
             void* dst,
             int64_t dst_ld,
             int64_t rows,
             int64_t cols) {
    if (rows == 0 || cols == 0)
        return;
    const size_t es = dtype_size(dtype);
    HYMOE_CUDA_CHECK(cudaMemcpy2DAsync(dst,
                                       static_cast<size_t>(dst_ld) * es,
                                       src,
                                       static_cast<size_t>(src_ld) * es,
                                       static_cast<size_t>(cols) * es,
                                       static_cast<size_t>(rows),
                                       cudaMemcpyDeviceToDevice,
                                       s.get()),
                     "copy of ",
                     rows,
                     " rows of ",
                     cols);
}

void gather_rows(const Stream& s, const Tensor& src, const Tensor& idx, Tensor& dst) {
    check_rows(src, idx, dst, "gather_rows");
    HYMOE_CHECK(idx.numel() == dst.dim(0), "gather_rows: ", idx.numel(), " indices");
    const int64_t n = dst.dim(0), w = dst.dim(1);
    if (n * w == 0)
        return;
    dispatch(src.dtype, [&](auto tag) {
        using T = decltype(tag);
        gather_kernel<T><<<grid_for(n * w, kBlock), kBlock, 0, s.get()>>>(
            src.ptr<T>(), idx.ptr<int64_t>(), n, w, dst.ptr<T>());
    });
    check_launch("gather_rows");
}

void scatter_rows(const Stream& s, const Tensor& src, const Tensor& idx, Tensor& dst) {
    check_rows(src, idx, dst, "scatter_rows");
    HYMOE_CHECK(idx.numel() == src.dim(0), "scatter_rows: ", idx.numel(), " indices");
    const int64_t n = src.dim(0), w = src.dim(1);
    if (n * w == 0)
        return;
    dispatch(src.dtype, [&](auto tag) {
        using T = decltype(tag);
        scatter_kernel<T><<<grid_for(n * w, kBlock), kBlock, 0, s.get()>>>(
            src.ptr<T>(), idx.ptr<int64_t>(), n, w, dst.ptr<T>());
    });
    check_launch("scatter_rows");
}

void relu2_inplace(const Stream& s, Tensor& x) {
    check_float(x, "relu2_inplace", x.dtype);
    const int64_t n = x.numel();
    if (n == 0)
        return;
    dispatch(x.dtype, [&](auto tag) {
        using T = decltype(tag);
        relu2_kernel<T><<<grid_for(n, kBlock), kBlock, 0, s.get()>>>(x.ptr<T>(), n);
    });
    check_launch("relu2_inplace");
}

void narrow_indices(const Stream& s, const Tensor& src, Tensor& dst) {
    HYMOE_CHECK(src.device == Device::cuda && dst.device == Device::cuda &&
                    src.dtype == DType::i64 && dst.dtype == DType::i32 &&
                    src.numel() == dst.numel(),
                "narrow_indices: ",
                to_string(src.dtype),
                shape_string(src.shape),
                " into ",
                to_string(dst.dtype),
                shape_string(dst.shape));
    const int64_t n = src.numel();
    if (n == 0)
        return;
    narrow_kernel<<<grid_for(n, kBlock), kBlock, 0, s.get()>>>(
        src.ptr<int64_t>(), dst.ptr<int32_t>(), n);
    check_launch("narrow_indices");
}

void kv_append(const Stream& s,
               const KvPages& kv,
               int64_t n_tok,
               const int32_t* row_seq,
               const int64_t* positions,
               const float* c_kv,
               int r_kv,
               const float* k_r,
               int d_r,
               const float* k_idx,
               int d_i) {
    const int width = r_kv + d_r + (k_idx ? d_i : 0);
    HYMOE_CHECK(kv.row_stride >= width && kv.page_tokens > 0,
                "kv_append: rows of ",
                width,
                " floats into a row stride of ",
                kv.row_stride);
    if (n_tok * width == 0)
        return;
    kv_append_kernel<<<grid_for(n_tok * width, kBlock), kBlock, 0, s.get()>>>(
        kv, n_tok, row_seq, positions, c_kv, r_kv, k_r, d_r, k_idx, k_idx ? d_i : 0);
    check_launch("kv_append");
}

void kv_gather(const Stream& s,
               const KvPages& kv,
               int seq,
               int64_t n,
               int64_t col,
               int64_t width,
               float* dst) {
    HYMOE_CHECK(col >= 0 && col + width <= kv.row_stride,
                "kv_gather: columns [",
                col,
                ", ",
                col + width,
                ") of a row stride of ",
                kv.row_stride);
    if (n * width == 0)
        return;
    kv_gather_kernel<<<grid_for(n * width, kBlock), kBlock, 0, s.get()>>>(
        kv, seq, n, col, width, dst);
    check_launch("kv_gather");
}

void causal_softmax(
    const Stream& s, Tensor& scores, int64_t n_head, int64_t pos_first, const Tensor* mask) {
    check_float(scores, "causal_softmax", DType::f32);
    const int64_t n_k = scores.dim(-1), rows = rows_of(scores);
    HYMOE_CHECK(
        n_head > 0 && rows % n_head == 0 && rows <= INT32_MAX &&
            (mask == nullptr || (mask->device == Device::cuda && mask->dtype == DType::f32 &&
                                 mask->numel() == rows / n_head * n_k)),
        "causal_softmax: scores ",
        shape_string(scores.shape),
        " heads ",
        n_head);
    if (rows == 0)
        return;
    causal_softmax_kernel<<<static_cast<unsigned>(rows), kBlock, 0, s.get()>>>(
        scores.ptr<float>(), n_head, n_k, pos_first, mask ? mask->ptr<float>() : nullptr);
    check_launch("causal_softmax");
}

void indexer_decode_scores(const Stream& s, const IndexerDecode& p) {
    HYMOE_CHECK(static_cast<int64_t>(p.n_head) * p.head_dim <= kMaxIndexerQuery &&
                    p.n_seq <= 65535 && p.max_keys > 0,
                "indexer_decode_scores: H_I ",
                p.n_head,
                " d_I ",
                p.head_dim,
                " B ",
                p.n_seq,
                " keys ",
                p.max_keys);
    if (p.n_seq == 0)
        return;
    const dim3 grid(grid_for(p.max_keys, kBlock), static_cast<unsigned>(p.n_seq));
    indexer_decode_kernel<<<grid, kBlock, 0, s.get()>>>(p);
    check_launch("indexer_decode_scores");
}

}  // namespace hymoe::backend::cuda
