// Streaming readers of inference requests, never holding the whole file:
//   JSONL, one JSON object per line:
//     {"id": "q1", "tokens": [1, 2, 3], "max_new_tokens": 64, "adapter": "legal",
//      "images": ["cat.png"]}
//   The prompt is exactly one of "tokens" (ids), "text" (a string the deck's tokenizer encodes,
//   special tokens included) or "messages" ([{"role": "user", "content": "..."}, ...], rendered
//   by the deck's chat template, then encoded); the reader keeps text and messages as they are
//   and the runtime encodes them. "id" defaults to the line number; unknown fields are ignored.
//   "images" lists PNG/JPEG files (relative paths from the request file's folder) whose image
//   tokens replace the prompt's media placeholder tokens in order (model-math §8).
//   Per-request sampling, as vLLM's SamplingParams (each absent: the deck's inference.sampling):
//   "temperature" (≥ 0; 0 = greedy), "top_p" (in (0, 1]), "top_k" (≥ 0, or −1 = none, as vLLM;
//   0 = none), "seed" (≥ 0: the request's draws depend on the seed alone, not on job.seed or its
//   place in the file), "max_tokens" (vLLM's name for max_new_tokens; give one of them),
//   "min_p" (in [0, 1]), "presence_penalty" and "frequency_penalty" (in [−2, 2]),
//   "repetition_penalty" (in (0, 100]).
//   Stops (vLLM's): "stop" (a non-empty string or a list of them: generation ends once the
//   output text holds one; needs the deck's tokenizer), "stop_token_ids" (a list of token ids:
//   generation ends when one is sampled, kept as the last output token).
//   "n" (1 to 4096): that many samples of the request, each its own sequence (runtime/engine.h).
//   HDF5 token dataset (.h5, .hdf5): /tokens [T] (any integer type) holding every prompt one
//   after the other, /offsets [N + 1] (int64, from 0, non-decreasing, ending at T): request i is
//   tokens [offsets[i], offsets[i + 1]); optional /max_new_tokens [N]. Ids are "row-<i>", and
//   a request's "line" is its 1-based row. Offsets and tokens are read a window at a time.
// A malformed request is an Exit::bad_input error naming the file and the line (or row); the
// caller decides whether to skip it (inference.on_bad_request: skip) or stop.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "hymoe/text/chat.h"

namespace hymoe::io {

struct Request {
    std::string id;
    std::vector<int64_t> tokens;              // empty when the prompt is text or messages
    std::string text;                         // "text"
    std::vector<text::ChatMessage> messages;  // "messages"
    int max_new_tokens = -1;                  // −1: the deck's inference.max_new_tokens
    double temperature = -1, top_p = -1;      // −1: the deck's inference.sampling
    int top_k = -1;                           // −1: the deck's; 0: none
    int64_t seed = -1;                        // −1: job.seed and the request's index
    std::optional<double> min_p, presence_penalty, frequency_penalty, repetition_penalty;
    std::vector<std::string> stop;        // stop strings (non-empty)
    std::vector<int64_t> stop_token_ids;  // stop tokens
    int n = 1;                            // samples
    // whether the request gave "stop", "stop_token_ids", "n" (if not: the deck's
    // inference.sampling values, runtime/request_stream.h)
    bool has_stop = false, has_stop_token_ids = false, has_n = false;
    std::string adapter;              // "" = base model
    std::vector<std::string> images;  // image files, resolved paths, in placeholder order
    int64_t line = 0;                 // 1-based line in the file
};

class RequestReader {
public:
    virtual ~RequestReader() = default;
    // The next request; false at the end of the file. Throws Exit::bad_input for a bad request
    // after consuming it, so the caller may continue with the next one.
    virtual bool next(Request& r) = 0;
};

// "messages" of a request or a tokenize line: a non-empty list of {"role": str, "content": str}.
// Throws Exit::bad_input with what is wrong (the caller adds file and line).
std::vector<text::ChatMessage> messages_from_json(const nlohmann::json& j);

// The reader for the file's format (by extension); Exit::bad_input if it cannot be opened.
std::unique_ptr<RequestReader> open_requests(const std::string& path);

// How many requests the file holds (bad ones included): its non-blank lines (JSONL, one pass
// over the file, nothing kept) or N (HDF5). For progress lines and their ETA.
int64_t count_requests(const std::string& path);

}  // namespace hymoe::io
