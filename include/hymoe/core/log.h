// The run log: only rank 0 writes. Each line is "[ elapsed s] message", elapsed = wall seconds
// since init(), and goes to stdout and, after to_file(), is appended to that file too; every line
// is flushed, so a killed job keeps its log. Before init() the rank is taken as 0 (messages are not
// lost) and the clock starts at the first log call. Thread-safe (one mutex).
#pragma once

#include <string>

namespace hymoe::log {

void init(int rank);  // rank in MPI_COMM_WORLD; restarts the clock
// Off: lines go to the file only (hymoe --prompt keeps stdout for the generated text).
void console(bool on);
// Rank 0: append to path too, starting with every line logged before (throws if it cannot open).
void to_file(const std::string& path);
void info(const std::string& message);
void warn(const std::string& message);  // written as "warning: message"

std::string utc_timestamp();  // now, ISO 8601 UTC: "2025-01-31T12:34:56Z"

}  // namespace hymoe::log
