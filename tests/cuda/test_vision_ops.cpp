// The vision tower's ops on a Ctx (hymoe/backend/ops_vision.h) on a CUDA context against the same
// ops on the CPU context (label cuda; each test is a one-line skip without a GPU): the linear with
// its bias and both GELUs (f32 and a bf16 weight), the 2-D RoPE of q and k side by side, the
// attention of packed images with one head at a time and with every head at once, the gathered
// means (bit for bit: the same sums in the same order) and the copy back.
#include <cstdint>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "cuda_test.h"
#include "hymoe/backend/cuda_gemm.h"
#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_vision.h"

namespace utf = boost::unit_test;
using namespace hymoe;
using namespace hymoe::cuda_test;

namespace {

// A CUDA context over a test's stream and arena.
}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_vision_ops, *utf::label("cuda"))

BOOST_AUTO_TEST_CASE(linear_with_bias_and_gelus, *utf::precondition(need_gpu)) {
    GpuCtx gc;
    const backend::Ctx cpu = backend::cpu_ctx();
    for (DType t : {DType::f32, DType::bf16})
        for (ops::BiasAct act :
             {ops::BiasAct::none, ops::BiasAct::gelu_tanh, ops::BiasAct::gelu_erf}) {
            const Buffer x = random({11, 48}, 50, t), w = random({40, 48}, 51, t);
            const Buffer b = random({40}, 52, DType::f32);
            Buffer y(DType::f32, {11, 40});
            ops::linear_bias(cpu, x.view(), w.view(), b.view(), act, y.view());
            Tensor dy = gc.g.arena.tensor(DType::f32, {11, 40});
            ops::linear_bias(
                gc.ctx, gc.up(x, DType::f32), gc.up(w, t), gc.up(b, DType::f32), act, dy);
            expect_close("linear_bias", dy, y, gc.g.s);
        }
}

BOOST_AUTO_TEST_CASE(rope_2d_on_q_and_k, *utf::precondition(need_gpu)) {
    GpuCtx gc;
    const int64_t H = 2, dh = 8, C = H * dh, n = 6;
    const std::vector<int32_t> pos = {0, 0, 0, 1, 0, 2, 1, 0, 1, 1, 1, 2};  // a 2×3 grid
    Buffer qkv = random({n, 3 * C}, 53, DType::f32);
    Tensor dev = gc.up(qkv, DType::f32);
    Tensor dpos = to_device_i32(pos, gc.g.arena, gc.g.s);
    dpos.shape = {n, 2};
    const Tensor hpos{const_cast<int32_t*>(pos.data()), DType::i32, Device::cpu, {n, 2}};
    ops::rope_2d(backend::cpu_ctx(), qkv.view(), 2 * H, dh, hpos);
    ops::rope_2d(gc.ctx, dev, 2 * H, dh, dpos);
    expect_close("rope_2d", dev, qkv, gc.g.s);
}

BOOST_AUTO_TEST_CASE(attention_of_packed_images, *utf::precondition(need_gpu)) {
    GpuCtx gc;
    const std::vector<int64_t> lengths = {16, 1, 24};
    const int64_t H = 3, dh = 8, C = H * dh, n = 41;
    const Buffer qkv = random({n, 3 * C}, 54, DType::f32);
    Buffer o(DType::f32, {n, C});
    ops::vision_attention(backend::cpu_ctx(), qkv.view(), lengths, H, 0, o.view());
    const Tensor dqkv = gc.up(qkv, DType::f32);
    for (int64_t room : {int64_t{0}, int64_t{1} << 30}) {  // one head at a time, every head
        Tensor dout = gc.g.arena.tensor(DType::f32, {n, C});
        ops::vision_attention(gc.ctx, dqkv, lengths, H, room, dout);
        expect_close("vision_attention", dout, o, gc.g.s);
    }
    BOOST_TEST(ops::vision_heads_at_once(gc.ctx, 24, H, int64_t{1} << 30) == H);
}

BOOST_AUTO_TEST_CASE(gathered_means_and_the_copy_back, *utf::precondition(need_gpu)) {
    GpuCtx gc;
    const Buffer x = random({9, 6}, 55, DType::f32);
    const std::vector<int64_t> rows = {0, 1, 2, 8, 7, 6, 4, 4, 4, 3, 0, 5};
    const Tensor hidx{const_cast<int64_t*>(rows.data()), DType::i64, Device::cpu, {4, 3}};
    Buffer want(DType::f32, {4, 6}), got(DType::f32, {4, 6});
    ops::gather_mean_rows(backend::cpu_ctx(), x.view(), hidx, want.view());
    Tensor didx = to_device_i64(rows, gc.g.arena, gc.g.s);
    didx.shape = {4, 3};
    Tensor dout = gc.g.arena.tensor(DType::f32, {4, 6});
    ops::gather_mean_rows(gc.ctx, gc.up(x, DType::f32), didx, dout);
    ops::download(gc.ctx, dout, got.view());
    for (int64_t i = 0; i < 24; ++i)
        BOOST_TEST(got.ptr<float>()[i] == want.ptr<float>()[i], i);
}

BOOST_AUTO_TEST_SUITE_END()
