// Shared pieces of the libFuzzer targets (tests/fuzz/fuzz_*.cpp, built by `make fuzz` with
// clang's -fsanitize=fuzzer,address,undefined). A target feeds one input through one reader and
// accepts exactly two outcomes: the reader returns, or it throws hymoe::Error (the clean, one
// sentence error every bad input must give). Anything else escaping -- std::out_of_range from a
// container, a json::exception, YAML::Exception, std::bad_alloc -- is a finding: the target
// prints it and aborts, so libFuzzer keeps the input under build/fuzz/crashes/<target>/.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <typeinfo>
#include <unistd.h>

#include "hymoe/core/error.h"

namespace hymoe::fuzz {

// A folder of this process on tmpfs for readers that take a path: /dev/shm/hymoe-fuzz-<pid>/,
// removed at exit.
inline const std::string& scratch_dir() {
    struct Dir {
        std::string path = "/dev/shm/hymoe-fuzz-" + std::to_string(::getpid());
        Dir() { std::filesystem::create_directories(path); }
        ~Dir() {
            std::error_code ec;
            std::filesystem::remove_all(path, ec);
        }
    };
    static const Dir dir;
    return dir.path;
}

// The input written to scratch_dir()/name (truncated first); returns the path.
inline std::string write_file(const std::string& name, const uint8_t* data, size_t size) {
    const std::string path = scratch_dir() + "/" + name;
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    return path;
}

// f() may return or throw hymoe::Error; any other exception aborts (a finding).
template <typename F>
int guarded(F&& f) {
    try {
        f();
    } catch (const hymoe::Error&) {
    } catch (const std::exception& e) {
        std::fprintf(stderr, "fuzz: %s escaped: %s\n", typeid(e).name(), e.what());
        std::abort();
    } catch (...) {
        std::fprintf(stderr, "fuzz: a non-std exception escaped\n");
        std::abort();
    }
    return 0;
}

}  // namespace hymoe::fuzz
