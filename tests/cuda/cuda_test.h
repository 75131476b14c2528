// Helpers of the CUDA parity tests (tests/cuda, CUDA builds only): the "is there a GPU"
// precondition that turns every test into a one-line skip on a machine without one, host <->
// device transfers with bf16 rounding, and the normalised error with its per-dtype tolerance.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include <boost/test/unit_test.hpp>
#include <cuda_runtime.h>

#include "hymoe/backend/ctx.h"
#include "hymoe/backend/cuda_arena.h"
#include "hymoe/backend/cuda_gemm.h"
#include "hymoe/core/rng.h"
#include "hymoe/core/types.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::cuda_test {

namespace cu = hymoe::backend::cuda;

// True when the CUDA runtime counts at least one device (no driver counts as none).
inline bool gpu_present() {
    static const bool present = [] {
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess) {
            (void)cudaGetLastError();
            return false;
        }
        return n > 0;
    }();
    return present;
}

// The precondition of every CUDA test: without a GPU the test is skipped with one line.
inline boost::test_tools::assertion_result need_gpu(boost::unit_test::test_unit_id id) {
    if (gpu_present())
        return true;
    const auto& tu = boost::unit_test::framework::get(id, boost::unit_test::TUT_ANY);
    std::printf("%s: no CUDA device: skipped\n", tu.full_name().c_str());
    std::fflush(stdout);
    boost::test_tools::assertion_result r(false);
    r.message() << "no CUDA device";
    return r;
}

// The tolerance on rel_error for results stored in `t`: fp32 arithmetic differs from the CPU
// in summation order only; bf16 adds one rounding of the output (2^-9 relative) and more.
inline double tolerance(DType t) {
    return t == DType::bf16 ? 1e-2 : 1e-5;
}

// ‖got − want‖₂ / ‖want‖₂ (0 when both are zero).
inline double rel_error(const float* got, const float* want, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; ++i) {
        const double d = static_cast<double>(got[i]) - static_cast<double>(want[i]);
        num += d * d;
        den += static_cast<double>(want[i]) * static_cast<double>(want[i]);
    }
    return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// Rounds the fp32 host buffer's values in place to what `t` holds (bf16: round to nearest even).
inline void round_to(Buffer& b, DType t) {
    if (t == DType::bf16)
        for (int64_t i = 0; i < b.view().numel(); ++i)
            b.ptr<float>()[i] = bf16_to_float(float_to_bf16(b.ptr<float>()[i]));
}

// fp32 N(0, 1) values, rounded to what `t` can hold (so the CPU reference sees the GPU's input).
inline Buffer random(Shape shape, uint32_t stream, DType t, float scale = 1.0f) {
    Buffer b(DType::f32, std::move(shape));
    Philox rng(1234, stream, 0);
    rng.fill_normal(b.ptr<float>(), static_cast<size_t>(b.view().numel()), 0.0f, scale);
    round_to(b, t);
    return b;
}

// A device copy of the fp32 host tensor `host`, stored as `t` (f32 or bf16); synchronous.
inline Tensor to_device(const Tensor& host, DType t, cu::DeviceArena& arena, const cu::Stream& s) {
    Tensor dev = arena.tensor(t, host.shape);
    Buffer staged(t, host.shape);
    for (int64_t i = 0; i < host.numel(); ++i) {
        const float v = host.ptr<float>()[i];
        if (t == DType::bf16)
            staged.ptr<uint16_t>()[i] = float_to_bf16(v);
        else
            staged.ptr<float>()[i] = v;
    }
    cu::upload(staged.view(), dev, s);
    s.synchronize();
    return dev;
}

// The device tensor's values as fp32 on the host; synchronous.
inline Buffer to_host(const Tensor& dev, const cu::Stream& s) {
    Buffer staged(dev.dtype, dev.shape);
    cu::download(dev, staged.view(), s);
    s.synchronize();
    Buffer out(DType::f32, dev.shape);
    for (int64_t i = 0; i < dev.numel(); ++i)
        out.ptr<float>()[i] = dev.dtype == DType::bf16 ? bf16_to_float(staged.ptr<uint16_t>()[i])
                                                       : staged.ptr<float>()[i];
    return out;
}

// A device int64 array holding `v`; synchronous.
inline Tensor to_device_i64(const std::vector<int64_t>& v,
                            cu::DeviceArena& arena,
                            const cu::Stream& s) {
    Tensor dev = arena.tensor(DType::i64, {static_cast<int64_t>(v.size())});
    cu::copy_to_device(dev.data, v.data(), v.size() * sizeof(int64_t), s);
    s.synchronize();
    return dev;
}

// A device int32 array holding `v`, and back; synchronous.
inline Tensor to_device_i32(const std::vector<int32_t>& v,
                            cu::DeviceArena& arena,
                            const cu::Stream& s) {
    Tensor dev = arena.tensor(DType::i32, {static_cast<int64_t>(v.size())});
    cu::copy_to_device(dev.data, v.data(), v.size() * sizeof(int32_t), s);
    s.synchronize();
    return dev;
}
inline std::vector<int32_t> to_host_i32(const Tensor& dev, const cu::Stream& s) {
    std::vector<int32_t> v(static_cast<size_t>(dev.numel()));
    cu::copy_to_host(v.data(), dev.data, v.size() * sizeof(int32_t), s);
    s.synchronize();
    return v;
}

// The device result `dev` against the CPU's `want`, within the tolerance of dev's dtype.
inline void expect_close(const char* what,
                         const Tensor& dev,
                         const Buffer& want,
                         const cu::Stream& s) {
    Buffer got = to_host(dev, s);
    const double err = rel_error(got.ptr<float>(), want.ptr<float>(), want.view().numel());
    BOOST_TEST_INFO(what << " " << to_string(dev.dtype) << ": normalised error " << err);
    BOOST_TEST(err < tolerance(dev.dtype));
}

// One test's device state: a stream and a 512 MiB arena on device 0.
struct Gpu {
    cu::Stream s;
    cu::DeviceArena arena{size_t{512} << 20};
};

// A Gpu with its cuBLAS handle and the backend context on them (backend/ctx.h), for the tests of
// ops and blocks on a CUDA Ctx.
struct GpuCtx {
    Gpu g;
    cu::Blas blas;
    backend::Ctx ctx;
    explicit GpuCtx(int max_groups = 1024) : blas(g.s, g.arena, max_groups) {
        ctx = backend::Ctx{Device::cuda, &g.s, &g.arena, &blas};
    }
    // A host tensor's device copy as t (f32 ↔ bf16 converted).
    Tensor up(const Tensor& host, DType t = DType::f32) { return to_device(host, t, g.arena, g.s); }
    Tensor up(const Buffer& host, DType t = DType::f32) { return up(host.view(), t); }
    Tensor f32(Shape shape) { return g.arena.tensor(DType::f32, std::move(shape)); }
    // A host weight's device copy at its own dtype (an absent one stays empty).
    Tensor weight(const Buffer& host) {
        if (host.view().data == nullptr)
            return {};
        Tensor dev = g.arena.tensor(host.view().dtype, host.view().shape);
        cu::upload(host.view(), dev, g.s);
        g.s.synchronize();
        return dev;
    }
};

}  // namespace hymoe::cuda_test
