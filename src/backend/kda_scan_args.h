// The argument checks of the KDA recurrence on one sequence, forward and backward, shared by the
// CPU forms (cpu/kda_scan.cpp, cpu/kda_chunk_backward.cpp, cpu/kda_scan_backward.cpp) and the
// CUDA kernels (cuda/kda.cu, cuda/kda_scan_backward.cu). Private to src/backend.
#pragma once

#include "hymoe/backend/kda_params.h"
#include "hymoe/core/error.h"

namespace hymoe::ops::detail {

// The forward's: T ≥ 0, H, K, V > 0 and a state, and for T > 0 every input and output array (op
// names the call in the error).
inline void kda_scan_check(const char* op, const KdaScanParams& p) {
    HYMOE_CHECK(p.n_tok >= 0 && p.n_head > 0 && p.d_k > 0 && p.d_v > 0 && p.S != nullptr,
                op,
                ": T ",
                p.n_tok,
                " H ",
                p.n_head,
                " K ",
                p.d_k,
                " V ",
                p.d_v);
    HYMOE_CHECK(p.n_tok == 0 || (p.q && p.k && p.v && p.g && p.beta && p.o),
                op,
                ": missing input or output array");
}

// The backward's: T ≥ 0, H, K, V and the chunk > 0, and for T > 0 every input and gradient array
// (op names the call in the error); false for an empty sequence (nothing to do).
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
