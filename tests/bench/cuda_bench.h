// Helpers of the GPU benchmark (tests/bench/bench_cuda.cpp, CUDA builds only): best-of timing
// between CUDA events, device buffers filled with a constant or a random pattern, and the limits
// measured at the start of the run that every figure is a fraction of.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <vector>

#include <cuda_runtime.h>

#include "hymoe/backend/cuda_arena.h"
#include "hymoe/core/rng.h"
#include "hymoe/core/types.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::bench {

namespace cu = hymoe::backend::cuda;

// The H200's limits as measured in this run: cuBLAS bf16 GEMM peak and device-to-device copy
// bandwidth (bytes read + written).
struct Limits {
    double peak_tflops = 0;
    double copy_gbs = 0;
    int sm_count = 0;
};

// The best time in seconds of `reps` runs of f on stream s, after one warm-up run.
inline double best_seconds(const cu::Stream& s, int reps, const std::function<void()>& f) {
    cudaEvent_t start = nullptr, stop = nullptr;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    f();
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
        cudaEventRecord(start, s.get());
        f();
        cudaEventRecord(stop, s.get());
        cudaEventSynchronize(stop);
        float ms = 0;
        cudaEventElapsedTime(&ms, start, stop);
        best = std::min(best, static_cast<double>(ms) * 1e-3);
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return best;
}

// Device memory holding `host_piece` (bytes) repeated to fill `shape`, copied in order.
inline Tensor tiled(cu::DeviceArena& arena,
                    const cu::Stream& s,
                    DType t,
                    Shape shape,
                    const std::vector<char>& piece) {
    Tensor d = arena.tensor(t, std::move(shape));
    for (size_t off = 0; off < d.bytes(); off += piece.size())
        cu::copy_to_device(
            d.ptr<char>() + off, piece.data(), std::min(piece.size(), d.bytes() - off), s);
    s.synchronize();
    return d;
}

// Device memory filled with one value (f32 or bf16; 0.01 keeps products far from overflow).
inline Tensor filled(
    cu::DeviceArena& arena, const cu::Stream& s, DType t, Shape shape, float value = 0.01f) {
    const size_t es = dtype_size(t), bytes = static_cast<size_t>(shape_numel(shape)) * es;
    std::vector<char> piece(std::max<size_t>(es, std::min(bytes, size_t{64} << 20)));
    const uint16_t v16 = float_to_bf16(value);
    for (size_t i = 0; i + es <= piece.size(); i += es)
        std::memcpy(
            piece.data() + i, t == DType::bf16 ? static_cast<const void*>(&v16) : &value, es);
    return tiled(arena, s, t, std::move(shape), piece);
}

// Device memory of N(mean, std) values (f32 or bf16): a random piece of at most 32 MiB, repeated.
inline Tensor random_filled(cu::DeviceArena& arena,
                            const cu::Stream& s,
                            DType t,
                            Shape shape,
                            float std,
                            uint32_t seed,
                            float mean = 0.0f) {
    const size_t es = dtype_size(t), n = static_cast<size_t>(shape_numel(shape));
    const size_t count = std::max<size_t>(1, std::min(n, (size_t{32} << 20) / es));
    std::vector<float> values(count);
    Philox rng(77, seed, 0);
    rng.fill_normal(values.data(), count, mean, std);
    std::vector<char> piece(count * es);
    for (size_t i = 0; i < count; ++i) {
        if (t == DType::bf16) {
            const uint16_t h = float_to_bf16(values[i]);
            std::memcpy(piece.data() + i * es, &h, es);
        } else {
            std::memcpy(piece.data() + i * es, &values[i], es);
        }
    }
    return tiled(arena, s, t, std::move(shape), piece);
}

// A device int32 or int64 array holding v.
template <class T>
Tensor device_array(cu::DeviceArena& arena, const cu::Stream& s, const std::vector<T>& v) {
    Tensor d =
        arena.tensor(sizeof(T) == 4 ? DType::i32 : DType::i64, {static_cast<int64_t>(v.size())});
    cu::copy_to_device(d.data, v.data(), v.size() * sizeof(T), s);
    s.synchronize();
    return d;
}

inline void release(cu::DeviceArena& arena, std::initializer_list<Tensor*> tensors) {
    for (Tensor* t : tensors)
        arena.free(t->data);
}

}  // namespace hymoe::bench
