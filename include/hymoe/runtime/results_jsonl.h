// results.jsonl beside an infer job's results.h5, for readers who never open HDF5: one JSON object
// per request in file order, shaped as vLLM's RequestOutput: {"id", "index", "line",
// "prompt_len", "adapter", "outputs": [one per sample, in sample order: {"index" (the sample),
// "text" (with the deck's tokenizer), "token_ids", "logprobs", "cumulative_logprob",
// "finish_reason", "stop_reason"}]}, the same values as /requests/... in results.h5 (logprobs as
// float32 widened to JSON numbers). Written from the finished results.h5 as
// results.jsonl.partial and renamed, so the file is either whole or absent; an interrupted run
// has neither file (its journal is results.parts/), and the resumed run writes both.
#pragma once

#include <string>

namespace hymoe::runtime {

// One process (rank 0): out_dir/results.h5 -> out_dir/results.jsonl. Returns its lines.
int64_t write_results_jsonl(const std::string& out_dir);

}  // namespace hymoe::runtime
