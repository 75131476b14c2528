// The scoring path of an infer job (inference.prompt_logprobs: true) on one rank: for every
// request of the JSONL dataset, the teacher-forced log-probability of each prompt token given the
// tokens before it and the greedy next token, written to results.h5. Requests are packed into
// batches of at most inference.batch.max_tokens tokens and max_seqs sequences.
#pragma once

#include "hymoe/model/model.h"
#include "hymoe/parallel/comms.h"
#include "hymoe/runtime/job.h"

namespace hymoe::runtime {

// The model of the job: model.init: random (seeded by job.seed) or model.weights (safetensors).
model::Model build_model(const Job& job);

// What this build can run (one rank, prompt_logprobs); call before anything is written.
void check_scoring(const Job& job);
// Collective; returns the exit code.
int run_scoring(const Job& job, const parallel::Grid& grid);

}  // namespace hymoe::runtime
