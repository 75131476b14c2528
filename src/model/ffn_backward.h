// The dense MLP's backward with the recomputed forward output on the side, private to
// src/model: the MoE backward needs each expert's output for the gradient of its combine weight.
#pragma once

#include "hymoe/model/ffn.h"

namespace hymoe::model::detail {

// dense_ffn_backward; y [n_tok, w], when not null, receives the recomputed forward output (as
// dense_ffn_forward computes it).
void dense_ffn_backward_with_output(const DenseFfnWeights& w,
                                    ExpertAct act,
                                    const Tensor& x,   // [n_tok, w]
                                    const Tensor& dy,  // [n_tok, w]
                                    Tensor& dx,        // [n_tok, w]
                                    Tensor* y);        // [n_tok, w] or null

}  // namespace hymoe::model::detail
