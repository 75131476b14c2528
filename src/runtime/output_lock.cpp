// The output folder's lock (see runtime/output_lock.h). flock() rather than a lock file created
// with O_EXCL: the lock dies with its process, so a kill -9 never leaves a folder locked. The
// file is opened, locked, then checked to be the file at the path (a holder that finished may
// have removed it between our open and our flock: then retry on the new file).
#include "hymoe/runtime/output_lock.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hymoe/core/error.h"
#include "hymoe/core/log.h"
#include "hymoe/parallel/mpi_env.h"

namespace hymoe::runtime {

namespace {

// The file's text without its newline ("" when empty or unreadable).
std::string holder_of(int fd) {
    char buf[256];
    const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
    std::string s(buf, n > 0 ? static_cast<size_t>(n) : 0);
    while (!s.empty() && (s.back() == '\n' || s.back() == '\0'))
        s.pop_back();
    return s;
}

std::string this_process() {
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    return cat("host ", host, " pid ", ::getpid());
}

// Rank 0: lock path into fd; returns "" or why not (the holder, or the system error).
std::string take(const std::string& path, int& fd) {
    for (;;) {
        fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0)
            return cat("cannot open ", path, " (", std::strerror(errno), ")");
        if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
            const int err = errno;
            const std::string holder = holder_of(fd);
            ::close(fd), fd = -1;
            if (err != EWOULDBLOCK)
                return cat("cannot lock ", path, " (", std::strerror(err), ")");
            return cat("another job (",
                       holder.empty() ? "starting" : holder,
                       ") is writing to this folder: ",
                       path,
                       " is locked; wait for it or choose another job.output");
        }
        struct stat held = {}, now = {};
        if (::fstat(fd, &held) == 0 && ::stat(path.c_str(), &now) == 0 &&
            held.st_ino == now.st_ino && held.st_dev == now.st_dev)
            break;
        ::close(fd), fd = -1;  // removed by a holder that finished: lock the new file
    }
    const std::string stale = holder_of(fd);
    if (!stale.empty())
        log::warn(cat(path,
                      ": taking over the stale lock of a job that ended without removing it (",
                      stale,
                      ")"));
    const std::string me = this_process() + "\n";
    if (::ftruncate(fd, 0) != 0 ||
        ::pwrite(fd, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size()))
        return cat("cannot write ", path, " (", std::strerror(errno), ")");
    return "";
}

}  // namespace

OutputLock::OutputLock(const std::string& dir) : path_(dir + "/" + kOutputLockName) {
    std::string problem;
    if (parallel::world_rank() == 0)
        problem = take(path_, fd_);
    problem = parallel::broadcast_bytes(problem, 0);
    if (!problem.empty()) {
        if (fd_ >= 0)
            ::close(fd_), fd_ = -1;
        HYMOE_FAIL(Exit::invalid, "job.output: ", problem);
    }
}

OutputLock::~OutputLock() {
    if (fd_ < 0)
        return;
    ::unlink(path_.c_str());  // while still locked: a waiting job then retries on a new file
    ::close(fd_);
}

}  // namespace hymoe::runtime
