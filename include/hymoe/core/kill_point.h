// A test hook for the kill -9 drills (tests/e2e/test_faults.cpp): with HYMOE_TEST_KILL_AT=TEXT in
// the environment, kill_point(path) raises SIGKILL on this process when path ends with TEXT, so a
// test kills a job in the middle of one named write (a results segment, profile.h5, a checkpoint
// file or manifest, a converted model's stage file, a tokenized dataset) instead of by timing.
// Without the variable it does nothing; no deck key or flag reaches it.
#pragma once

#include <string>

namespace hymoe {

void kill_point(const std::string& path);

}  // namespace hymoe
