// comm:: collectives: checks shapes once, then host tensors go through MPI and device tensors
// through NCCL (CUDA builds), or, when a communicator's ranks share a GPU, through host memory and
// back into the MPI forms here (comm_stage.h). bf16/f16 reductions are summed in fp32 (converted,
// reduced, rounded back once), so a bf16 all-reduce loses no more precision than one rounding.
// all_to_all_v_start is MPI_Ialltoallv behind comm::Request, which owns the int counts MPI reads
// until the call completes.
#include <algorithm>
#include <climits>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm_impl.h"
#include "hymoe/parallel/comm.h"
#include "hymoe/parallel/mpi_handle.h"
#ifdef HYMOE_CUDA
#include "comm_stage.h"
#include "nccl.h"
#endif

namespace hymoe::comm {

namespace {

#ifdef HYMOE_CUDA
// Device tensors: NCCL, or host memory and MPI when c's ranks share a GPU (comm_stage.h).
#define HYMOE_ON_DEVICE(t, c, fn, ...) \
    if ((t).device == Device::cuda) {  \
        if (stage::staged(c))          \
            stage::fn(__VA_ARGS__);    \
        else                           \
            nccl::fn(__VA_ARGS__);     \
        return;                        \
    }
#else
#define HYMOE_ON_DEVICE(t, c, fn, ...)                                           \
    if ((t).device == Device::cuda)                                              \
        HYMOE_FAIL_ONE(Exit::internal,                                           \
                       "a device tensor reached comm:: in a build without CUDA " \
                       "(rebuild with make CUDA=1)");
#endif

MPI_Datatype mpi_type(DType t) {
    switch (t) {
        case DType::f32:
            return MPI_FLOAT;
        case DType::i32:
            return MPI_INT32_T;
        case DType::i64:
            return MPI_INT64_T;
        case DType::u8:
            return MPI_UINT8_T;
        case DType::bf16:
        case DType::f16:
            return MPI_UINT16_T;
    }
    return MPI_BYTE;
}

MPI_Op mpi_op(ReduceOp op) {
    switch (op) {
        case ReduceOp::sum:
            return MPI_SUM;
        case ReduceOp::max:
            return MPI_MAX;
        case ReduceOp::min:
            return MPI_MIN;
    }
    return MPI_SUM;
}

int count_of(const Tensor& t, const char* what) {
    HYMOE_CHECK(t.numel() <= INT_MAX, what, ": ", t.numel(), " elements exceed one MPI call");
    return static_cast<int>(t.numel());
}

bool is_half(DType t) {
    return t == DType::bf16 || t == DType::f16;
}

// Half-precision tensor <-> fp32 buffer.
Buffer widen(const Tensor& t) {
    Buffer f(DType::f32, t.shape);
    const uint16_t* src = t.ptr<uint16_t>();
    float* dst = f.ptr<float>();
    for (int64_t i = 0; i < t.numel(); ++i)
        dst[i] = t.dtype == DType::bf16 ? bf16_to_float(src[i]) : f16_to_float(src[i]);
    return f;
}
void narrow(const Tensor& f, Tensor& t) {
    const float* src = f.ptr<float>();
    uint16_t* dst = t.ptr<uint16_t>();
    for (int64_t i = 0; i < t.numel(); ++i)
        dst[i] = t.dtype == DType::bf16 ? float_to_bf16(src[i]) : float_to_f16(src[i]);
}

void check_same(const Tensor& a, const Tensor& b, const char* what) {
    HYMOE_CHECK(a.dtype == b.dtype && a.device == b.device,
                what,
                ": tensors differ in dtype (",
                to_string(a.dtype),
                ", ",
                to_string(b.dtype),
                ") or device");
}

}  // namespace

std::string mpi_error_string(int code) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(code, text, &len);
    return std::string(text, static_cast<size_t>(len));
}

Comm::Impl::Impl(MPI_Comm comm, std::string comm_name) : mpi(comm), name(std::move(comm_name)) {
    MPI_Comm_set_errhandler(mpi, MPI_ERRORS_RETURN);
    MPI_Comm_rank(mpi, &rank);
    MPI_Comm_size(mpi, &size);
}

Comm::Impl::~Impl() {
#ifdef HYMOE_CUDA
    nccl::destroy(*this);
#endif
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && mpi != MPI_COMM_NULL && mpi != MPI_COMM_WORLD)
        MPI_Comm_free(&mpi);
}

int64_t all_reduce_value(int64_t value, const Comm& c, ReduceOp op) {
    Tensor t{&value, DType::i64, Device::cpu, {1}};
    all_reduce(t, c, op);
    return value;
}

int64_t broadcast_value(int64_t value, int root, const Comm& c) {
    Tensor t{&value, DType::i64, Device::cpu, {1}};
    broadcast(t, root, c);
    return value;
}

void all_reduce_sum(std::vector<double>& x, const Comm& c) {
    if (c.size() == 1 || x.empty())
        return;
    HYMOE_MPI_CHECK(
        MPI_Allreduce(
            MPI_IN_PLACE, x.data(), static_cast<int>(x.size()), MPI_DOUBLE, MPI_SUM, c.impl().mpi),
        "all_reduce_sum");
}

Comm self_comm() {
    MPI_Comm self;
    HYMOE_MPI_CHECK(MPI_Comm_dup(MPI_COMM_SELF, &self), "duplicating the self communicator");
    return Comm(std::make_shared<Comm::Impl>(self, "self"));
}

int Comm::rank() const {
    return impl().rank;
}
int Comm::size() const {
    return impl().size;
}
const std::string& Comm::name() const {
    return impl().name;
}
Comm::Impl& Comm::impl() const {
    HYMOE_CHECK(impl_ != nullptr, "use of a communicator that was never made");
    return *impl_;
}

MPI_Comm mpi_handle(const Comm& c) {
    return c.impl().mpi;
}

void all_reduce(Tensor& x, const Comm& c, ReduceOp op) {
    HYMOE_ON_DEVICE(x, c, all_reduce, x, c, op);
    if (is_half(x.dtype)) {
        Buffer f = widen(x);
        all_reduce(f.view(), c, op);
        narrow(f.view(), x);
        return;
    }
    HYMOE_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE,
                                  x.data,
                                  count_of(x, "all_reduce"),
                                  mpi_type(x.dtype),
                                  mpi_op(op),
                                  c.impl().mpi),
                    "all_reduce of ",
                    shape_string(x.shape),
                    " over ",
                    c.name());
}

void broadcast(Tensor& x, int root, const Comm& c) {
    HYMOE_ON_DEVICE(x, c, broadcast, x, root, c);
    HYMOE_MPI_CHECK(
        MPI_Bcast(x.data, count_of(x, "broadcast"), mpi_type(x.dtype), root, c.impl().mpi),
        "broadcast of ",
        shape_string(x.shape),
        " over ",
        c.name());
}

void all_gather(const Tensor& in, Tensor& out, const Comm& c) {
    check_same(in, out, "all_gather");
    HYMOE_CHECK(out.numel() == in.numel() * c.size(),
                "all_gather: out ",
                shape_string(out.shape),
                " must hold ",
                c.size(),
                " x in ",
                shape_string(in.shape));
    HYMOE_ON_DEVICE(in, c, all_gather, in, out, c);
    int n = count_of(in, "all_gather");
    HYMOE_MPI_CHECK(
        MPI_Allgather(
            in.data, n, mpi_type(in.dtype), out.data, n, mpi_type(in.dtype), c.impl().mpi),
        "all_gather of ",
        shape_string(in.shape),
        " over ",
        c.name());
}

void reduce_scatter(const Tensor& in, Tensor& out, const Comm& c, ReduceOp op) {
    check_same(in, out, "reduce_scatter");
    HYMOE_CHECK(in.numel() == out.numel() * c.size(),
                "reduce_scatter: in ",
                shape_string(in.shape),
                " must hold ",
                c.size(),
                " x out ",
                shape_string(out.shape));
    HYMOE_ON_DEVICE(in, c, reduce_scatter, in, out, c, op);
    if (is_half(in.dtype)) {
        Buffer fin = widen(in);
        Buffer fout(DType::f32, out.shape);
        reduce_scatter(fin.view(), fout.view(), c, op);
        narrow(fout.view(), out);
        return;
    }
    HYMOE_MPI_CHECK(MPI_Reduce_scatter_block(in.data,
                                             out.data,
                                             count_of(out, "reduce_scatter"),
                                             mpi_type(in.dtype),
                                             mpi_op(op),
                                             c.impl().mpi),
                    "reduce_scatter of ",
                    shape_string(in.shape),
                    " over ",
                    c.name());
}

void send(const Tensor& x, int dest, const Comm& c, int tag) {
    HYMOE_ON_DEVICE(x, c, send, x, dest, c, tag);
    HYMOE_MPI_CHECK(
        MPI_Send(x.data, count_of(x, "send"), mpi_type(x.dtype), dest, tag, c.impl().mpi),
        "send of ",
        shape_string(x.shape),
        " to rank ",
        dest,
        " of ",
        c.name());
}

void recv(Tensor& x, int src, const Comm& c, int tag) {
    HYMOE_ON_DEVICE(x, c, recv, x, src, c, tag);
    HYMOE_MPI_CHECK(MPI_Recv(x.data,
                             count_of(x, "recv"),
                             mpi_type(x.dtype),
                             src,
                             tag,
                             c.impl().mpi,
                             MPI_STATUS_IGNORE),
                    "recv of ",
                    shape_string(x.shape),
                    " from rank ",
                    src,
                    " of ",
                    c.name());
}

void barrier(const Comm& c) {
    HYMOE_MPI_CHECK(MPI_Barrier(c.impl().mpi), "barrier over ", c.name());
}

std::vector<int64_t> exchange_counts(const std::vector<int64_t>& send_rows, const Comm& c) {
    HYMOE_CHECK(static_cast<int>(send_rows.size()) == c.size(),
                "exchange_counts: ",
                send_rows.size(),
                " send counts for ",
                c.size(),
                " ranks");
    std::vector<int64_t> recv_rows(send_rows.size(), 0);
    HYMOE_MPI_CHECK(
        MPI_Alltoall(
            send_rows.data(), 1, MPI_INT64_T, recv_rows.data(), 1, MPI_INT64_T, c.impl().mpi),
        "all-to-all count exchange over ",
        c.name());
    return recv_rows;
}

namespace {

// Rows of a count vector as MPI int counts and displacements.
void counts_and_offsets(const std::vector<int64_t>& rows,
                        std::vector<int>& count,
                        std::vector<int>& offset) {
    int64_t at = 0;
    for (int64_t r : rows) {
        HYMOE_CHECK(r >= 0 && at + r <= INT_MAX,
                    "all_to_all_v: a count of ",
                    r,
                    " rows (counts must be >= 0 and add up to less than 2^31)");
        count.push_back(static_cast<int>(r));
        offset.push_back(static_cast<int>(at));
        at += r;
    }
}

int64_t sum(const std::vector<int64_t>& v) {
    int64_t s = 0;
    for (int64_t x : v)
        s += x;
    return s;
}

}  // namespace

namespace {

// The shape and count checks shared by the blocking and the non-blocking all_to_all_v.
void check_all_to_all_v(const Tensor& in,
                        const std::vector<int64_t>& send_rows,
                        const Tensor& out,
                        const std::vector<int64_t>& recv_rows,
                        const Comm& c) {
    check_same(in, out, "all_to_all_v");
    HYMOE_CHECK(!in.shape.empty() && in.shape.size() == out.shape.size() &&
                    std::equal(in.shape.begin() + 1, in.shape.end(), out.shape.begin() + 1),
                "all_to_all_v: in ",
                shape_string(in.shape),
                " and out ",
                shape_string(out.shape),
                " must differ only in rows");
    HYMOE_CHECK(static_cast<int>(send_rows.size()) == c.size() &&
                    static_cast<int>(recv_rows.size()) == c.size(),
                "all_to_all_v: counts for ",
                send_rows.size(),
                "/",
                recv_rows.size(),
                " ranks, comm has ",
                c.size());
    HYMOE_CHECK(sum(send_rows) == in.shape[0] && sum(recv_rows) == out.shape[0],
                "all_to_all_v: counts add to ",
                sum(send_rows),
                " sent / ",
                sum(recv_rows),
                " received rows; tensors have ",
                in.shape[0],
                " / ",
                out.shape[0]);
}

// One row of t (every dim but the first) as a committed MPI datatype; the caller frees it (MPI
// lets a pending non-blocking call finish with a freed type).
MPI_Datatype row_type(const Tensor& t) {
    size_t row_bytes = dtype_size(t.dtype) *
                       static_cast<size_t>(shape_numel(Shape(t.shape.begin() + 1, t.shape.end())));
    HYMOE_CHECK(row_bytes <= INT_MAX, "all_to_all_v: a row of ", row_bytes, " bytes");
    MPI_Datatype row;
    MPI_Type_contiguous(static_cast<int>(row_bytes), MPI_BYTE, &row);
    MPI_Type_commit(&row);
    return row;
}

}  // namespace

void all_to_all_v(const Tensor& in,
                  const std::vector<int64_t>& send_rows,
                  Tensor& out,
                  const std::vector<int64_t>& recv_rows,
                  const Comm& c) {
    check_all_to_all_v(in, send_rows, out, recv_rows, c);
    HYMOE_ON_DEVICE(in, c, all_to_all_v, in, send_rows, out, recv_rows, c);
    std::vector<int> sc, sd, rc, rd;
    counts_and_offsets(send_rows, sc, sd);
    counts_and_offsets(recv_rows, rc, rd);
    MPI_Datatype row = row_type(in);
    int rc_mpi = MPI_Alltoallv(
        in.data, sc.data(), sd.data(), row, out.data, rc.data(), rd.data(), row, c.impl().mpi);
    MPI_Type_free(&row);
    HYMOE_MPI_CHECK(rc_mpi, "all_to_all_v of ", shape_string(in.shape), " over ", c.name());
}

void all_to_all_v_queued(const Tensor& in,
                         const std::vector<int64_t>& send_rows,
                         Tensor& out,
                         const std::vector<int64_t>& recv_rows,
                         const Comm& c,
                         void* stream) {
    check_all_to_all_v(in, send_rows, out, recv_rows, c);
    HYMOE_CHECK(in.device == Device::cuda && out.device == Device::cuda,
                "all_to_all_v_queued over ",
                c.name(),
                ": device tensors only (host tensors go through all_to_all_v)");
#ifdef HYMOE_CUDA
    if (stage::staged(c))
        stage::all_to_all_v_queued(in, send_rows, out, recv_rows, c, stream);
    else
        nccl::all_to_all_v_queued(in, send_rows, out, recv_rows, c, stream);
#else
    (void)stream;
#endif
}

// The MPI request and what MPI reads until it completes: the int counts and displacements.
struct Request::Impl {
    MPI_Request mpi = MPI_REQUEST_NULL;
    std::vector<int> send_count, send_offset, recv_count, recv_offset;
    std::string what;  // "all_to_all_v of [n, w] over ep", for errors
};

Request::Request() = default;
Request::Request(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Request::Request(Request&&) noexcept = default;
Request& Request::operator=(Request&& other) noexcept {
    if (this != &other) {
        Request done = std::move(*this);  // waits for the request this one held, if any
        impl_ = std::move(other.impl_);
    }
    return *this;
}

Request::~Request() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!impl_ || impl_->mpi == MPI_REQUEST_NULL || finalized)
        return;
    if (std::uncaught_exceptions() > 0)  // an error is on its way out: the peer may never match
        MPI_Request_free(&impl_->mpi);
    else
        MPI_Wait(&impl_->mpi, MPI_STATUS_IGNORE);  // a destructor cannot report: best effort
}

bool Request::test() {
    if (!impl_ || impl_->mpi == MPI_REQUEST_NULL)
        return true;
    int flag = 0;
    HYMOE_MPI_CHECK(MPI_Test(&impl_->mpi, &flag, MPI_STATUS_IGNORE), impl_->what);
    return flag != 0;
}

void Request::wait() {
    if (!impl_ || impl_->mpi == MPI_REQUEST_NULL)
        return;
    HYMOE_MPI_CHECK(MPI_Wait(&impl_->mpi, MPI_STATUS_IGNORE), impl_->what);
}

Request all_to_all_v_start(const Tensor& in,
                           const std::vector<int64_t>& send_rows,
                           Tensor& out,
                           const std::vector<int64_t>& recv_rows,
                           const Comm& c) {
    check_all_to_all_v(in, send_rows, out, recv_rows, c);
    if (in.device == Device::cuda) {  // NCCL's grouped send/recv (or the CPU build's error)
        all_to_all_v(in, send_rows, out, recv_rows, c);
        return Request();
    }
    auto impl = std::make_unique<Request::Impl>();
    impl->what = cat("all_to_all_v_start of ", shape_string(in.shape), " over ", c.name());
    counts_and_offsets(send_rows, impl->send_count, impl->send_offset);
    counts_and_offsets(recv_rows, impl->recv_count, impl->recv_offset);
    MPI_Datatype row = row_type(in);
    int rc_mpi = MPI_Ialltoallv(in.data,
                                impl->send_count.data(),
                                impl->send_offset.data(),
                                row,
                                out.data,
                                impl->recv_count.data(),
                                impl->recv_offset.data(),
                                row,
                                c.impl().mpi,
                                &impl->mpi);
    MPI_Type_free(&row);
    HYMOE_MPI_CHECK(rc_mpi, impl->what);
    return Request(std::move(impl));
}

Request send_start(const Tensor& x, int dest, const Comm& c, int tag) {
    if (x.device == Device::cuda) {  // NCCL (or the CPU build's error), completed at once
        send(x, dest, c, tag);
        return Request();
    }
    auto impl = std::make_unique<Request::Impl>();
    impl->what = cat("send_start of ", shape_string(x.shape), " to rank ", dest, " of ", c.name());
    HYMOE_MPI_CHECK(MPI_Isend(x.data,
                              count_of(x, "send_start"),
                              mpi_type(x.dtype),
                              dest,
                              tag,
                              c.impl().mpi,
                              &impl->mpi),
                    impl->what);
    return Request(std::move(impl));
}

}  // namespace hymoe::comm
