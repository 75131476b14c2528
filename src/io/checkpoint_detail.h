// Helpers the checkpoint files share (io/checkpoint.h): a string broadcast over a communicator, a
// collective agreement on a failure, dtype names.
#pragma once

#include <string>
#include <vector>

#include "hymoe/core/error.h"
#include "hymoe/io/checkpoint.h"
#include "hymoe/parallel/comm.h"

namespace hymoe::io::detail {

// root's string on every rank.
std::string broadcast_string(const std::string& s, int root, const comm::Comm& c);

// Runs body on every rank; if it threw a hymoe::Error on any, every rank raises one collective
// error with `code` and the first failing rank's sentence (so rank 0 prints it once and every
// rank exits cleanly with the code).
template <typename F>
void agree(const comm::Comm& c, Exit code, F&& body) {
    std::string problem;
    try {
        body();
    } catch (const Error& e) {
        problem = e.what();
    }
    const int first = static_cast<int>(
        comm::all_reduce_value(problem.empty() ? c.size() : c.rank(), c, comm::ReduceOp::min));
    if (first == c.size())
        return;
    HYMOE_FAIL(code, broadcast_string(problem, first, c));
}

// The DType that to_string(DType) names ("f32", "bf16", ...); else Exit::checkpoint naming where.
DType dtype_from_name(const std::string& s, const std::string& where);

}  // namespace hymoe::io::detail
