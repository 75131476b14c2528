// The KDA block's backward on views (model/kda.h's kda_backward on KdaWeights calls this one):
// the same code on the CPU and, with every view a device tensor and the batch's table on the
// device, on a CUDA Ctx (src/model/kda_backward.cpp).
#pragma once

#include "hymoe/model/kda_views.h"

namespace hymoe::model {

// kda_backward for fresh sequences (every pos0 = 0): dx [n_tok, d] (overwritten) for dy
// [n_tok, d], the forward recomputed from x [n_tok, d]. b.table gives each row's sequence to the
// conv's backward (offsets on the CPU, offsets and row_seq on CUDA; a table without offsets:
// built from b.batch on ctx's device); the host adapters (w.lora, a CPU context) and the factor
// views on b.lora_rows with gradient views accumulate (+=) their gradients.
void kda_backward(const backend::Ctx& ctx,
                  const ModelConfig& cfg,
                  const KdaWeightViews& w,
                  const Tensor& x,
                  const KdaBatchViews& b,
                  const Tensor& dy,
                  Tensor& dx,
                  int chunk = 64);

}  // namespace hymoe::model
