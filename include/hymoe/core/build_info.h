// What built this binary, for /meta/build in every output and `hymoe --version`. The values come
// from build/<config>/gen/build_info.cpp, which the Makefile rewrites when any of them changes.
#pragma once

namespace hymoe::build {

extern const char* const git_sha;   // short sha of HEAD, "+dirty" when the tree had changes
extern const char* const compiler;  // compiler name and version
extern const char* const flags;     // optimisation and sanitizer flags
extern const char* const backend;   // "cpu" or "cpu+cuda"

}  // namespace hymoe::build
