// Device memory on a GPU: arena tensors are aligned and disjoint, a pinned -> device -> device
// -> pinned round trip on one stream returns the bytes unchanged, a full arena throws, and
// freeing everything leaves one free block.
#include <cstdint>
#include <cstring>

#include <boost/test/unit_test.hpp>

#include "cuda_test.h"
#include "hymoe/core/error.h"

namespace utf = boost::unit_test;
using namespace hymoe;
using namespace hymoe::cuda_test;

BOOST_AUTO_TEST_SUITE(cuda_memory, *utf::label("cuda"))

BOOST_AUTO_TEST_CASE(pinned_round_trip_through_the_arena, *utf::precondition(need_gpu)) {
    Gpu g;
    const int64_t n = 1 << 20;
    cu::PinnedBuffer in(n * sizeof(float)), out(n * sizeof(float));
    Tensor host_in = in.tensor(DType::f32, {n}), host_out = out.tensor(DType::f32, {n});
    for (int64_t i = 0; i < n; ++i)
        host_in.ptr<float>()[i] = static_cast<float>(i % 9973) * 0.5f - 7.0f;
    Tensor a = g.arena.tensor(DType::f32, {n});
    Tensor small = g.arena.tensor(DType::u8, {3});  // leaves the next block misaligned by 3
    Tensor b = g.arena.tensor(DType::f32, {n});
    BOOST_TEST(reinterpret_cast<uintptr_t>(a.data) % 256 == 0u);
    BOOST_TEST(reinterpret_cast<uintptr_t>(b.data) % 256 == 0u);
    BOOST_TEST(b.ptr<char>() >= small.ptr<char>() + 3);
    cu::upload(host_in, a, g.s);
    cu::copy_on_device(b.data, a.data, a.bytes(), g.s);
    cu::download(b, host_out, g.s);
    g.s.synchronize();
    BOOST_TEST(std::memcmp(host_in.data, host_out.data, host_in.bytes()) == 0);
    g.arena.free(a.data);
    g.arena.free(small.data);
    g.arena.free(b.data);
    BOOST_TEST(g.arena.book().used() == 0u);
    BOOST_TEST(g.arena.book().free_blocks() == 1u);
}

BOOST_AUTO_TEST_CASE(full_arena_and_mismatched_copies_throw, *utf::precondition(need_gpu)) {
    cu::Stream s;
    cu::DeviceArena arena(1 << 20);
    BOOST_CHECK_THROW(arena.allocate(size_t{2} << 20), hymoe::Error);
    Tensor dev = arena.tensor(DType::f32, {16});
    Buffer host(DType::f32, {8});
    BOOST_CHECK_THROW(cu::upload(host.view(), dev, s), hymoe::Error);  // 8 into 16
    Buffer host16(DType::bf16, {16});
    BOOST_CHECK_THROW(cu::download(dev, host16.view(), s), hymoe::Error);  // f32 into bf16
}

BOOST_AUTO_TEST_SUITE_END()
