// The MoE layer's dispatch and combine on the device (hymoe/backend/cuda_ops.h), with the row
// map planned on the host as model/moe.cpp does: one thread per (assignment, column) copies a
// token's row to its expert-grouped row; one thread per (token, column) sums its k slots in slot
// order, so the result is the CPU's combine up to fused multiply-adds.
#include "hymoe/backend/cuda_ops.h"
#include "kernels.h"

namespace hymoe::backend::cuda {

namespace {

template <class T>
__global__ void permute_kernel(
    const T* z, const int64_t* row, int64_t n_assign, int64_t k, int64_t width, T* in) {
    for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
         j < n_assign * width;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t a = j / width, col = j % width, r = row[a];
        if (r >= 0)
            in[r * width + col] = z[a / k * width + col];
    }
}

template <class T, class Acc>
__global__ void unpermute_kernel(const T* out,
                                 const int64_t* row,
                                 const float* weight,
                                 int64_t n_tok,
                                 int64_t k,
                                 int64_t width,
                                 Acc* acc) {
    for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < n_tok * width;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t t = j / width, col = j % width;
        float sum = 0.0f;
        for (int64_t i = 0; i < k; ++i) {
            const int64_t r = row[t * k + i];
            if (r >= 0)
                sum += weight[t * k + i] * load(out, r * width + col);
        }
        store(acc, j, sum);
    }
}

void check_map(const Tensor& row, int64_t n_tok, int64_t k, const char* op) {
    HYMOE_CHECK(row.device == Device::cuda && row.dtype == DType::i64 && row.numel() == n_tok * k,
                op,
                ": the row map must be int64 [n_tok·k] = ",
                n_tok * k,
                " on the device, got ",
                to_string(row.dtype),
                shape_string(row.shape));
}

}  // namespace

void moe_permute(const Stream& s, const Tensor& z, const Tensor& row, int64_t k, Tensor& in) {
    check_float(z, "moe_permute", z.dtype);
    check_float(in, "moe_permute", z.dtype);
    const int64_t n_tok = z.dim(0), width = z.dim(-1);
    HYMOE_CHECK(k > 0 && z.shape.size() == 2 && in.shape.size() == 2 && in.dim(1) == width,
                "moe_permute: z ",
                shape_string(z.shape),
                " in ",
                shape_string(in.shape),
                " k ",
                k);
    check_map(row, n_tok, k, "moe_permute");
    if (n_tok * k * width == 0)
        return;
    dispatch(z.dtype, [&](auto tag) {
        using T = decltype(tag);
        permute_kernel<T><<<grid_for(n_tok * k * width, kBlock), kBlock, 0, s.get()>>>(
            z.ptr<T>(), row.ptr<int64_t>(), n_tok * k, k, width, in.ptr<T>());
    });
    check_launch("moe_permute");
}

void moe_unpermute(const Stream& s,
                   const Tensor& out,
                   const Tensor& row,
                   const Tensor& weight,
                   int64_t k,
                   Tensor& acc) {
    check_float(out, "moe_unpermute", out.dtype);
    HYMOE_CHECK(acc.dtype == out.dtype || acc.dtype == DType::f32,
                "moe_unpermute: acc in ",
                to_string(acc.dtype),
                " for out in ",
                to_string(out.dtype),
                " (out's dtype or f32)");
    check_float(acc, "moe_unpermute", acc.dtype);
    const int64_t n_tok = acc.dim(0), width = acc.dim(-1);
    HYMOE_CHECK(k > 0 && acc.shape.size() == 2 && out.shape.size() == 2 && out.dim(1) == width,
                "moe_unpermute: out ",
                shape_string(out.shape),
                " acc ",
                shape_string(acc.shape),
                " k ",
                k);
    check_map(row, n_tok, k, "moe_unpermute");
    HYMOE_CHECK(
        weight.device == Device::cuda && weight.dtype == DType::f32 && weight.numel() == n_tok * k,
        "moe_unpermute: weights must be f32 [n_tok·k] on the device");
    if (n_tok * width == 0)
        return;
    dispatch(out.dtype, [&](auto tag) {
        using T = decltype(tag);
        const auto launch = [&](auto* acc_data) {
            unpermute_kernel<<<grid_for(n_tok * width, kBlock), kBlock, 0, s.get()>>>(
                out.ptr<T>(), row.ptr<int64_t>(), weight.ptr<float>(), n_tok, k, width, acc_data);
        };
        if (acc.dtype == DType::f32)
            launch(acc.ptr<float>());
        else
            launch(acc.ptr<T>());
    });
    check_launch("moe_unpermute");
}

}  // namespace hymoe::backend::cuda
