// The routed experts' backward pieces on the device (hymoe/backend/cuda_moe_backward.h), f32: the
// scaled gather (one thread per (slot, column), as moe.cu's permute) and the combine weights'
// gradient (one warp per slot, the dot product's partial sums reduced by shuffles).
#include "hymoe/backend/cuda_moe_backward.h"
#include "kernels.h"

namespace hymoe::backend::cuda {

namespace {

__global__ void gather_scaled_kernel(const float* x,
                                     const int64_t* row,
                                     const float* weight,
                                     int64_t n_assign,
                                     int64_t k,
                                     int64_t width,
                                     float* in) {
    for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
         j < n_assign * width;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t a = j / width, col = j % width, r = row[a];
        if (r >= 0)
            in[r * width + col] = weight[a] * x[a / k * width + col];
    }
}

// One warp per slot a: dw[a] = g row a / k · out row row[a], 0 where row[a] < 0.
__global__ void slot_dot_kernel(const float* g,
                                const float* out,
                                const int64_t* row,
                                int64_t n_assign,
                                int64_t k,
                                int64_t width,
                                float* dw) {
    const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
    const int lane = threadIdx.x & 31;
    for (int64_t a = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
         a < n_assign;
         a += warps) {
        const int64_t r = row[a];
        float sum = 0.0f;
        if (r >= 0)
            for (int64_t c = lane; c < width; c += 32)
                sum += g[a / k * width + c] * out[r * width + c];
        for (int o = 16; o > 0; o >>= 1)
            sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (lane == 0)
            dw[a] = sum;
    }
}

void check_map(const Tensor& row, int64_t n, int64_t k, const char* op) {
    HYMOE_CHECK(
        row.device == Device::cuda && row.dtype == DType::i64 && k > 0 && row.numel() == n * k,
        op,
        ": the row map must be int64 [n·k] = ",
        n * k,
        " on the device, got ",
        to_string(row.dtype),
        shape_string(row.shape));
}

}  // namespace

void moe_gather_scaled(const Stream& s,
                       const Tensor& x,
                       const Tensor& row,
                       const Tensor& weight,
                       int64_t k,
                       Tensor& in) {
    check_float(x, "moe_gather_scaled", DType::f32);
    check_float(in, "moe_gather_scaled", DType::f32);
    HYMOE_CHECK(x.shape.size() == 2 && in.shape.size() == 2 && in.dim(1) == x.dim(1),
                "moe_gather_scaled: x ",
                shape_string(x.shape),
                " in ",
                shape_string(in.shape));
    const int64_t n = x.dim(0), width = x.dim(1);
    check_map(row, n, k, "moe_gather_scaled");
    if (n * k * width == 0)
        return;
    gather_scaled_kernel<<<grid_for(n * k * width, kBlock), kBlock, 0, s.get()>>>(
        x.ptr<float>(), row.ptr<int64_t>(), weight.ptr<float>(), n * k, k, width, in.ptr<float>());
    check_launch("moe_gather_scaled");
}

void moe_slot_dot(
    const Stream& s, const Tensor& g, const Tensor& out, const Tensor& row, int64_t k, Tensor& dw) {
    check_float(g, "moe_slot_dot", DType::f32);
    check_float(out, "moe_slot_dot", DType::f32);
    check_float(dw, "moe_slot_dot", DType::f32);
    HYMOE_CHECK(g.shape.size() == 2 && out.shape.size() == 2 && out.dim(1) == g.dim(1),
                "moe_slot_dot: g ",
                shape_string(g.shape),
                " out ",
                shape_string(out.shape));
    const int64_t n = g.dim(0), width = g.dim(1);
    check_map(row, n, k, "moe_slot_dot");
    HYMOE_CHECK(dw.numel() == n * k, "moe_slot_dot: dw ", shape_string(dw.shape), " for ", n * k);
    if (n * k == 0)
        return;
    slot_dot_kernel<<<grid_for(n * k * 32, kBlock), kBlock, 0, s.get()>>>(
        g.ptr<float>(), out.ptr<float>(), row.ptr<int64_t>(), n * k, k, width, dw.ptr<float>());
    check_launch("moe_slot_dot");
}

}  // namespace hymoe::backend::cuda
