// The POD parameters of one sequence's KDA recurrence and of its backward, shared by the CPU scans
// (backend/cpu/kda_scan.cpp, kda_scan_backward.cpp, called through hymoe/backend/ops.h) and the
// CUDA kernels (backend/cuda_ops.h), so both backends take the same structs. Every pointer is host
// or device memory, as the backend that runs it expects.
#pragma once

#include <cstdint>

namespace hymoe::ops {

// The recurrence of one sequence, all heads, after the projections, conv, norms and gates. The
// rows of every per-token array are tokens; heads are contiguous within a row.
struct KdaScanParams {
    int64_t n_tok = 0;            // T: tokens of the sequence in this call
    int n_head = 0;               // H
    int d_k = 0;                  // K
    int d_v = 0;                  // V
    const float* q = nullptr;     // [T, H, K] l2-normalised, scaled by K^{-1/2}
    const float* k = nullptr;     // [T, H, K] l2-normalised
    const float* v = nullptr;     // [T, H, V]
    const float* g = nullptr;     // [T, H, K] log-decay, ≤ 0
    const float* beta = nullptr;  // [T, H]
    float* S = nullptr;           // [H, K, V] state in (after the previous tokens) and out
    float* o = nullptr;           // [T, H, V] output
};

// ∂L/∂(inputs) of one sequence's scan, rows as in KdaScanParams; every array is overwritten.
struct KdaScanGrads {
    const float* dO = nullptr;  // [T, H, V] ∂L/∂o
    float* dq = nullptr;        // [T, H, K]
    float* dk = nullptr;        // [T, H, K]
    float* dv = nullptr;        // [T, H, V]
    float* dg = nullptr;        // [T, H, K]
    float* dbeta = nullptr;     // [T, H]
};

}  // namespace hymoe::ops
