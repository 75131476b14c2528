// comm::stage (comm_stage.h): device collectives through host memory, for a Comm whose ranks
// share a GPU. Each call copies its device inputs to host Buffers on the stream the NCCL path
// would use (the per-thread default stream; all_to_all_v_queued: the caller's), which orders the
// copy after the work queued there before it, waits for the copy, calls the host form of the same
// collective (comm_mpi.cpp: MPI, fp32 accumulation of bf16/f16) and copies the result back,
// waiting for that copy too. The decision (staged) gathers each rank's device identity once per
// Comm, so every rank of it takes the same path.
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <mpi.h>

#include "../backend/cuda/check.h"
#include "comm_impl.h"
#include "comm_stage.h"
#include "hymoe/core/log.h"

namespace hymoe::comm::stage {

namespace {

// One rank's device as all ranks see it: the PCI bus id of its current GPU, the host it runs on,
// its HYMOE_COMM_STAGE (1: stage through host memory; 0: unset, empty or "0"; -1: another value)
// and cudaGetDevice / cudaDeviceGetPCIBusId's result (so a failure fails every rank of the Comm,
// none left waiting).
struct Identity {
    char bus[32];
    char host[MPI_MAX_PROCESSOR_NAME];
    int forced;
    int rc;
};

Identity my_identity() {
    Identity me;
    std::memset(&me, 0, sizeof me);
    int device = -1;
    cudaError_t rc = cudaGetDevice(&device);
    if (rc == cudaSuccess)
        rc = cudaDeviceGetPCIBusId(me.bus, static_cast<int>(sizeof me.bus), device);
    me.rc = static_cast<int>(rc);
    int len = 0;
    MPI_Get_processor_name(me.host, &len);
    const char* env = std::getenv("HYMOE_COMM_STAGE");
    if (env != nullptr && std::strcmp(env, "1") == 0)
        me.forced = 1;
    else if (env != nullptr && env[0] != '\0' && std::strcmp(env, "0") != 0)
        me.forced = -1;
    return me;
}

bool same_device(const Identity& a, const Identity& b) {
    return std::strcmp(a.bus, b.bus) == 0 && std::strcmp(a.host, b.host) == 0;
}

// Why c's ranks go through host memory ("" when they need not), from every rank's identity.
std::string reason(const std::vector<Identity>& all) {
    for (const Identity& id : all)
        if (id.forced == 1)
            return "HYMOE_COMM_STAGE=1";
    for (size_t a = 0; a < all.size(); ++a)
        for (size_t b = a + 1; b < all.size(); ++b)
            if (same_device(all[a], all[b]))
                return cat("ranks ",
                           a,
                           " and ",
                           b,
                           " share the GPU ",
                           all[a].bus,
                           " on host ",
                           all[a].host,
                           "; NCCL needs one GPU per rank");
    return "";
}

cudaStream_t default_stream() {
    return cudaStreamPerThread;
}

// A staged call waits for its stream, which a CUDA graph capture cannot: refused with the reason.
void check_not_capturing(cudaStream_t stream, const char* what, const Comm& c) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    HYMOE_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture), what, " over ", c.name());
    HYMOE_CHECK(capture == cudaStreamCaptureStatusNone,
                what,
                " over ",
                c.name(),
                ": a communicator staged through host memory cannot run inside a CUDA graph");
}

// A host copy of device tensor d, copied on `stream` after the work queued there, and waited for.
Buffer to_host(const Tensor& d, cudaStream_t stream, const char* what, const Comm& c) {
    check_not_capturing(stream, what, c);
    Buffer h(d.dtype, d.shape, uninit);
    if (d.bytes() > 0)
        HYMOE_CUDA_CHECK(
            cudaMemcpyAsync(h.view().data, d.data, d.bytes(), cudaMemcpyDeviceToHost, stream),
            what,
            " of ",
            shape_string(d.shape),
            " over ",
            c.name(),
            " (staged: to host)");
    HYMOE_CUDA_CHECK(cudaStreamSynchronize(stream), what, " over ", c.name(), " (staged: to host)");
    return h;
}

// Device tensor d ← host tensor h (same shape and dtype), waited for.
void to_device(const Tensor& h, Tensor& d, cudaStream_t stream, const char* what, const Comm& c) {
    check_not_capturing(stream, what, c);
    if (h.bytes() > 0)
        HYMOE_CUDA_CHECK(cudaMemcpyAsync(d.data, h.data, h.bytes(), cudaMemcpyHostToDevice, stream),
                         what,
                         " of ",
                         shape_string(d.shape),
                         " over ",
                         c.name(),
                         " (staged: to device)");
    HYMOE_CUDA_CHECK(
        cudaStreamSynchronize(stream), what, " over ", c.name(), " (staged: to device)");
}

}  // namespace

bool staged(const Comm& c) {
    using Path = Comm::Impl::DevicePath;
    Comm::Impl& impl = c.impl();
    if (impl.device_path != Path::undecided)
        return impl.device_path == Path::host;
    const Identity me = my_identity();
    std::vector<Identity> all(static_cast<size_t>(impl.size));
    HYMOE_MPI_CHECK(MPI_Allgather(&me,
                                  static_cast<int>(sizeof me),
                                  MPI_BYTE,
                                  all.data(),
                                  static_cast<int>(sizeof me),
                                  MPI_BYTE,
                                  impl.mpi),
                    "device identity exchange over ",
                    impl.name);
    for (size_t r = 0; r < all.size(); ++r)
        if (all[r].rc != cudaSuccess)
            HYMOE_FAIL_ONE(Exit::internal,
                           "device collectives over ",
                           impl.name,
                           ": rank ",
                           r,
                           " could not name its GPU (",
                           cudaGetErrorString(static_cast<cudaError_t>(all[r].rc)),
                           ")");
    for (size_t r = 0; r < all.size(); ++r)
        if (all[r].forced < 0)
            HYMOE_FAIL_ONE(Exit::invalid,
                           "HYMOE_COMM_STAGE on rank ",
                           r,
                           " of ",
                           impl.name,
                           " must be 1 (stage device collectives through host memory) or 0");
    const std::string why = reason(all);
    impl.device_path = why.empty() ? Path::nccl : Path::host;
    if (!why.empty() && impl.rank == 0)
        log::info(cat("comm ",
                      impl.name,
                      ": device collectives stage through host memory and MPI (",
                      why,
                      ")"));
    return !why.empty();
}

void all_reduce(Tensor& x, const Comm& c, ReduceOp op) {
    Buffer h = to_host(x, default_stream(), "all_reduce", c);
    comm::all_reduce(h.view(), c, op);
    to_device(h.view(), x, default_stream(), "all_reduce", c);
}

void broadcast(Tensor& x, int root, const Comm& c) {
    Buffer h = c.rank() == root ? to_host(x, default_stream(), "broadcast", c)
                                : Buffer(x.dtype, x.shape, uninit);
    comm::broadcast(h.view(), root, c);
    if (c.rank() != root)
        to_device(h.view(), x, default_stream(), "broadcast", c);
}

void all_gather(const Tensor& in, Tensor& out, const Comm& c) {
    Buffer h_in = to_host(in, default_stream(), "all_gather", c);
    Buffer h_out(out.dtype, out.shape, uninit);
    comm::all_gather(h_in.view(), h_out.view(), c);
    to_device(h_out.view(), out, default_stream(), "all_gather", c);
}

void reduce_scatter(const Tensor& in, Tensor& out, const Comm& c, ReduceOp op) {
    Buffer h_in = to_host(in, default_stream(), "reduce_scatter", c);
    Buffer h_out(out.dtype, out.shape, uninit);
    comm::reduce_scatter(h_in.view(), h_out.view(), c, op);
    to_device(h_out.view(), out, default_stream(), "reduce_scatter", c);
}

void send(const Tensor& x, int dest, const Comm& c, int tag) {
    Buffer h = to_host(x, default_stream(), "send", c);
    comm::send(h.view(), dest, c, tag);
}

void recv(Tensor& x, int src, const Comm& c, int tag) {
    Buffer h(x.dtype, x.shape, uninit);
    comm::recv(h.view(), src, c, tag);
    to_device(h.view(), x, default_stream(), "recv", c);
}

void all_to_all_v(const Tensor& in,
                  const std::vector<int64_t>& send_rows,
                  Tensor& out,
                  const std::vector<int64_t>& recv_rows,
                  const Comm& c) {
    stage::all_to_all_v_queued(in, send_rows, out, recv_rows, c, default_stream());
}

void all_to_all_v_queued(const Tensor& in,
                         const std::vector<int64_t>& send_rows,
                         Tensor& out,
                         const std::vector<int64_t>& recv_rows,
                         const Comm& c,
                         void* stream) {
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    Buffer h_in = to_host(in, s, "all_to_all_v", c);
    Buffer h_out(out.dtype, out.shape, uninit);
    comm::all_to_all_v(h_in.view(), send_rows, h_out.view(), recv_rows, c);
    to_device(h_out.view(), out, s, "all_to_all_v", c);
}

}  // namespace hymoe::comm::stage
