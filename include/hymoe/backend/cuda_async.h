// Work on two streams of the CUDA backend, usable from host C++ without any CUDA header: events
// that order one stream's work after another's, and strided copies between pinned host memory
// and the device (rows of equal length, each side with its own pitch, one copy call for all).
// CUDA builds only (src/backend/cuda/async.cu); every CUDA call that fails throws a one-rank
// hymoe::Error.
#pragma once

#include <cstddef>

#include "hymoe/backend/cuda_arena.h"

struct CUevent_st;  // = cudaEvent_t's pointee

namespace hymoe::backend::cuda {

// A CUDA event without timing: record() marks the work queued on a stream so far; wait_for()
// makes work queued on another stream afterwards start after it. A never-recorded event is
// already complete.
class Event {
public:
    Event();
    ~Event();
    Event(const Event&) = delete;
    Event& operator=(const Event&) = delete;
    void record(const Stream& s);
    CUevent_st* get() const { return event_; }

private:
    CUevent_st* event_ = nullptr;
};

// Work queued on `s` from now on waits for the work `e` recorded last.
void wait_for(const Stream& s, const Event& e);

// `rows` rows of row_bytes, the i-th from src + i·src_pitch to dst + i·dst_pitch, queued on s
// (asynchronous with pinned host memory); the pitches are at least row_bytes.
void copy_rows_to_device(void* dst,
                         size_t dst_pitch,
                         const void* src,
                         size_t src_pitch,
                         size_t row_bytes,
                         size_t rows,
                         const Stream& s);
void copy_rows_to_host(void* dst,
                       size_t dst_pitch,
                       const void* src,
                       size_t src_pitch,
                       size_t row_bytes,
                       size_t rows,
                       const Stream& s);

}  // namespace hymoe::backend::cuda
