// The CUDA kernel of ops::dropout_rows (backend/ops_dropout.h), queued on a stream; device f32
// tensors (src/backend/cuda/dropout.cu). Called through the op on a Ctx, which checks the devices.
#pragma once

#include "hymoe/backend/ops_dropout.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::backend::cuda {

class Stream;

void dropout_rows(const Stream& s, const Tensor& x, const ops::DropoutKey& key, Tensor& y);

}  // namespace hymoe::backend::cuda
