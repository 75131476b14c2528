// CUDA kernels of the router's score backward and the cross-entropy rows
// (backend/ops_router_loss.h), queued on a stream (src/backend/cuda/router_loss.cu): one thread
// per token for the router (its k chosen experts in the CPU form's order), one block per row for
// the cross-entropy (first-maximum argmax, the softmax sum in double). Called through the ops on a
// Ctx (src/backend/ops.cpp), which checks the devices.
#pragma once

#include "hymoe/backend/ops_router_loss.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::backend::cuda {

class Stream;

void router_scores_backward(const Stream& st,
                            const Tensor& s,
                            const Tensor& idx,
                            const Tensor& dw,
                            const Tensor& bias,
                            const ops::RouterGradRule& rule,
                            Tensor& dlogit);
// logits ← scale·(softmax − onehot) per row; loss [k] (doubles) and best [k] i64 device arrays.
void cross_entropy_rows(const Stream& st,
                        Tensor& logits,
                        const Tensor& targets,
                        double scale,
                        double* loss,
                        int64_t* best);

}  // namespace hymoe::backend::cuda
