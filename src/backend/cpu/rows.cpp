// The CPU forms of the row moves (hymoe/backend/ops_rows.h): one memcpy a row.
#include <cstring>

#include "hymoe/backend/ops_rows.h"
#include "hymoe/core/error.h"

namespace hymoe::ops {

namespace {

// idx i64 [m], each in [0, n) (n the indexed tensor's rows); src and dst of one width and dtype.
void check_rows(
    const Tensor& src, const Tensor& idx, const Tensor& dst, int64_t m, int64_t n, const char* op) {
    HYMOE_CHECK(idx.dtype == DType::i64 && idx.numel() == m && src.shape.size() == 2 &&
                    dst.shape.size() == 2 && src.dim(1) == dst.dim(1) && src.dtype == dst.dtype,
                op,
                ": src ",
                shape_string(src.shape),
                " dst ",
                shape_string(dst.shape),
                " idx ",
                shape_string(idx.shape));
    for (int64_t i = 0; i < m; ++i)
        HYMOE_CHECK(idx.ptr<int64_t>()[i] >= 0 && idx.ptr<int64_t>()[i] < n,
                    op,
                    ": row ",
                    idx.ptr<int64_t>()[i],
                    " of ",
                    n);
}

}  // namespace

void gather_rows(const Tensor& src, const Tensor& idx, Tensor& dst) {
    check_rows(src, idx, dst, dst.dim(0), src.dim(0), "gather_rows");
    const size_t row = static_cast<size_t>(src.dim(1)) * dtype_size(src.dtype);
    for (int64_t i = 0; i < dst.dim(0); ++i)
        std::memcpy(
            static_cast<char*>(dst.data) + static_cast<size_t>(i) * row,
            static_cast<const char*>(src.data) + static_cast<size_t>(idx.ptr<int64_t>()[i]) * row,
            row);
}

void scatter_rows(const Tensor& src, const Tensor& idx, Tensor& dst) {
    check_rows(src, idx, dst, src.dim(0), dst.dim(0), "scatter_rows");
    const size_t row = static_cast<size_t>(src.dim(1)) * dtype_size(src.dtype);
    for (int64_t i = 0; i < src.dim(0); ++i)
        std::memcpy(static_cast<char*>(dst.data) + static_cast<size_t>(idx.ptr<int64_t>()[i]) * row,
                    static_cast<const char*>(src.data) + static_cast<size_t>(i) * row,
                    row);
}

}  // namespace hymoe::ops
