// Causal depthwise conv with a tail (hymoe/backend/cuda_ops.h), as ops::causal_conv: one thread
// per output (t, c) sums w[c, i] · u_{t−W+1+i}[c] over i in the CPU's order, inputs before 0
// coming from the tail; then a second launch (stream-ordered after every read of the old tail)
// replaces the tail by the last W−1 rows of [tail; u], one thread per channel, rows ascending so
// that the in-place shift reads each old row before it is overwritten. The batched form
// (cuda_kda_batch.h kda_conv_silu) does the same for every sequence of a KdaSeqTable at once, each
// row finding its sequence in the table, with the SiLU fused into the conv.
#include "hymoe/backend/cuda_kda_batch.h"
#include "hymoe/backend/cuda_ops.h"
#include "kernels.h"

namespace hymoe::backend::cuda {

namespace {

// Row j of the extended sequence [tail; u], channel c.
template <class T>
__device__ inline float extended(
    const T* tail, const T* u, int64_t j, int64_t c, int64_t C, int64_t W) {
    return j < W - 1 ? load(tail, j * C + c) : load(u, (j - (W - 1)) * C + c);
}

template <class T>
__global__ void conv_kernel(
    const T* u, const T* w, const T* tail, T* y, int64_t T_len, int64_t C, int64_t W) {
    for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < T_len * C;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t t = j / C, c = j % C;
        float acc = 0.0f;
        for (int64_t i = 0; i < W; ++i)
            acc += load(w, c * W + i) * extended(tail, u, t + i, c, C, W);
        store(y, j, acc);
    }
}

template <class T>
__global__ void tail_kernel(const T* u, T* tail, int64_t T_len, int64_t C, int64_t W) {
    const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (c >= C)
        return;
    for (int64_t j = 0; j < W - 1; ++j)
        store(tail, j * C + c, extended(tail, u, T_len + j, c, C, W));
}

// Row j of sequence s's extended input [its tail; its rows of u], channel c of D.
__device__ inline float seq_input(const ops::KdaSeqTable& t,
                                  const float* tail,
                                  const float* u,
                                  int64_t s,
                                  int64_t j,
                                  int64_t c,
                                  int64_t D,
                                  int64_t W) {
    return j < W - 1 ? tail[j * D + c] : u[(t.offsets[s] + j - (W - 1)) * D + c];
}

// One thread per (row, channel): the conv of the row's sequence, then SiLU.
__global__ void seq_conv_kernel(const ops::KdaSeqTable t,
                                int plane,
                                const float* u,
                                const float* w,
                                float* out,
                                int64_t D,
                                int64_t W) {
    for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < t.n_tok * D;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t r = j / D, c = j % D, s = t.row_seq[r], tt = r - t.offsets[s];
        const float* tail = t.tail[plane][s];
        float acc = 0.0f;
        for (int64_t i = 0; i < W; ++i)
            acc += w[c * W + i] * seq_input(t, tail, u, s, tt + i, c, D, W);
        out[j] = acc / (1.0f + expf(-acc));
    }
}

// One thread per (sequence, channel): the tail ← the last W−1 rows of [tail; its rows of u], rows
// ascending (row r reads row T + r > r, not yet overwritten).
__global__ void seq_tail_kernel(
    const ops::KdaSeqTable t, int plane, const float* u, int64_t D, int64_t W) {
    for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < t.n_seq * D;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t s = j / D, c = j % D, T = t.offsets[s + 1] - t.offsets[s];
        float* tail = t.tail[plane][s];
        for (int64_t r = 0; r < W - 1 && T > 0; ++r)
            tail[r * D + c] = seq_input(t, tail, u, s, T + r, c, D, W);
    }
}

}  // namespace

void kda_conv_silu(const Stream& s,
                   const ops::KdaSeqTable& t,
                   const Tensor& u,
                   const Tensor& w,
                   int plane,
                   Tensor& out) {
    check_float(u, "kda_conv_silu", DType::f32);
    check_float(w, "kda_conv_silu", DType::f32);
    check_float(out, "kda_conv_silu", DType::f32);
    const int64_t D = u.dim(-1), W = w.dim(-1);
    HYMOE_CHECK(plane >= 0 && plane < 3 && u.numel() == t.n_tok * D && out.numel() == u.numel() &&
                    w.numel() == D * W && out.data != u.data &&
                    (t.n_tok == 0 || (t.offsets && t.row_seq && t.tail[plane])),
                "kda_conv_silu: plane ",
                plane,
                ", u ",
                shape_string(u.shape),
                " w ",
                shape_string(w.shape),
                " out ",
                shape_string(out.shape),
                " for ",
                t.n_tok,
                " rows");
    if (t.n_tok == 0 || D == 0)
        return;
    seq_conv_kernel<<<grid_for(t.n_tok * D, kBlock), kBlock, 0, s.get()>>>(
        t, plane, u.ptr<float>(), w.ptr<float>(), out.ptr<float>(), D, W);
    check_launch("kda_conv_silu");
    if (W > 1)
        seq_tail_kernel<<<grid_for(t.n_seq * D, kBlock), kBlock, 0, s.get()>>>(
            t, plane, u.ptr<float>(), D, W);
    check_launch("kda_conv_silu tails");
}

void causal_conv(const Stream& s, const Tensor& u, const Tensor& w, Tensor& tail, Tensor& y) {
    check_float(u, "causal_conv", u.dtype);
    check_float(w, "causal_conv", u.dtype);
    check_float(tail, "causal_conv", u.dtype);
    check_float(y, "causal_conv", u.dtype);
    const int64_t T_len = u.dim(0), C = u.dim(1), W = w.dim(1);
    HYMOE_CHECK(u.shape.size() == 2 && w.dim(0) == C && tail.numel() == (W - 1) * C &&
                    y.numel() == T_len * C && y.data != u.data,
                "causal_conv: u ",
                shape_string(u.shape),
                " w ",
                shape_string(w.shape),
                " tail ",
                shape_string(tail.shape));
    if (T_len == 0 || C == 0)
        return;
    dispatch(u.dtype, [&](auto tag) {
        using T = decltype(tag);
        conv_kernel<T><<<grid_for(T_len * C, kBlock), kBlock, 0, s.get()>>>(
            u.ptr<T>(), w.ptr<T>(), tail.ptr<T>(), y.ptr<T>(), T_len, C, W);
        check_launch("causal_conv");
        if (W > 1)
            tail_kernel<T><<<grid_for(C, kBlock), kBlock, 0, s.get()>>>(
                u.ptr<T>(), tail.ptr<T>(), T_len, C, W);
    });
    check_launch("causal_conv tail");
}

}  // namespace hymoe::backend::cuda
