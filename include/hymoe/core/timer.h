// Wall-clock timing on steady_clock: wall_seconds() for differences, and ScopedTimer, which adds
// the seconds of its lifetime to an accumulator (per-phase totals: forward, dispatch, io, ...).
#pragma once

#include <chrono>

namespace hymoe {

// Seconds on the monotonic clock since an arbitrary epoch: only differences mean anything.
inline double wall_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

class ScopedTimer {
public:
    explicit ScopedTimer(double& total) : total_(total), start_(std::chrono::steady_clock::now()) {}
    ~ScopedTimer() {
        total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    }
    ScopedTimer(const ScopedTimer&) = delete;
    ScopedTimer& operator=(const ScopedTimer&) = delete;

private:
    double& total_;
    std::chrono::steady_clock::time_point start_;
};

}  // namespace hymoe
