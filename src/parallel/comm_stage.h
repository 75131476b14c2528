// comm::stage: the device collectives of a Comm whose ranks share a GPU (CUDA builds only;
// src/parallel/comm_stage.cu). NCCL refuses two ranks of one communicator on one device, so such
// a Comm copies its device tensors to host memory, runs the MPI form on them (the same checks, row
// layout and fp32 accumulation as host tensors) and copies the result back; every call returns
// with the result in device memory. staged() decides once per Comm, collectively, on its first
// device collective: every rank's device identity (PCI bus id and host name) is gathered, and a
// duplicate, or HYMOE_COMM_STAGE=1 on any rank, sends that Comm through host memory.
#pragma once

#include <vector>

#include "hymoe/parallel/comm.h"

namespace hymoe::comm::stage {

// True when c's device collectives go through host memory; decided on the first call
// (collective over c), then remembered in c.
bool staged(const Comm& c);

void all_reduce(Tensor& x, const Comm& c, ReduceOp op);
void broadcast(Tensor& x, int root, const Comm& c);
void all_gather(const Tensor& in, Tensor& out, const Comm& c);
void reduce_scatter(const Tensor& in, Tensor& out, const Comm& c, ReduceOp op);
void send(const Tensor& x, int dest, const Comm& c, int tag);
void recv(Tensor& x, int src, const Comm& c, int tag);
void all_to_all_v(const Tensor& in,
                  const std::vector<int64_t>& send_rows,
                  Tensor& out,
                  const std::vector<int64_t>& recv_rows,
                  const Comm& c);
// On `stream` (a cudaStream_t): synchronises it first, returns with out written.
void all_to_all_v_queued(const Tensor& in,
                         const std::vector<int64_t>& send_rows,
                         Tensor& out,
                         const std::vector<int64_t>& recv_rows,
                         const Comm& c,
                         void* stream);

}  // namespace hymoe::comm::stage
