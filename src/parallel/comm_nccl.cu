// comm::nccl: the NCCL side of comm:: for device tensors (CUDA builds). comm_mpi.cpp has already
// checked shapes, dtypes and counts, and stage::staged (comm_stage.h) has found that every rank of
// the Comm has its own GPU; these functions map the call onto NCCL and nothing more.
// A Comm gets its NCCL communicator lazily, on its first device call, from its MPI communicator:
// comm rank 0 calls ncclGetUniqueId, one MPI_Bcast hands the id together with rank 0's return
// code to every rank (so a failure there fails every rank instead of leaving them waiting), then
// ncclCommInitRank makes it on the current device (select_device has called cudaSetDevice). That
// first call is therefore collective over the Comm, as every collective here already is.
// Every call runs on the current stream (for now the per-thread default stream) and synchronises
// it before returning, so the result is ready and the tensors reusable when the call returns;
// all_to_all_v_queued alone runs on the caller's stream and returns once queued.
// Unlike the MPI path (fp32 accumulation, one rounding), NCCL reduces bf16/f16 in their own type.
#include <cstddef>
#include <cstdint>
#include <vector>

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include "../backend/cuda/check.h"
#include "comm_impl.h"
#include "nccl.h"  // src/parallel/nccl.h, the declarations implemented here

namespace hymoe::comm::nccl {

namespace {

using backend::cuda::nccl_error_text;

// The stream every comm:: device call runs on, until the callers pass one.
cudaStream_t current_stream() {
    return cudaStreamPerThread;
}

ncclDataType_t nccl_type(DType t) {
    switch (t) {
        case DType::f32:
            return ncclFloat32;
        case DType::f16:
            return ncclFloat16;
        case DType::bf16:
            return ncclBfloat16;
        case DType::i32:
            return ncclInt32;
        case DType::i64:
            return ncclInt64;
        case DType::u8:
            return ncclUint8;
    }
    return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) {
    switch (op) {
        case ReduceOp::sum:
            return ncclSum;
        case ReduceOp::max:
            return ncclMax;
        case ReduceOp::min:
            return ncclMin;
    }
    return ncclSum;
}

// The NCCL communicator of c, made on its first use (collective over c).
ncclComm_t handle(const Comm& c) {
    Comm::Impl& impl = c.impl();
    if (impl.nccl != nullptr)
        return impl.nccl;
    struct {
        ncclUniqueId id;
        int rc;  // rank 0's ncclGetUniqueId result
    } root{};
    if (impl.rank == 0)
        root.rc = static_cast<int>(ncclGetUniqueId(&root.id));
    HYMOE_MPI_CHECK(MPI_Bcast(&root, static_cast<int>(sizeof root), MPI_BYTE, 0, impl.mpi),
                    "NCCL unique id broadcast over ",
                    impl.name);
    if (root.rc != ncclSuccess)
        HYMOE_FAIL_ONE(Exit::internal,
                       "ncclGetUniqueId failed on rank 0 of ",
                       impl.name,
                       " (",
                       nccl_error_text(static_cast<ncclResult_t>(root.rc)),
                       ")");
    int device = -1;
    HYMOE_CUDA_CHECK(cudaGetDevice(&device), "NCCL communicator for ", impl.name);
    ncclComm_t made = nullptr;
    HYMOE_NCCL_CHECK(ncclCommInitRank(&made, impl.size, root.id, impl.rank),
                     "NCCL communicator for ",
                     impl.name,
                     " (rank ",
                     impl.rank,
                     " of ",
                     impl.size,
                     ", device ",
                     device,
                     ")");
    impl.nccl = made;
    return made;
}

// Waits for the call just queued on the stream, then checks NCCL's asynchronous error state.
void finish(ncclComm_t nc, const char* what, const Tensor& t, const Comm& c) {
    HYMOE_CUDA_CHECK(cudaStreamSynchronize(current_stream()),
                     what,
                     " of ",
                     shape_string(t.shape),
                     " ",
                     to_string(t.dtype),
                     " over ",
                     c.name());
    ncclResult_t async = ncclSuccess;
    HYMOE_NCCL_CHECK(ncclCommGetAsyncError(nc, &async), what, " over ", c.name());
    if (async != ncclSuccess)
        HYMOE_FAIL_ONE(Exit::internal,
                       what,
                       " of ",
                       shape_string(t.shape),
                       " over ",
                       c.name(),
                       ": NCCL asynchronous error (",
                       nccl_error_text(async),
                       ")");
}

size_t count_of(const Tensor& t) {
    return static_cast<size_t>(t.numel());
}

}  // namespace

void all_reduce(Tensor& x, const Comm& c, ReduceOp op) {
    ncclComm_t nc = handle(c);
    HYMOE_NCCL_CHECK(
        ncclAllReduce(
            x.data, x.data, count_of(x), nccl_type(x.dtype), nccl_op(op), nc, current_stream()),
        "all_reduce of ",
        shape_string(x.shape),
        " ",
        to_string(x.dtype),
        " over ",
        c.name());
    finish(nc, "all_reduce", x, c);
}

void broadcast(Tensor& x, int root, const Comm& c) {
    ncclComm_t nc = handle(c);
    HYMOE_NCCL_CHECK(
        ncclBroadcast(x.data, x.data, x.bytes(), ncclUint8, root, nc, current_stream()),
        "broadcast of ",
        shape_string(x.shape),
        " from rank ",
        root,
        " over ",
        c.name());
    finish(nc, "broadcast", x, c);
}

void all_gather(const Tensor& in, Tensor& out, const Comm& c) {
    ncclComm_t nc = handle(c);
    HYMOE_NCCL_CHECK(ncclAllGather(in.data, out.data, in.bytes(), ncclUint8, nc, current_stream()),
                     "all_gather of ",
                     shape_string(in.shape),
                     " over ",
                     c.name());
    finish(nc, "all_gather", in, c);
}

void reduce_scatter(const Tensor& in, Tensor& out, const Comm& c, ReduceOp op) {
    ncclComm_t nc = handle(c);
    HYMOE_NCCL_CHECK(ncclReduceScatter(in.data,
                                       out.data,
                                       count_of(out),
                                       nccl_type(in.dtype),
                                       nccl_op(op),
                                       nc,
                                       current_stream()),
                     "reduce_scatter of ",
                     shape_string(in.shape),
                     " ",
                     to_string(in.dtype),
                     " over ",
                     c.name());
    finish(nc, "reduce_scatter", in, c);
}

void send(const Tensor& x, int dest, const Comm& c, int /*tag*/) {
    ncclComm_t nc = handle(c);
    HYMOE_NCCL_CHECK(ncclSend(x.data, x.bytes(), ncclUint8, dest, nc, current_stream()),
                     "send of ",
                     shape_string(x.shape),
                     " to rank ",
                     dest,
                     " of ",
                     c.name());
    finish(nc, "send", x, c);
}

void recv(Tensor& x, int src, const Comm& c, int /*tag*/) {
    ncclComm_t nc = handle(c);
    HYMOE_NCCL_CHECK(ncclRecv(x.data, x.bytes(), ncclUint8, src, nc, current_stream()),
                     "recv of ",
                     shape_string(x.shape),
                     " from rank ",
                     src,
                     " of ",
                     c.name());
    finish(nc, "recv", x, c);
}

namespace {

// One group of point-to-point calls: to every rank r, the next send_rows[r] rows of in; from
// every rank r, recv_rows[r] rows into out, in source-rank order. Empty blocks are skipped. The
// group is always closed, even when a call inside it fails, before the error is raised.
void queue_all_to_all_v(const Tensor& in,
                        const std::vector<int64_t>& send_rows,
                        Tensor& out,
                        const std::vector<int64_t>& recv_rows,
                        const Comm& c,
                        ncclComm_t nc,
                        cudaStream_t stream) {
    const size_t row_bytes =
        dtype_size(in.dtype) *
        static_cast<size_t>(shape_numel(Shape(in.shape.begin() + 1, in.shape.end())));
    const char* src = static_cast<const char*>(in.data);
    char* dst = static_cast<char*>(out.data);
    HYMOE_NCCL_CHECK(ncclGroupStart(), "all_to_all_v over ", c.name());
    ncclResult_t rc = ncclSuccess;
    const char* failed = "ncclGroupEnd";
    int failed_peer = -1;
    size_t sent = 0, received = 0;
    for (int r = 0; r < c.size() && rc == ncclSuccess; ++r) {
        const size_t n_send = static_cast<size_t>(send_rows[r]) * row_bytes;
        const size_t n_recv = static_cast<size_t>(recv_rows[r]) * row_bytes;
        if (n_send > 0) {
            failed = "ncclSend";
            failed_peer = r;
            rc = ncclSend(src + sent, n_send, ncclUint8, r, nc, stream);
        }
        if (rc == ncclSuccess && n_recv > 0) {
            failed = "ncclRecv";
            failed_peer = r;
            rc = ncclRecv(dst + received, n_recv, ncclUint8, r, nc, stream);
        }
        sent += n_send;
        received += n_recv;
    }
    const ncclResult_t end = ncclGroupEnd();
    if (rc == ncclSuccess) {
        rc = end;
        failed = "ncclGroupEnd";
        failed_peer = -1;
    }
    if (rc != ncclSuccess)
        HYMOE_FAIL_ONE(Exit::internal,
                       failed,
                       " failed (",
                       nccl_error_text(rc),
                       "): all_to_all_v of ",
                       shape_string(in.shape),
                       " over ",
                       c.name(),
                       failed_peer >= 0 ? cat(", peer rank ", failed_peer) : std::string());
}

}  // namespace

void all_to_all_v(const Tensor& in,
                  const std::vector<int64_t>& send_rows,
                  Tensor& out,
                  const std::vector<int64_t>& recv_rows,
                  const Comm& c) {
    ncclComm_t nc = handle(c);
    queue_all_to_all_v(in, send_rows, out, recv_rows, c, nc, current_stream());
    finish(nc, "all_to_all_v", in, c);
}

void all_to_all_v_queued(const Tensor& in,
                         const std::vector<int64_t>& send_rows,
                         Tensor& out,
                         const std::vector<int64_t>& recv_rows,
                         const Comm& c,
                         void* stream) {
    queue_all_to_all_v(
        in, send_rows, out, recv_rows, c, handle(c), static_cast<cudaStream_t>(stream));
}

// Called from ~Comm::Impl: never throws, and a failure to free is not worth a crash at exit.
void destroy(Comm::Impl& impl) {
    if (impl.nccl == nullptr)
        return;
    (void)ncclCommDestroy(impl.nccl);
    impl.nccl = nullptr;
}

}  // namespace hymoe::comm::nccl
