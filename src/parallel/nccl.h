// The NCCL side of comm:: for device tensors (CUDA builds only; src/parallel/comm_nccl.cu).
#pragma once

#include "hymoe/parallel/comm.h"

namespace hymoe::comm::nccl {

void all_reduce(Tensor& x, const Comm& c, ReduceOp op);
void broadcast(Tensor& x, int root, const Comm& c);
void all_gather(const Tensor& in, Tensor& out, const Comm& c);
void reduce_scatter(const Tensor& in, Tensor& out, const Comm& c, ReduceOp op);
// NCCL has no tags (sends and receives match in call order): tag is comm::send/recv's, unused.
void send(const Tensor& x, int dest, const Comm& c, int tag);
void recv(Tensor& x, int src, const Comm& c, int tag);
// Rows to and from every rank with grouped ncclSend/ncclRecv; counts already exchanged.
void all_to_all_v(const Tensor& in,
                  const std::vector<int64_t>& send_rows,
                  Tensor& out,
                  const std::vector<int64_t>& recv_rows,
                  const Comm& c);
// The same, queued on `stream` (a cudaStream_t) and not waited for.
void all_to_all_v_queued(const Tensor& in,
                         const std::vector<int64_t>& send_rows,
                         Tensor& out,
                         const std::vector<int64_t>& recv_rows,
                         const Comm& c,
                         void* stream);
void destroy(Comm::Impl& impl);

}  // namespace hymoe::comm::nccl
