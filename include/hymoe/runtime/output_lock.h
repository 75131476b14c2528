// One job per output folder: the job's rank 0 holds an flock() on <output>/.hymoe.lock while the
// job runs, and the file says who holds it ("host <name> pid <pid>\n"). A second job started on
// the same folder finds the lock held and refuses at once with one line naming the holder
// (Exit::invalid, collective). The kernel drops an flock with its process, so a job killed with
// kill -9 leaves no lock behind, only the file: the next job takes it over and logs whose it was.
// On a clean end the file is removed. Ranks other than 0 hold nothing; every rank learns rank
// 0's verdict (a collective), so all of them refuse together.
#pragma once

#include <string>

namespace hymoe::runtime {

inline constexpr const char* kOutputLockName = ".hymoe.lock";

class OutputLock {
public:
    explicit OutputLock(const std::string& dir);  // collective over the world
    ~OutputLock();
    OutputLock(const OutputLock&) = delete;
    OutputLock& operator=(const OutputLock&) = delete;

private:
    std::string path_;
    int fd_ = -1;  // rank 0: the locked file
};

}  // namespace hymoe::runtime
