// Runs the built hymoe binary (HYMOE_BIN, default build/hymoe) as a child process, directly or
// under mpirun, and captures its exit code, stdout and stderr.
#pragma once

#include <string>
#include <vector>

namespace hymoe::testing {

struct RunResult {
    int code = -1;  // exit code (128 + signal when killed)
    std::string out, err;
    std::vector<std::string> err_lines() const;
};

// np = 0 runs the binary directly (an MPI singleton); np ≥ 1 runs it under mpirun -np.
RunResult run_hymoe(const std::string& args, int np = 0);

std::string read_text(const std::string& path);

}  // namespace hymoe::testing
