// The CUDA side of hymoe/backend/cuda_async.h: events and strided asynchronous copies.
#include <cuda_runtime.h>

#include "check.h"
#include "hymoe/backend/cuda_async.h"

namespace hymoe::backend::cuda {

Event::Event() {
    cudaEvent_t e = nullptr;
    HYMOE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "new event");
    event_ = e;
}

Event::~Event() {
    cudaEventDestroy(event_);  // no throw from a destructor; a pending record still completes
}

void Event::record(const Stream& s) {
    HYMOE_CUDA_CHECK(cudaEventRecord(event_, s.get()), "event record");
}

void wait_for(const Stream& s, const Event& e) {
    HYMOE_CUDA_CHECK(cudaStreamWaitEvent(s.get(), e.get(), 0), "stream wait on an event");
}

namespace {

void copy_rows(void* dst,
               size_t dst_pitch,
               const void* src,
               size_t src_pitch,
               size_t row_bytes,
               size_t rows,
               cudaMemcpyKind kind,
               const Stream& s) {
    if (rows == 0 || row_bytes == 0)
        return;
    HYMOE_CUDA_CHECK(
        cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, rows, kind, s.get()),
        "copy of ",
        rows,
        " rows of ",
        row_bytes,
        " bytes (pitches ",
        src_pitch,
        " to ",
        dst_pitch,
        ")");
}

}  // namespace

void copy_rows_to_device(void* dst,
                         size_t dst_pitch,
                         const void* src,
                         size_t src_pitch,
                         size_t row_bytes,
                         size_t rows,
                         const Stream& s) {
    copy_rows(dst, dst_pitch, src, src_pitch, row_bytes, rows, cudaMemcpyHostToDevice, s);
}

void copy_rows_to_host(void* dst,
                       size_t dst_pitch,
                       const void* src,
                       size_t src_pitch,
                       size_t row_bytes,
                       size_t rows,
                       const Stream& s) {
    copy_rows(dst, dst_pitch, src, src_pitch, row_bytes, rows, cudaMemcpyDeviceToHost, s);
}

}  // namespace hymoe::backend::cuda
