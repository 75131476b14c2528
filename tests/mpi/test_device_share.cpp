// share_device (parallel/device_share.h) with made-up device ids and free memory, so without a
// GPU: every rank of the node on one device is counted with the least free memory any of them
// read, and runtime::arena_share then gives 2 ranks half of job.device_memory each; ranks on two
// devices (world rank mod 2) count and read only their own device's; a rank that cannot read its
// free memory makes every rank of the node throw (none left waiting). The test runs on one node.
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>
#include <mpi.h>

#include "../testing.h"
#include "hymoe/core/error.h"
#include "hymoe/parallel/device_share.h"
#include "hymoe/runtime/device_choice.h"

using hymoe::parallel::DeviceShare;
using hymoe::parallel::share_device;
using hymoe::testing::all_ranks;
using hymoe::testing::world_size;

namespace {

int world_rank() {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(device_share)

BOOST_AUTO_TEST_CASE(ranks_on_one_device_split_its_least_free_memory) {
    const int n = world_size(), me = world_rank();
    // rank r reads 1000 + 10 r bytes free (as if the others' contexts came and went)
    const DeviceShare s = share_device(0, [&] { return size_t(1000 + 10 * me); });
    BOOST_TEST(all_ranks(s.sharers == n && s.free_bytes == 1000u));
    const size_t arena = hymoe::runtime::arena_share(s.free_bytes, 0.9, s.sharers);
    BOOST_TEST(all_ranks(arena == size_t(900 / n)));
    if (n == 2)
        BOOST_TEST(all_ranks(arena == 450u));  // two ranks on one GPU: half each
}

BOOST_AUTO_TEST_CASE(ranks_on_two_devices_count_their_own) {
    const int n = world_size(), me = world_rank();
    const int device = me % 2;
    const DeviceShare s = share_device(device, [&] { return size_t(5000 - me); });
    const int on_mine = (n + 1 - device) / 2;  // ranks r < n with r % 2 == device
    const size_t least = size_t(5000 - (device + 2 * (on_mine - 1)));  // the highest such rank
    BOOST_TEST(all_ranks(s.sharers == on_mine && s.free_bytes == least));
}

BOOST_AUTO_TEST_CASE(a_failed_read_throws_on_every_rank) {
    const int me = world_rank();
    bool threw = false;
    std::string what;
    try {
        share_device(0, [&]() -> size_t {
            if (me == world_size() - 1)
                throw std::runtime_error("no free memory to read");
            return 1000;
        });
    } catch (const hymoe::Error& e) {
        threw = true;
        what = e.what();
    }
    BOOST_TEST(all_ranks(threw));
    BOOST_TEST_INFO(what);
    BOOST_TEST(all_ranks(what.find("share_device: ") != std::string::npos));
}

BOOST_AUTO_TEST_SUITE_END()
