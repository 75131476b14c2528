// Child-process runner for the e2e tier (see run_binary.h).
#include "run_binary.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <sys/wait.h>

namespace hymoe::testing {

std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

std::vector<std::string> RunResult::err_lines() const {
    std::vector<std::string> lines;
    std::istringstream in(err);
    for (std::string line; std::getline(in, line);)
        lines.push_back(line);
    return lines;
}

RunResult run_hymoe(const std::string& args, int np) {
    const char* bin = std::getenv("HYMOE_BIN");
    std::string exe = bin ? bin : "build/hymoe";
    auto tmp = std::filesystem::temp_directory_path() / ("hymoe_e2e_" + std::to_string(::getpid()));
    std::string out = tmp.string() + ".out", err = tmp.string() + ".err";
    // mpirun -q: no launcher chatter on stderr, so the program's own lines can be counted
    std::string launch = np > 0 ? "mpirun -q -np " + std::to_string(np) + " " : "";
    std::string cmd = launch + exe + " " + args + " >" + out + " 2>" + err;
    int status = std::system(cmd.c_str());
    RunResult r;
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = read_text(out);
    r.err = read_text(err);
    std::filesystem::remove(out);
    std::filesystem::remove(err);
    return r;
}

}  // namespace hymoe::testing
