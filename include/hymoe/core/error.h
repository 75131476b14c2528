// hymoe::Error: the one exception type. It carries an exit category (DESIGN.md "Exit codes"), the
// source location that raised it, and whether every rank sees it identically (collective, LAMMPS
// Error::all) or only the raising rank does (one-rank, LAMMPS Error::one). main() turns it into an
// exit code: a collective error is printed once by rank 0 and all ranks exit cleanly; a one-rank
// error prints "[rank r] ..." and aborts the world.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace hymoe {

// Process exit codes, fixed by DESIGN.md.
enum class Exit : int {
    ok = 0,
    internal = 1,
    invalid = 2,     // invalid deck, config or layout
    bad_input = 3,   // bad input data (datasets, safetensors, images)
    checkpoint = 4,  // corrupt or incompatible checkpoint
    stopped = 75,    // stopped by signal or wall-time after a checkpoint; rerun resumes
};

enum class Scope { collective, one_rank };

class Error : public std::runtime_error {
public:
    Error(Exit code, Scope scope, std::string message, const char* file, int line)
        : std::runtime_error(std::move(message)),
          code_(code),
          scope_(scope),
          file_(file),
          line_(line) {}
    Exit code() const { return code_; }
    Scope scope() const { return scope_; }
    const char* file() const { return file_; }
    int line() const { return line_; }

private:
    Exit code_;
    Scope scope_;
    const char* file_;
    int line_;
};

// cat(a, b, c): the arguments streamed into one string (g++ 12 has no std::format).
template <typename... Args>
std::string cat(const Args&... args) {
    std::ostringstream out;
    (out << ... << args);
    return out.str();
}

}  // namespace hymoe

// Raise an error. HYMOE_FAIL is collective (all ranks see it: deck, config, layout);
// HYMOE_FAIL_ONE is raised by one rank only (I/O on its slice, internal invariants).
#define HYMOE_FAIL(code, ...) \
    throw ::hymoe::Error(     \
        code, ::hymoe::Scope::collective, ::hymoe::cat(__VA_ARGS__), __FILE__, __LINE__)
#define HYMOE_FAIL_ONE(code, ...) \
    throw ::hymoe::Error(         \
        code, ::hymoe::Scope::one_rank, ::hymoe::cat(__VA_ARGS__), __FILE__, __LINE__)

// Always-on internal check (never compiled out, no side effects hidden in assert).
#define HYMOE_CHECK(cond, ...)                                                                 \
    do {                                                                                       \
        if (!(cond))                                                                           \
            HYMOE_FAIL_ONE(::hymoe::Exit::internal, "check failed: " #cond ": ", __VA_ARGS__); \
    } while (0)
