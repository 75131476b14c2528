// The one-shot: hymoe --model DIR|PRESET --prompt TEXT [--tokenizer PATH] [--max-tokens N]
// [--temperature T] [--chat] runs one request on one rank with an infer deck it writes itself,
// in a temporary folder removed at the end:
//   job: {kind: infer, output: TMP/out}
//   model: {config: DIR/config.json, weights: DIR}     (DIR a model folder)
//          {preset: PRESET, init: random}               (a preset: tiny, mid, ...)
//   tokenizer: {path: --tokenizer or DIR, chat: template with --chat}
//   inference: {dataset: TMP/request.jsonl (the prompt as text, or as one user message with
//               --chat), max_new_tokens: --max-tokens, sampling: {temperature: T (default 0)}}
// The generated text goes to stdout token by token as it is drawn (flushed each time, a whole
// UTF-8 character at a time), then a newline; the log goes only to TMP/out/log, and one summary
// line to stderr: "N prompt tokens, M generated (finish F) in S s, R tokens/s". On an error
// the temporary folder is kept and its log named on stderr. More options through --set.
#pragma once

#include "hymoe/runtime/job.h"

namespace hymoe::runtime {

// One rank only (Exit::invalid otherwise). Returns the exit code.
int run_prompt(const CommandLine& cli);

}  // namespace hymoe::runtime
