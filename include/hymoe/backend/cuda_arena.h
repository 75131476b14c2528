// Device memory for the CUDA backend, usable from host C++ without any CUDA header: streams,
// one device arena per process (a single cudaMalloc, sub-allocated: nothing is cudaMalloc'ed on
// the hot path), pinned host staging buffers, and asynchronous copies ordered on a stream.
// OffsetAllocator is the arena's bookkeeping alone (plain C++, every build, unit-tested on the
// CPU); Stream, DeviceArena, PinnedBuffer and the copies exist in CUDA builds only
// (src/backend/cuda/memory.cu). Every CUDA call that fails throws a one-rank hymoe::Error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>

#include "hymoe/tensor/tensor.h"

struct CUstream_st;  // = cudaStream_t's pointee, named here so no CUDA header is needed

namespace hymoe::backend::cuda {

// First-fit sub-allocation of the byte range [0, capacity): free blocks are kept by offset and
// merged with their neighbours when freed, so that freeing everything gives one block again.
class OffsetAllocator {
public:
    static constexpr size_t none = SIZE_MAX;  // allocate's answer when no free block fits

    explicit OffsetAllocator(size_t capacity);
    // The offset of a block of `bytes` (rounded up to a multiple of `align`, at least one unit)
    // starting at a multiple of `align` (a power of two), or `none`.
    size_t allocate(size_t bytes, size_t align);
    // Returns a block; `offset` must come from allocate and not have been freed since.
    void free(size_t offset);
    void reset();  // every block free, the peak kept

    size_t capacity() const { return capacity_; }
    size_t used() const { return used_; }  // bytes in live blocks, alignment rounding included
    size_t peak() const { return peak_; }  // the most used at once since construction
    size_t largest_free() const;
    size_t live_blocks() const { return live_.size(); }
    size_t free_blocks() const { return free_.size(); }

private:
    size_t capacity_;
    size_t used_ = 0, peak_ = 0;
    std::map<size_t, size_t> free_;  // offset -> size, disjoint and never adjacent
    std::map<size_t, size_t> live_;  // offset -> size
};

// A CUDA stream (non-blocking: it does not synchronise with the legacy default stream).
class Stream {
public:
    Stream();
    ~Stream();
    Stream(const Stream&) = delete;
    Stream& operator=(const Stream&) = delete;
    CUstream_st* get() const { return stream_; }
    void synchronize() const;  // waits for everything queued on it

private:
    CUstream_st* stream_ = nullptr;
};

// One cudaMalloc of `capacity` bytes on the current device, made at start-up; tensors and scratch
// are carved out of it by an OffsetAllocator. Freeing does not wait for the GPU: the caller frees
// only memory whose last use is ordered before the next user's (one stream, or an event).
class DeviceArena {
public:
    explicit DeviceArena(size_t capacity);
    ~DeviceArena();
    DeviceArena(const DeviceArena&) = delete;
    DeviceArena& operator=(const DeviceArena&) = delete;

    // `bytes` at a multiple of `align` (256 by default: every cuBLAS and vector access is
    // aligned); throws, naming the sizes, when the arena has no free block that large.
    void* allocate(size_t bytes, size_t align = 256);
    void free(void* p);
    void reset();
    // A device tensor view of freshly allocated (uninitialised) memory.
    Tensor tensor(DType dtype, Shape shape);
    const OffsetAllocator& book() const { return book_; }
    char* base() const { return base_; }  // the block's first byte (offset 0)

private:
    char* base_ = nullptr;
    OffsetAllocator book_;
};

// Page-locked host memory (cudaMallocHost): the staging side of asynchronous copies.
class PinnedBuffer {
public:
    explicit PinnedBuffer(size_t bytes);
    ~PinnedBuffer();
    PinnedBuffer(const PinnedBuffer&) = delete;
    PinnedBuffer& operator=(const PinnedBuffer&) = delete;
    void* data() const { return data_; }
    size_t bytes() const { return bytes_; }
    // A host tensor view of the start of the buffer (checked to fit).
    Tensor tensor(DType dtype, Shape shape) const;

private:
    void* data_ = nullptr;
    size_t bytes_ = 0;
};

// Asynchronous copies queued on `s` (truly asynchronous only from or to pinned host memory);
// the data is there once the stream reaches them (s.synchronize(), or an event).
void copy_to_device(void* dst, const void* src, size_t bytes, const Stream& s);
void copy_to_host(void* dst, const void* src, size_t bytes, const Stream& s);
void copy_on_device(void* dst, const void* src, size_t bytes, const Stream& s);
// The same for whole tensors: equal dtype and element count, host -> device or device -> host.
void upload(const Tensor& host, Tensor& dev, const Stream& s);
void download(const Tensor& dev, Tensor& host, const Stream& s);

}  // namespace hymoe::backend::cuda
