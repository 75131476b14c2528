// CUDA kernels of the whole-tensor reductions (backend/ops_reduce.h), queued on a stream
// (src/backend/cuda/reduce.cu). Called through the ops on a Ctx (src/backend/ops.cpp).
#pragma once

#include "hymoe/tensor/tensor.h"

namespace hymoe::backend::cuda {

class Stream;

// *out (a device double) = Σ x² over x (f32), in double: one block, a grid-stride loop per thread
// then a tree over the block.
void sum_of_squares(const Stream& s, const Tensor& x, double* out);

}  // namespace hymoe::backend::cuda
