// comm:: collectives on tensors over one communicator. Blocks call these and never MPI or NCCL:
// host tensors go through MPI; device tensors (CUDA builds) through NCCL, or through host memory
// when ranks share a GPU (the end of this file). Every MPI/NCCL error becomes a hymoe::Error naming
// the operation and the communicator. No MPI header here, so model/ code can include it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hymoe/tensor/tensor.h"

namespace hymoe::comm {

// One communicator: an MPI communicator (plus an NCCL one made from it in CUDA builds).
class Comm {
public:
    struct Impl;  // src/parallel/comm_impl.h
    Comm() = default;
    explicit Comm(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
    int rank() const;
    int size() const;
    const std::string& name() const;  // "tp", "ep", ... for messages
    Impl& impl() const;

private:
    std::shared_ptr<Impl> impl_;
};

// A communicator of this process alone (MPI_COMM_SELF duplicated): for files one rank writes.
Comm self_comm();

enum class ReduceOp { sum, max, min };

// x ← op over ranks of x (in place). f32, bf16, f16, i32, i64.
void all_reduce(Tensor& x, const Comm& c, ReduceOp op = ReduceOp::sum);
// x ← root's x.
void broadcast(Tensor& x, int root, const Comm& c);
// One integer (a count, a flag, a vote): op over every rank's value / the root's value.
int64_t all_reduce_value(int64_t value, const Comm& c, ReduceOp op = ReduceOp::sum);
int64_t broadcast_value(int64_t value, int root, const Comm& c);
// Host doubles (loss sums, statistics) summed over ranks, in place.
void all_reduce_sum(std::vector<double>& x, const Comm& c);
// in [n, ...] on every rank → out [size·n, ...], rank r's rows at [r·n, (r+1)·n).
void all_gather(const Tensor& in, Tensor& out, const Comm& c);
// in [size·n, ...] → out [n, ...] = op over ranks of in's rows [rank·n, (rank+1)·n).
void reduce_scatter(const Tensor& in, Tensor& out, const Comm& c, ReduceOp op = ReduceOp::sum);
void send(const Tensor& x, int dest, const Comm& c, int tag);
void recv(Tensor& x, int src, const Comm& c, int tag);
void barrier(const Comm& c);

// All-to-all-v over rows, in two steps (as DeepEP's notify_dispatch then dispatch):
// exchange_counts() tells each rank how many rows it will receive from every rank; the caller
// allocates out with that many rows; all_to_all_v() then sends the first send_rows[0] rows of in
// to rank 0, the next send_rows[1] to rank 1, ..., and out holds the received rows in source-rank
// order (recv_rows[r] rows from rank r).
std::vector<int64_t> exchange_counts(const std::vector<int64_t>& send_rows, const Comm& c);
void all_to_all_v(const Tensor& in,
                  const std::vector<int64_t>& send_rows,
                  Tensor& out,
                  const std::vector<int64_t>& recv_rows,
                  const Comm& c);

// A non-blocking collective in flight. Its tensors must stay alive and untouched until it
// completes (the counts are copied). Movable; a Request still in flight when destroyed is waited
// for. MPI progresses it only inside MPI calls, so a caller computing meanwhile calls test()
// between pieces of work.
class Request {
public:
    struct Impl;  // src/parallel/comm_mpi.cpp
    Request();
    explicit Request(std::unique_ptr<Impl> impl);
    Request(Request&&) noexcept;
    Request& operator=(Request&&) noexcept;
    ~Request();
    bool test();  // progress it; true once it has completed
    void wait();  // block until it has completed (at once if it has, or was never started)

private:
    std::unique_ptr<Impl> impl_;
};

// all_to_all_v, started and not waited for (MPI_Ialltoallv): the same checks and row layout;
// out holds the rows once the Request completes. Device tensors (CUDA builds) go as all_to_all_v
// does (NCCL or host memory) and return a completed Request.
Request all_to_all_v_start(const Tensor& in,
                           const std::vector<int64_t>& send_rows,
                           Tensor& out,
                           const std::vector<int64_t>& recv_rows,
                           const Comm& c);

// all_to_all_v of device tensors (CUDA builds) queued on `stream` (a cudaStream_t) and not waited
// for: NCCL's grouped sends and receives run on that stream in queue order with the kernels
// around them, so the caller orders its producers and consumers with events on it. The same
// checks and row layout as all_to_all_v; in and out must stay alive until the stream has run it.
// Collective over c: every rank queues its calls on c in one order. Staged: complete on return.
void all_to_all_v_queued(const Tensor& in,
                         const std::vector<int64_t>& send_rows,
                         Tensor& out,
                         const std::vector<int64_t>& recv_rows,
                         const Comm& c,
                         void* stream);

// send, started and not waited for (MPI_Isend): x must stay alive and untouched until the
// Request completes. Device tensors are sent at once (NCCL or staged) and return a completed one.
Request send_start(const Tensor& x, int dest, const Comm& c, int tag);

}  // namespace hymoe::comm

// Device tensors when ranks share a GPU (CUDA builds). NCCL refuses a communicator with two ranks
// on one GPU, so on its first device collective a Comm decides, collectively (every rank's PCI bus
// id and host name gathered), how its device tensors travel: NCCL when each rank has its own GPU,
// else staged through host memory, which its rank 0 logs once with the reason. HYMOE_COMM_STAGE=1
// on any rank forces staging (tests, debugging); 0 or unset leaves the choice to the devices, and
// another value fails that first call (exit 2). A staged call waits for the stream its data was
// written on (the per-thread default stream; all_to_all_v_queued: the caller's), copies the data
// to host memory, runs the MPI form above on it (the same checks and row layout, bf16/f16 summed
// in fp32) and copies the result back: it returns with the result in device memory, so the
// queued and started variants complete synchronously.
