// The tokenize job (job.kind: tokenize): JSONL text -> an HDF5 token dataset for the lora job.
// Input lines (blank lines are skipped):
//   {"text": "..."}                           every token a training target
//   {"prompt": "...", "completion": "..."}    prompt tokens masked (not targets), completion
//   targets
//   {"messages": [{"role", "content"}, ...]}  rendered by tokenizer.chat's template; only the
//                                             assistant contents and suffixes are targets
// Texts are encoded with special tokens recognised (text/tokenizer.h); tokenize.eos, when given,
// is appended (as a target) after each text and each completion.
// Output tokenize.output (default <job.output>/tokens.h5), documents in file order:
//   /tokens [T] int32, /offsets [N + 1] int64 (document i is tokens [offsets[i], offsets[i+1])),
//   /loss_mask [T] uint8 (1: the token is a training target), /line [N] int64 (1-based source
//   line), /meta.
// Ranks: the file is cut into chunks of tokenize.chunk_lines lines; chunk k is rank k mod world's
// (every rank reads the whole file, encodes only its chunks). Each finished chunk is written to
// <output>.parts/chunk-NNNNNNNN.h5 (written under a temporary name and renamed), so a rerun of the
// same resolved deck skips the chunks on disk; another deck's parts are removed. At the end
// rank 0 joins the chunks in order into the output and removes the parts.
// Bad lines (not JSON, none of the forms above, invalid UTF-8, an unknown special token, longer
// than tokenize.max_line_bytes, no tokens): "<file>:<line>: what", skipped with a warning or
// (on_bad_request: fail) the job stops with Exit::bad_input (3).
#pragma once

#include "hymoe/parallel/comms.h"
#include "hymoe/runtime/job.h"

namespace hymoe::runtime {

// Collective over the world. Returns the exit code.
int run_tokenize(const Job& job, const parallel::Grid& grid);

}  // namespace hymoe::runtime
