// select_device: local ranks (MPI_COMM_TYPE_SHARED) agree with a gather of host names at any world
// size; asking for CUDA where no GPU exists falls back to the CPU on every rank, in both builds,
// without an error; where a GPU is used, the device follows the local rank.
#include <filesystem>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>
#include <mpi.h>

#include "../testing.h"
#include "hymoe/core/error.h"
#include "hymoe/parallel/device_select.h"

using hymoe::backend::DeviceInfo;
using hymoe::parallel::select_device;
using hymoe::testing::all_ranks;
using hymoe::testing::world_size;

namespace {

// Every rank's host name, in world-rank order.
std::vector<std::string> world_host_names() {
    std::vector<char> mine(MPI_MAX_PROCESSOR_NAME, '\0');
    int len = 0;
    MPI_Get_processor_name(mine.data(), &len);
    const int n = world_size();
    std::vector<char> all(static_cast<size_t>(n) * MPI_MAX_PROCESSOR_NAME, '\0');
    MPI_Allgather(mine.data(),
                  MPI_MAX_PROCESSOR_NAME,
                  MPI_CHAR,
                  all.data(),
                  MPI_MAX_PROCESSOR_NAME,
                  MPI_CHAR,
                  MPI_COMM_WORLD);
    std::vector<std::string> names;
    for (int r = 0; r < n; ++r)
        names.emplace_back(all.data() + static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME);
    return names;
}

std::vector<int> world_gather(int value) {
    std::vector<int> all(static_cast<size_t>(world_size()), 0);
    MPI_Allgather(&value, 1, MPI_INT, all.data(), 1, MPI_INT, MPI_COMM_WORLD);
    return all;
}

// Without the NVIDIA driver's control device no process on this machine can see a GPU.
bool machine_has_no_gpu() {
    return !std::filesystem::exists("/dev/nvidiactl");
}

}  // namespace

BOOST_AUTO_TEST_SUITE(device)

BOOST_AUTO_TEST_CASE(cpu_local_ranks_follow_host_names) {
    const DeviceInfo d = select_device(false);
    bool ok = !d.cuda_available && d.n_devices == 0 && d.device == -1 && d.name.empty() &&
              d.memory_gb == 0.0;
    const std::vector<std::string> hosts = world_host_names();
    const std::vector<int> local = world_gather(d.local_rank);
    // Local rank of r = how many lower world ranks share r's host; on one node that is 0..n-1.
    for (size_t r = 0; r < hosts.size(); ++r) {
        int lower_on_host = 0;
        for (size_t q = 0; q < r; ++q)
            lower_on_host += hosts[q] == hosts[r] ? 1 : 0;
        ok = ok && local[r] == lower_on_host;
    }
    BOOST_TEST(all_ranks(ok));
}

BOOST_AUTO_TEST_CASE(cuda_request_falls_back_without_gpu) {
    DeviceInfo d;
    bool threw = false;
    try {
        d = select_device(true);
    } catch (const hymoe::Error& e) {
        threw = true;
        BOOST_TEST_MESSAGE("select_device(true) threw: " << e.what());
    }
    BOOST_TEST(all_ranks(!threw));
    // Every rank reports the same availability.
    BOOST_TEST(all_ranks(d.cuda_available) == !all_ranks(!d.cuda_available));
    bool ok = true;
#ifndef HYMOE_CUDA
    ok = ok && !d.cuda_available && d.n_devices == 0;
#endif
    if (machine_has_no_gpu())
        ok = ok && !d.cuda_available && d.n_devices == 0;
    if (d.cuda_available)
        ok = ok && d.n_devices > 0 && d.device == d.local_rank % d.n_devices && !d.name.empty() &&
             d.memory_gb > 0.0;
    else
        ok = ok && d.device == -1 && d.name.empty() && d.memory_gb == 0.0;
    BOOST_TEST_INFO("cuda_available " << d.cuda_available << ", n_devices " << d.n_devices
                                      << ", device " << d.device << " (" << d.name << ")");
    BOOST_TEST(all_ranks(ok));
    // The local rank does not depend on whether CUDA was asked for.
    BOOST_TEST(all_ranks(d.local_rank == select_device(false).local_rank));
}

BOOST_AUTO_TEST_SUITE_END()
