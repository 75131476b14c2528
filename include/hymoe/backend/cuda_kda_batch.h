// The CUDA forms of the batched KDA ops (hymoe/backend/kda_batch.h), every pointer of the table a
// device pointer, every call asynchronous on `s` and free of host synchronisation (a decode graph
// captures them). The conv is one launch per plane and its tail update a second
// (src/backend/cuda/conv.cu); the recurrence one launch (src/backend/cuda/kda.cu): the fused decode
// step when every sequence has one row (K ≤ 128), else, with bf16 products allowed and a sequence
// of at least chunk_from rows, the fused chunked prefill where its layout fits, both only with the
// table's pool; otherwise the generic scan (fp32, ops::kda_recurrent's arithmetic).
// CUDA builds only; no CUDA header here.
#pragma once

#include "hymoe/backend/cuda_arena.h"
#include "hymoe/backend/kda_batch.h"

namespace hymoe::backend::cuda {

void kda_conv_silu(const Stream& s,
                   const ops::KdaSeqTable& t,
                   const Tensor& u,
                   const Tensor& w,
                   int plane,
                   Tensor& out);
void kda_scan_batch(const Stream& s, const ops::KdaSeqTable& t, const ops::KdaBatchScan& p);

}  // namespace hymoe::backend::cuda
