// comm:: collectives over MPI on host tensors: values checked exactly on every rank, at any world
// size; MPI errors come back as hymoe::Error naming the operation.
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "../testing.h"
#include "hymoe/core/error.h"
#include "hymoe/parallel/comms.h"

using hymoe::Buffer;
using hymoe::DType;
using hymoe::testing::all_ranks;
namespace comm = hymoe::comm;

namespace {

hymoe::parallel::Grid world_grid() {
    return hymoe::parallel::make_grid(
        hymoe::parallel::Layout{hymoe::testing::world_size(), 1, 1, 1, 1});
}

}  // namespace

BOOST_AUTO_TEST_SUITE(collectives)

BOOST_AUTO_TEST_CASE(all_reduce_sum_max_in_f32_i64_bf16) {
    auto g = world_grid();
    const comm::Comm& c = g.comms.world;
    const int n = c.size(), r = c.rank();
    Buffer f(DType::f32, {3});
    Buffer i(DType::i64, {2});
    Buffer h(DType::bf16, {2});
    for (int k = 0; k < 3; ++k)
        f.ptr<float>()[k] = static_cast<float>(r + k);
    i.ptr<int64_t>()[0] = int64_t{1} << (40 + r % 8);
    i.ptr<int64_t>()[1] = r;
    h.ptr<uint16_t>()[0] = hymoe::float_to_bf16(1.0f);
    h.ptr<uint16_t>()[1] = hymoe::float_to_bf16(0.25f * static_cast<float>(r));
    comm::all_reduce(f.view(), c);
    comm::all_reduce(i.view(), c, comm::ReduceOp::max);
    comm::all_reduce(h.view(), c);
    bool ok = true;
    for (int k = 0; k < 3; ++k)
        ok = ok && f.ptr<float>()[k] == static_cast<float>(n * (n - 1) / 2 + n * k);
    ok = ok && i.ptr<int64_t>()[0] == int64_t{1} << (40 + std::min(n - 1, 7)) &&
         i.ptr<int64_t>()[1] == n - 1;
    ok = ok && hymoe::bf16_to_float(h.ptr<uint16_t>()[0]) == static_cast<float>(n);
    ok = ok &&
         hymoe::bf16_to_float(h.ptr<uint16_t>()[1]) == 0.125f * static_cast<float>(n * (n - 1));
    BOOST_TEST(all_ranks(ok));
}

BOOST_AUTO_TEST_CASE(all_gather_reduce_scatter_broadcast) {
    auto g = world_grid();
    const comm::Comm& c = g.comms.world;
    const int n = c.size(), r = c.rank();
    Buffer mine(DType::f32, {1, 2});
    mine.ptr<float>()[0] = static_cast<float>(r);
    mine.ptr<float>()[1] = static_cast<float>(10 * r);
    Buffer all(DType::f32, {n, 2});
    comm::all_gather(mine.view(), all.view(), c);
    bool ok = true;
    for (int k = 0; k < n; ++k)
        ok = ok && all.ptr<float>()[2 * k] == static_cast<float>(k) &&
             all.ptr<float>()[2 * k + 1] == static_cast<float>(10 * k);

    Buffer in(DType::f32, {n, 2});  // row k = (r + k, 1)
    for (int k = 0; k < n; ++k)
        in.ptr<float>()[2 * k] = static_cast<float>(r + k), in.ptr<float>()[2 * k + 1] = 1.0f;
    Buffer out(DType::f32, {1, 2});
    comm::reduce_scatter(in.view(), out.view(), c);
    ok = ok && out.ptr<float>()[0] == static_cast<float>(n * (n - 1) / 2 + n * r) &&
         out.ptr<float>()[1] == static_cast<float>(n);

    Buffer b(DType::i32, {4});
    if (r == n - 1)
        for (int k = 0; k < 4; ++k)
            b.ptr<int32_t>()[k] = 100 + k;
    comm::broadcast(b.view(), n - 1, c);
    for (int k = 0; k < 4; ++k)
        ok = ok && b.ptr<int32_t>()[k] == 100 + k;
    BOOST_TEST(all_ranks(ok));
}

BOOST_AUTO_TEST_CASE(send_recv_ring) {
    auto g = world_grid();
    const comm::Comm& c = g.comms.world;
    const int n = c.size(), r = c.rank();
    if (n == 1)
        return;
    Buffer out(DType::i32, {2}), in(DType::i32, {2});
    out.ptr<int32_t>()[0] = r, out.ptr<int32_t>()[1] = -r;
    // even ranks send first, odd ranks receive first: no deadlock for blocking calls
    int next = (r + 1) % n, prev = (r + n - 1) % n;
    if (r % 2 == 0) {
        comm::send(out.view(), next, c, 7);
        comm::recv(in.view(), prev, c, 7);
    } else {
        comm::recv(in.view(), prev, c, 7);
        comm::send(out.view(), next, c, 7);
    }
    BOOST_TEST(all_ranks(in.ptr<int32_t>()[0] == prev && in.ptr<int32_t>()[1] == -prev));
}

BOOST_AUTO_TEST_CASE(all_to_all_v_routes_every_row_once) {
    auto g = world_grid();
    const comm::Comm& c = g.comms.world;
    const int n = c.size(), r = c.rank();
    // rank r sends (r + d) % 3 rows to rank d; row = (src, dst, index, 0.5)
    std::vector<int64_t> send_rows(n);
    int64_t total = 0;
    for (int d = 0; d < n; ++d)
        total += send_rows[d] = (r + d) % 3;
    Buffer in(DType::f32, {total, 4});
    float* row = in.ptr<float>();
    for (int d = 0; d < n; ++d)
        for (int64_t k = 0; k < send_rows[d]; ++k, row += 4)
            row[0] = static_cast<float>(r), row[1] = static_cast<float>(d),
            row[2] = static_cast<float>(k), row[3] = 0.5f;
    std::vector<int64_t> recv_rows = comm::exchange_counts(send_rows, c);
    int64_t received = 0;
    bool ok = true;
    for (int s = 0; s < n; ++s) {
        ok = ok && recv_rows[s] == (s + r) % 3;
        received += recv_rows[s];
    }
    Buffer out(DType::f32, {received, 4});
    comm::all_to_all_v(in.view(), send_rows, out.view(), recv_rows, c);
    const float* got = out.ptr<float>();
    for (int s = 0; s < n; ++s)
        for (int64_t k = 0; k < recv_rows[s]; ++k, got += 4)
            ok = ok && got[0] == static_cast<float>(s) && got[1] == static_cast<float>(r) &&
                 got[2] == static_cast<float>(k) && got[3] == 0.5f;
    BOOST_TEST(all_ranks(ok));
}

BOOST_AUTO_TEST_CASE(mpi_errors_become_hymoe_errors) {
    auto g = world_grid();
    Buffer b(DType::f32, {1});
    std::string message;
    try {
        comm::broadcast(b.view(), g.comms.world.size() + 3, g.comms.world);  // no such root
    } catch (const hymoe::Error& e) {
        message = e.what();
    }
    BOOST_TEST(all_ranks(message.find("MPI_Bcast") != std::string::npos &&
                         message.find("broadcast of [1] over world") != std::string::npos));
}

BOOST_AUTO_TEST_SUITE_END()
