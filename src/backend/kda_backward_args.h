// The argument checks of the KDA recurrence's backward on one sequence, shared by its CPU forms
// (cpu/kda_chunk_backward.cpp, cpu/kda_scan_backward.cpp) and its CUDA kernel
// (cuda/kda_scan_backward.cu). Private to src/backend.
#pragma once

#include "hymoe/backend/kda_params.h"
#include "hymoe/core/error.h"

namespace hymoe::ops::detail {

// T ≥ 0, H, K, V and the chunk > 0, and for T > 0 every input and gradient array (op names the
// call in the error); false for an empty sequence (nothing to do).
inline bool kda_backward_args_ok(
    const char* op, const KdaScanParams& p, const float* ckpt, const KdaScanGrads& d, int chunk) {
    HYMOE_CHECK(p.n_tok >= 0 && p.n_head > 0 && p.d_k > 0 && p.d_v > 0 && chunk > 0,
                op,
                ": T ",
                p.n_tok,
                " H ",
                p.n_head,
                " K ",
                p.d_k,
                " V ",
                p.d_v,
                " chunk ",
                chunk);
    if (p.n_tok == 0)
        return false;
    HYMOE_CHECK(p.q && p.k && p.v && p.g && p.beta && ckpt && d.dO && d.dq && d.dk && d.dv &&
                    d.dg && d.dbeta,
                op,
                ": missing input or gradient array");
    return true;
}

}  // namespace hymoe::ops::detail
