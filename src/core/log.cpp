// Rank-0 logger (see log.h). The file is opened in append mode so a resumed run extends its log.
#include "hymoe/core/log.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <mutex>

#include "hymoe/core/error.h"
#include "hymoe/core/timer.h"

namespace hymoe::log {

namespace {

struct LogState {
    std::mutex mutex;
    int rank = 0;
    double t0 = wall_seconds();
    std::FILE* file = nullptr;  // owned; closed at exit
    bool console = true;        // lines also go to stdout
    std::string backlog;        // lines logged before to_file(), written to the file when it opens
    ~LogState() {
        if (file != nullptr)
            std::fclose(file);
    }
};

LogState& state() {
    static LogState s;
    return s;
}

void write_line(const char* prefix, const std::string& message) {
    LogState& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.rank != 0)
        return;
    char stamp[32];
    std::snprintf(stamp, sizeof stamp, "[%8.3f s] ", wall_seconds() - s.t0);
    std::string line = cat(stamp, prefix, message, "\n");
    if (s.console) {
        std::fwrite(line.data(), 1, line.size(), stdout);
        std::fflush(stdout);
    }
    if (s.file != nullptr) {
        std::fwrite(line.data(), 1, line.size(), s.file);
        std::fflush(s.file);
    } else {
        s.backlog += line;
    }
}

}  // namespace

void console(bool on) {
    LogState& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    s.console = on;
}

void init(int rank) {
    LogState& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    s.rank = rank;
    s.t0 = wall_seconds();
}

void to_file(const std::string& path) {
    LogState& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.rank != 0)
        return;
    std::FILE* f = std::fopen(path.c_str(), "a");
    if (f == nullptr)
        HYMOE_FAIL_ONE(Exit::invalid, "cannot open log file ", path, ": ", std::strerror(errno));
    if (s.file != nullptr)
        std::fclose(s.file);
    s.file = f;
    std::fwrite(s.backlog.data(), 1, s.backlog.size(), f);
    std::fflush(f);
    s.backlog.clear();
}

void info(const std::string& message) {
    write_line("", message);
}

void warn(const std::string& message) {
    write_line("warning: ", message);
}

std::string utc_timestamp() {
    std::time_t now = std::time(nullptr);
    std::tm utc{};
    gmtime_r(&now, &utc);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &utc);
    return buf;
}

}  // namespace hymoe::log
