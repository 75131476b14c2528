// The CUDA side of hymoe/backend/cuda_arena.h: streams, the device arena's one cudaMalloc, pinned
// host buffers (cudaMallocHost) and asynchronous copies. Allocation happens in constructors only;
// allocate/free on the arena are bookkeeping (OffsetAllocator), with no CUDA call.
#include <cuda_runtime.h>

#include "check.h"
#include "hymoe/backend/cuda_arena.h"

namespace hymoe::backend::cuda {

Stream::Stream() {
    cudaStream_t s = nullptr;
    HYMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "new stream");
    stream_ = s;
}

Stream::~Stream() {
    cudaStreamDestroy(stream_);  // no throw from a destructor; queued work still completes
}

void Stream::synchronize() const {
    HYMOE_CUDA_CHECK(cudaStreamSynchronize(stream_), "stream synchronize");
}

DeviceArena::DeviceArena(size_t capacity) : book_(capacity) {
    void* p = nullptr;
    HYMOE_CUDA_CHECK(cudaMalloc(&p, capacity), "device arena of ", capacity, " bytes");
    base_ = static_cast<char*>(p);
}

DeviceArena::~DeviceArena() {
    cudaFree(base_);
}

void* DeviceArena::allocate(size_t bytes, size_t align) {
    const size_t off = book_.allocate(bytes, align);
    if (off == OffsetAllocator::none)
        HYMOE_FAIL_ONE(Exit::internal,
                       "device arena full: ",
                       bytes,
                       " bytes asked, largest free block ",
                       book_.largest_free(),
                       " of ",
                       book_.capacity(),
                       " (",
                       book_.used(),
                       " in use)");
    return base_ + off;
}

void DeviceArena::free(void* p) {
    const char* c = static_cast<const char*>(p);
    HYMOE_CHECK(c >= base_ && c < base_ + book_.capacity(), "device arena: foreign pointer");
    book_.free(static_cast<size_t>(c - base_));
}

void DeviceArena::reset() {
    book_.reset();
}

Tensor DeviceArena::tensor(DType dtype, Shape shape) {
    Tensor t;
    t.dtype = dtype;
    t.device = Device::cuda;
    t.shape = std::move(shape);
    t.data = allocate(t.bytes());
    return t;
}

PinnedBuffer::PinnedBuffer(size_t bytes) : bytes_(bytes) {
    HYMOE_CUDA_CHECK(cudaMallocHost(&data_, bytes), "pinned host buffer of ", bytes, " bytes");
}

PinnedBuffer::~PinnedBuffer() {
    cudaFreeHost(data_);
}

Tensor PinnedBuffer::tensor(DType dtype, Shape shape) const {
    Tensor t;
    t.dtype = dtype;
    t.device = Device::cpu;
    t.shape = std::move(shape);
    HYMOE_CHECK(t.bytes() <= bytes_, "pinned buffer: ", t.bytes(), " bytes into ", bytes_);
    t.data = data_;
    return t;
}

namespace {

void copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, const Stream& s) {
    if (bytes == 0)
        return;
    HYMOE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, s.get()), "copy of ", bytes, " bytes");
}

void check_pair(const Tensor& from, const Tensor& to, Device want_from, const char* what) {
    HYMOE_CHECK(from.device == want_from && to.device != want_from && from.dtype == to.dtype &&
                    from.numel() == to.numel(),
                what,
                ": ",
                to_string(from.dtype),
                shape_string(from.shape),
                " on ",
                to_string(from.device),
                " to ",
                to_string(to.dtype),
                shape_string(to.shape),
                " on ",
                to_string(to.device));
}

}  // namespace

void copy_to_device(void* dst, const void* src, size_t bytes, const Stream& s) {
    copy(dst, src, bytes, cudaMemcpyHostToDevice, s);
}

void copy_to_host(void* dst, const void* src, size_t bytes, const Stream& s) {
    copy(dst, src, bytes, cudaMemcpyDeviceToHost, s);
}

void copy_on_device(void* dst, const void* src, size_t bytes, const Stream& s) {
    copy(dst, src, bytes, cudaMemcpyDeviceToDevice, s);
}

void upload(const Tensor& host, Tensor& dev, const Stream& s) {
    check_pair(host, dev, Device::cpu, "upload");
    copy_to_device(dev.data, host.data, host.bytes(), s);
}

void download(const Tensor& dev, Tensor& host, const Stream& s) {
    check_pair(dev, host, Device::cuda, "download");
    copy_to_host(host.data, dev.data, dev.bytes(), s);
}

}  // namespace hymoe::backend::cuda
