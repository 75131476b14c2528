// The training ops around the blocks' backward (spec/model-math.md §9): the router's score
// backward (combine-weight gradients → router logits, model/router_backward.cpp) and the LM
// head's masked cross-entropy rows (model/train.cpp loss_head). CPU forms first
// (src/backend/cpu/router_loss.cpp: the loops those files ran, same order), then the ops on a
// Ctx: CPU, exactly the CPU forms; CUDA, the kernels of backend/cuda_router_loss.h (tests/cuda
// compares them). The switch is src/backend/ops_train.cpp's.
#pragma once

#include <cstdint>
#include <vector>

#include "hymoe/backend/ctx.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::ops {

// How the chosen experts' scores became combine weights (model/router.h WeightRule): u = s (+ b),
// w = ρ·u / (Σ u + eps) when renormalize, else ρ·u; σ scores (sigmoid) or softmax ones.
struct RouterGradRule {
    bool renormalize = true;
    float eps = 0.0f;
    float rho = 1.0f;
    bool sigmoid = true;
};

// dlogit [n, E] (=) from the combine-weight gradients dw [n, k] of the chosen experts idx [n, k]
// (i64) of the scores s [n, E], bias [E] (empty: none) added to the gathered scores:
//   du_i = (ρ / (Z + ε)) (dw_i − Σ_j dw_j w̃_j) (renormalised; else ρ dw_i);
//   sigmoid: dl = du ⊙ s(1 − s) on the chosen experts, 0 elsewhere;
//   softmax: dl = s ⊙ (du − Σ_i du_i s_i) over every expert (du 0 off the chosen ones).
void router_scores_backward(const Tensor& s,
                            const Tensor& idx,
                            const Tensor& dw,
                            const Tensor& bias,
                            const RouterGradRule& rule,
                            Tensor& dlogit);

// Each row's loss (log Σ e^z − z_target, the sum in double) and argmax (the first maximum).
struct CrossEntropyRows {
    std::vector<double> loss;   // [k]
    std::vector<int64_t> best;  // [k]
};

// The cross-entropy of the rows of logits [k, V] f32 against targets [k] (i64, each in [0, V)),
// and its gradient in place: logits ← scale·(softmax − onehot(target)), the softmax in double
// rounded once. Returns the rows' losses and argmaxes (host values: on CUDA read back after the
// kernel, which waits for the stream).
CrossEntropyRows cross_entropy_rows(Tensor& logits, const Tensor& targets, double scale);

using backend::Ctx;

void router_scores_backward(const Ctx& ctx,
                            const Tensor& s,
                            const Tensor& idx,
                            const Tensor& dw,
                            const Tensor& bias,
                            const RouterGradRule& rule,
                            Tensor& dlogit);
CrossEntropyRows cross_entropy_rows(const Ctx& ctx,
                                    Tensor& logits,
                                    const Tensor& targets,
                                    double scale);

}  // namespace hymoe::ops
