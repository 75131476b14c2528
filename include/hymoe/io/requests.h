// Streaming reader of JSONL inference requests, one JSON object per line:
//   {"id": "q1", "tokens": [1, 2, 3], "max_new_tokens": 64, "adapter": "legal"}
// Only "tokens" is required ("id" defaults to the line number); unknown fields are ignored. The
// file is read line by line, never whole, so a file of millions of requests costs one line of
// memory. A malformed line is an Exit::bad_input error naming the file and the line; the caller
// decides whether to skip it (inference.on_bad_request: skip) or stop.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace hymoe::io {

struct Request {
    std::string id;
    std::vector<int64_t> tokens;
    int max_new_tokens = -1;  // −1: the deck's inference.max_new_tokens
    std::string adapter;      // "" = base model
    int64_t line = 0;         // 1-based line in the file
};

class RequestReader {
public:
    explicit RequestReader(const std::string& path);  // Exit::bad_input if it cannot be opened
    // The next request; false at the end of the file. Throws Exit::bad_input for a bad line after
    // consuming it, so the caller may continue with the next one.
    bool next(Request& r);

private:
    std::string path_;
    std::ifstream in_;
    int64_t line_ = 0;
};

}  // namespace hymoe::io
