// The embedding gather (hymoe/backend/cuda_ops.h): one thread per output element copies its
// table entry, or writes 0 when the token's row lives on another tp rank.
#include "hymoe/backend/cuda_ops.h"
#include "kernels.h"

namespace hymoe::backend::cuda {

namespace {

template <class T>
__global__ void embed_kernel(
    const T* table, int64_t rows, const int64_t* tokens, int64_t lo, int64_t n, int64_t d, T* h) {
    for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < n * d;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t r = tokens[j / d] - lo, col = j % d;
        store(h, j, r >= 0 && r < rows ? load(table, r * d + col) : 0.0f);
    }
}

}  // namespace

void embed_rows(const Stream& s, const Tensor& table, const Tensor& tokens, int64_t lo, Tensor& h) {
    check_float(table, "embed_rows", table.dtype);
    check_float(h, "embed_rows", table.dtype);
    HYMOE_CHECK(tokens.device == Device::cuda && tokens.dtype == DType::i64,
                "embed_rows: tokens must be int64 on the device");
    const int64_t n = tokens.numel(), d = table.dim(-1);
    HYMOE_CHECK(table.shape.size() == 2 && h.numel() == n * d && h.dim(-1) == d,
                "embed_rows: table ",
                shape_string(table.shape),
                " tokens ",
                shape_string(tokens.shape),
                " h ",
                shape_string(h.shape));
    if (n * d == 0)
        return;
    dispatch(table.dtype, [&](auto tag) {
        using T = decltype(tag);
        embed_kernel<T><<<grid_for(n * d, kBlock), kBlock, 0, s.get()>>>(
            table.ptr<T>(), table.dim(0), tokens.ptr<int64_t>(), lo, n, d, h.ptr<T>());
    });
    check_launch("embed_rows");
}

}  // namespace hymoe::backend::cuda
