// make bench: comm:: collective bandwidth as a ratio of the memory bandwidth measured in the same
// run (a memcpy of the same size on each rank). Reports, asserts nothing. Run under mpirun.
//   all_reduce bus bandwidth = bytes · 2(n−1)/n / time   (NCCL-tests convention)
//   all_to_all_v bandwidth   = bytes sent per rank / time
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include <mpi.h>

#include "hymoe/core/timer.h"
#include "hymoe/parallel/comms.h"
#include "hymoe/parallel/mpi_env.h"

namespace {

using hymoe::wall_seconds;

// Best time of `reps` runs of f, the slowest rank deciding each run.
template <typename F>
double best_seconds(int reps, F&& f) {
    double best = 1e30;
    for (int i = 0; i < reps; ++i) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = wall_seconds();
        f();
        double t = wall_seconds() - t0;
        MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        best = std::min(best, t);
    }
    return best;
}

}  // namespace

int main(int argc, char** argv) {
    hymoe::parallel::MpiEnv mpi(&argc, &argv);
    const int n = hymoe::parallel::world_size();
    auto grid = hymoe::parallel::make_grid(hymoe::parallel::Layout{n, 1, 1, 1, 1});
    const hymoe::comm::Comm& world = grid.comms.world;
    const int64_t count = int64_t{1} << 24;  // 16 Mi floats = 64 MiB per rank
    const double bytes = static_cast<double>(count) * 4;

    hymoe::Buffer a(hymoe::DType::f32, {count}), b(hymoe::DType::f32, {count});
    std::fill(a.ptr<float>(), a.ptr<float>() + count, 1.0f);
    double t_copy = best_seconds(5, [&] { std::memcpy(b.ptr<float>(), a.ptr<float>(), bytes); });
    double copy_bw = 2 * bytes / t_copy;  // read + write

    double t_ar = best_seconds(5, [&] { hymoe::comm::all_reduce(a.view(), world); });
    double bus_bw = bytes * 2.0 * (n - 1) / n / t_ar;

    std::vector<int64_t> rows(n, count / 1024 / n);
    hymoe::Tensor in = a.view();
    in.shape = {count / 1024 / n * n, 1024};
    hymoe::Tensor out = b.view();
    out.shape = in.shape;
    double t_a2a = best_seconds(5, [&] { hymoe::comm::all_to_all_v(in, rows, out, rows, world); });
    double a2a_bw = static_cast<double>(in.bytes()) / t_a2a;

    if (grid.rank == 0) {
        std::printf("comm bench, %d ranks, 64 MiB per rank (best of 5)\n", n);
        std::printf("  memcpy (read+write)       %7.2f GB/s   (reference)\n", copy_bw / 1e9);
        std::printf("  all_reduce f32 bus bw     %7.2f GB/s   %.2f of memcpy\n",
                    bus_bw / 1e9,
                    bus_bw / copy_bw);
        std::printf("  all_to_all_v per rank     %7.2f GB/s   %.2f of memcpy\n",
                    a2a_bw / 1e9,
                    a2a_bw / copy_bw);
    }
    return 0;
}
