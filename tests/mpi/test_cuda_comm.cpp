// comm:: collectives of device tensors against the host path (CUDA builds; mpirun -np N with
// N ≥ 2 ranks that each see a GPU, which they may share; else one skip line). Every device
// collective (all_reduce sum/max/min in f32, bf16, f16, i32, i64; broadcast; all_gather;
// reduce_scatter; send/recv; send_start; all_to_all_v, its _start and _queued forms, with mixed
// counts and with the odd ranks sending and receiving nothing) runs on
// device copies of the inputs and must leave, copied back, the bytes the same call leaves on host
// tensors. Twice: with HYMOE_COMM_STAGE=1 (the communicator must stage through host memory) and
// as the machine gives (staged iff two ranks of the node share a GPU, else NCCL). The values are
// small integers, exact in every dtype and in any order of summation, so NCCL too must match bit
// for bit.
#ifdef HYMOE_CUDA

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <boost/test/unit_test.hpp>
#include <cuda_runtime.h>
#include <mpi.h>

#include "../../src/parallel/comm_stage.h"
#include "../testing.h"
#include "hymoe/core/error.h"
#include "hymoe/parallel/comms.h"
#include "hymoe/parallel/device_select.h"

namespace {

using namespace hymoe;
using hymoe::testing::all_ranks;
using hymoe::testing::world_size;

// Device memory holding a copy of a host tensor, freed on destruction.
class DeviceCopy {
public:
    explicit DeviceCopy(const Tensor& host) : t_{nullptr, host.dtype, Device::cuda, host.shape} {
        BOOST_REQUIRE(cudaMalloc(&t_.data, host.bytes() + 1) == cudaSuccess);
        BOOST_REQUIRE(cudaMemcpy(t_.data, host.data, host.bytes(), cudaMemcpyHostToDevice) ==
                      cudaSuccess);
    }
    ~DeviceCopy() { cudaFree(t_.data); }
    DeviceCopy(const DeviceCopy&) = delete;
    DeviceCopy& operator=(const DeviceCopy&) = delete;
    Tensor& view() { return t_; }
    void download(Tensor& host) const {
        BOOST_REQUIRE(cudaMemcpy(host.data, t_.data, t_.bytes(), cudaMemcpyDeviceToHost) ==
                      cudaSuccess);
    }

private:
    Tensor t_;
};

// A collective on views of its tensors (inputs and outputs alike).
using Op = std::function<void(std::vector<Tensor>&)>;

// Copies of `start` after op ran on them: on host Buffers, or on device copies then copied back.
std::vector<Buffer> after(const std::vector<Buffer>& start, bool device, const Op& op) {
    std::vector<Buffer> out;
    for (const Buffer& b : start) {
        out.emplace_back(b.view().dtype, b.view().shape);
        std::memcpy(out.back().view().data, b.view().data, b.view().bytes());
    }
    std::vector<Tensor> views;
    if (!device) {
        for (Buffer& b : out)
            views.push_back(b.view());
        op(views);
        return out;
    }
    std::vector<std::unique_ptr<DeviceCopy>> copies;
    for (Buffer& b : out) {
        copies.push_back(std::make_unique<DeviceCopy>(b.view()));
        views.push_back(copies.back()->view());
    }
    op(views);
    for (size_t i = 0; i < out.size(); ++i)
        copies[i]->download(out[i].view());
    return out;
}

// A tensor of `shape` whose element i holds the small integer (i · 3 + seed) mod 17 − 8.
Buffer values(DType dtype, const Shape& shape, int seed) {
    Buffer b(dtype, shape);
    for (int64_t i = 0; i < b.view().numel(); ++i) {
        const int v = static_cast<int>((i * 3 + seed) % 17) - 8;
        switch (dtype) {
            case DType::f32:
                b.ptr<float>()[i] = static_cast<float>(v);
                break;
            case DType::bf16:
                b.ptr<uint16_t>()[i] = float_to_bf16(static_cast<float>(v));
                break;
            case DType::f16:
                b.ptr<uint16_t>()[i] = float_to_f16(static_cast<float>(v));
                break;
            case DType::i32:
                b.ptr<int32_t>()[i] = v;
                break;
            case DType::i64:
                b.ptr<int64_t>()[i] = int64_t{v} * (int64_t{1} << 33);
                break;
            case DType::u8:
                b.ptr<uint8_t>()[i] = static_cast<uint8_t>(v + 8);
                break;
        }
    }
    return b;
}

// The Buffers given, in order, as a vector (an initializer list would copy them).
template <typename... B>
std::vector<Buffer> buffers(B&&... b) {
    std::vector<Buffer> v;
    (v.push_back(std::forward<B>(b)), ...);
    return v;
}

// op on device copies of start leaves the bytes it leaves on host Buffers, on every rank.
void check(const std::string& what, const std::vector<Buffer>& start, const Op& op) {
    const std::vector<Buffer> host = after(start, false, op);
    const std::vector<Buffer> dev = after(start, true, op);
    bool same = true;
    for (size_t i = 0; i < host.size(); ++i)
        same = same &&
               std::memcmp(host[i].view().data, dev[i].view().data, host[i].view().bytes()) == 0;
    BOOST_TEST_INFO(what);
    BOOST_TEST(all_ranks(same));
}

// The partner of rank r in pairs (0, 1), (2, 3), ...; -1 for the last of an odd count.
int partner(int r, int n) {
    const int p = r % 2 ? r - 1 : r + 1;
    return p < n ? p : -1;
}

// all_to_all_v, all_to_all_v_start and all_to_all_v_queued of rows of width 3, rank r sending
// send_rows[d] rows to rank d, against the host all_to_all_v.
void check_all_to_all_v(const comm::Comm& c,
                        const std::vector<int64_t>& send_rows,
                        const std::string& pattern) {
    const int n = c.size();
    const std::vector<int64_t> recv_rows = comm::exchange_counts(send_rows, c);
    int64_t n_send = 0, n_recv = 0;
    for (int d = 0; d < n; ++d) {
        n_send += send_rows[d];
        n_recv += recv_rows[d];
    }
    for (DType t : {DType::f32, DType::bf16, DType::i64}) {
        const auto start = [&] {
            return buffers(values(t, {n_send, 3}, 7 * c.rank()), Buffer(t, {n_recv, 3}));
        };
        check(
            cat("all_to_all_v ", pattern, " ", to_string(t)), start(), [&](std::vector<Tensor>& v) {
                comm::all_to_all_v(v[0], send_rows, v[1], recv_rows, c);
            });
        check(cat("all_to_all_v_start ", pattern, " ", to_string(t)),
              start(),
              [&](std::vector<Tensor>& v) {
                  comm::all_to_all_v_start(v[0], send_rows, v[1], recv_rows, c).wait();
              });
        // queued (device only) against the host all_to_all_v
        const std::vector<Buffer> want = after(start(), false, [&](std::vector<Tensor>& v) {
            comm::all_to_all_v(v[0], send_rows, v[1], recv_rows, c);
        });
        const std::vector<Buffer> got = after(start(), true, [&](std::vector<Tensor>& v) {
            cudaStream_t stream = nullptr;
            BOOST_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
            comm::all_to_all_v_queued(v[0], send_rows, v[1], recv_rows, c, stream);
            BOOST_REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
            cudaStreamDestroy(stream);
        });
        BOOST_TEST_INFO("all_to_all_v_queued " << pattern << " " << to_string(t));
        BOOST_TEST(all_ranks(
            std::memcmp(want[1].view().data, got[1].view().data, want[1].view().bytes()) == 0));
    }
}

// Every device collective over c against the host path.
void check_every_collective(const comm::Comm& c) {
    const int n = c.size(), r = c.rank();
    const int root = n - 1;
    for (DType t : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64})
        for (comm::ReduceOp op : {comm::ReduceOp::sum, comm::ReduceOp::max, comm::ReduceOp::min})
            check(cat("all_reduce ", to_string(t), " op ", static_cast<int>(op)),
                  buffers(values(t, {5, 3}, r)),
                  [&](std::vector<Tensor>& v) { comm::all_reduce(v[0], c, op); });
    for (DType t : {DType::u8, DType::bf16, DType::i64})
        check(cat("broadcast ", to_string(t)),
              buffers(values(t, {3, 2}, 5 * r + 1)),
              [&](std::vector<Tensor>& v) { comm::broadcast(v[0], root, c); });
    for (DType t : {DType::f32, DType::bf16})
        check(cat("all_gather ", to_string(t)),
              buffers(values(t, {2, 3}, r), Buffer(t, {2 * n, 3})),
              [&](std::vector<Tensor>& v) { comm::all_gather(v[0], v[1], c); });
    for (DType t : {DType::f32, DType::bf16, DType::i64})
        for (comm::ReduceOp op : {comm::ReduceOp::sum, comm::ReduceOp::max})
            check(cat("reduce_scatter ", to_string(t), " op ", static_cast<int>(op)),
                  buffers(values(t, {2 * n, 3}, 2 * r), Buffer(t, {2, 3})),
                  [&](std::vector<Tensor>& v) { comm::reduce_scatter(v[0], v[1], c, op); });

    // pairs swap a tensor: the even rank sends first (NCCL's send returns once received)
    const int p = partner(r, n);
    check("send/recv",
          buffers(values(DType::bf16, {4, 2}, r + 3), Buffer(DType::bf16, {4, 2})),
          [&](std::vector<Tensor>& v) {
              if (p < 0)
                  return;
              if (r % 2 == 0) {
                  comm::send(v[0], p, c, 7);
                  comm::recv(v[1], p, c, 7);
              } else {
                  comm::recv(v[1], p, c, 7);
                  comm::send(v[0], p, c, 7);
              }
          });
    check("send_start",
          buffers(values(DType::f32, {3}, r + 11), Buffer(DType::f32, {3})),
          [&](std::vector<Tensor>& v) {
              if (p < 0)
                  return;
              if (r % 2 == 0) {
                  comm::Request sent = comm::send_start(v[0], p, c, 9);
                  comm::recv(v[1], p, c, 9);
                  sent.wait();
              } else {
                  comm::recv(v[1], p, c, 9);
                  comm::send_start(v[0], p, c, 9).wait();
              }
          });

    // rank r sends (r + d + 1) mod 3 rows to rank d: some blocks empty
    std::vector<int64_t> mixed, idle;
    for (int d = 0; d < n; ++d) {
        mixed.push_back((r + d + 1) % 3);
        idle.push_back(r % 2 || d % 2 ? 0 : 2);
    }
    check_all_to_all_v(c, mixed, "mixed");
    // the odd ranks send and receive no rows at all, as an idle replica in a MoE exchange
    check_all_to_all_v(c, idle, "odd ranks idle");
}

// Whether two ranks of this node share a GPU (select_device: device = local rank mod GPUs).
bool node_shares_a_gpu(const backend::DeviceInfo& d) {
    int local_ranks = d.local_rank + 1, gpus = d.n_devices;
    MPI_Allreduce(MPI_IN_PLACE, &local_ranks, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &gpus, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return local_ranks > gpus;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_comm)

BOOST_AUTO_TEST_CASE(device_collectives_staged_and_as_given_match_the_host_path) {
    const backend::DeviceInfo d = parallel::select_device(true);
    if (world_size() < 2 || !d.cuda_available) {
        BOOST_TEST_MESSAGE("cuda_comm: skipped (needs at least 2 ranks that each see a GPU)");
        return;
    }
    const int n = world_size();
    for (bool forced : {true, false}) {
        if (forced)
            setenv("HYMOE_COMM_STAGE", "1", 1);
        // a fresh communicator decides its path on its first device collective
        parallel::Grid grid = parallel::make_grid(parallel::Layout{n, 1, 1, 1, 1});
        const comm::Comm& c = grid.comms.tp;
        const bool staged = comm::stage::staged(c);
        unsetenv("HYMOE_COMM_STAGE");
        const bool want = forced || node_shares_a_gpu(d);
        BOOST_TEST_MESSAGE("cuda_comm: " << (forced ? "HYMOE_COMM_STAGE=1" : "as given") << ", "
                                         << (staged ? "staged through host memory" : "NCCL"));
        BOOST_TEST(all_ranks(staged == want));
        check_every_collective(c);
    }
}

BOOST_AUTO_TEST_SUITE_END()

#endif  // HYMOE_CUDA
