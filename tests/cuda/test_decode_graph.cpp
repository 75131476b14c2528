// DecodeGraphs (hymoe/backend/cuda_graph.h) on the GPU: a step of two kernels over the first
// `bucket` rows of a buffer (x ← 2x + 1), run through the graphs for batches 3, 3, 12, 1, 5 and
// 9 (buckets 4, 4, 12, 1, 8, 12): each bucket captured once, replays matching the same step
// applied on the host; then the step's buffer moves and refresh() updates every captured graph
// in place, after which replays touch the new buffer only.
#include <set>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "cuda_test.h"
#include "hymoe/backend/cuda_graph.h"
#include "hymoe/backend/cuda_ops.h"

namespace utf = boost::unit_test;
using namespace hymoe;
using namespace hymoe::cuda_test;

BOOST_AUTO_TEST_SUITE(cuda_decode_graph, *utf::label("cuda"))

BOOST_AUTO_TEST_CASE(replays_match_the_step_and_refresh_follows_a_moved_buffer,
                     *utf::precondition(need_gpu)) {
    Gpu g;
    const int64_t max_batch = 12, width = 1000;
    Buffer a0 = random({max_batch, width}, 600, DType::f32);
    Buffer b0 = random({max_batch, width}, 601, DType::f32);
    Buffer ones(DType::f32, {max_batch, width});
    for (int64_t i = 0; i < max_batch * width; ++i)
        ones.ptr<float>()[i] = 1.0f;
    Tensor a = to_device(a0.view(), DType::f32, g.arena, g.s);
    Tensor b = to_device(b0.view(), DType::f32, g.arena, g.s);
    Tensor d_ones = to_device(ones.view(), DType::f32, g.arena, g.s);
    Tensor* target = &a;
    auto step = [&](const cu::Stream& s, int bucket) {
        Tensor rows = target->rows(0, bucket);
        cu::scale_inplace(s, rows, 2.0f);
        cu::add_inplace(s, rows, d_ones.rows(0, bucket));
    };
    // the host's copy of the same step
    auto apply = [&](Buffer& x, int bucket) {
        for (int64_t i = 0; i < bucket * width; ++i)
            x.ptr<float>()[i] = 2.0f * x.ptr<float>()[i] + 1.0f;
    };
    cu::DecodeGraphs graphs(cu::DecodeBuckets(static_cast<int>(max_batch)), step);
    std::set<int> used;
    for (int n : {3, 3, 12, 1, 5, 9}) {
        const int bucket = graphs.run(g.s, n);
        BOOST_TEST(bucket == graphs.buckets().bucket_for(n));
        used.insert(bucket);
        apply(a0, bucket);
        BOOST_TEST(graphs.captured() == static_cast<int>(used.size()));
    }
    Buffer got_a = to_host(a, g.s);
    BOOST_TEST(rel_error(got_a.ptr<float>(), a0.ptr<float>(), max_batch * width) == 0.0);

    target = &b;
    graphs.refresh(g.s);
    BOOST_TEST(graphs.updated() + graphs.reinstantiated() == static_cast<int>(used.size()));
    BOOST_TEST(graphs.updated() == static_cast<int>(used.size()));  // same topology: in place
    const int bucket = graphs.run(g.s, 7);
    apply(b0, bucket);
    Buffer got_b = to_host(b, g.s), still_a = to_host(a, g.s);
    BOOST_TEST(rel_error(got_b.ptr<float>(), b0.ptr<float>(), max_batch * width) == 0.0);
    BOOST_TEST(rel_error(still_a.ptr<float>(), a0.ptr<float>(), max_batch * width) == 0.0);
}

BOOST_AUTO_TEST_SUITE_END()
