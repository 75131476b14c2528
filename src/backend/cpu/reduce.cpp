// The CPU forms of the whole-tensor reductions (hymoe/backend/ops_reduce.h).
#include "hymoe/backend/ops_reduce.h"
#include "hymoe/core/error.h"

namespace hymoe::ops {

double sum_of_squares(const Tensor& x) {
    HYMOE_CHECK(x.dtype == DType::f32, "sum_of_squares: a ", to_string(x.dtype), " tensor");
    const float* p = x.ptr<float>();
    double s = 0;
    for (int64_t i = 0; i < x.numel(); ++i)
        s += static_cast<double>(p[i]) * static_cast<double>(p[i]);
    return s;
}

}  // namespace hymoe::ops
