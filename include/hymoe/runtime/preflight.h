// Pre-flight checks of the data a job will read against the model, run before anything is
// allocated (by --check and at the start of the jobs that read that data), so that a mismatch is
// one sentence naming the deck key or the dataset row instead of an internal error mid-run:
//   - the deck's tokenizer against the model's vocabulary: a tokenizer whose ids reach past
//     model.vocab_size can write prompts the model cannot embed (Exit::invalid, naming
//     tokenizer.path); --check refuses it even if the dataset might never use those ids;
//   - a lora job's token datasets (finetune.data.domain/general, finetune.eval.domain/general):
//     every token id in [0, vocab_size) (Exit::bad_input, naming the file, the document and, when
//     the file has /line (tokenize writes it), the source line);
//   - the deck's default stops (inference.sampling.stop needs tokenizer.path, every id of
//     inference.sampling.stop_token_ids below model.vocab_size: Exit::invalid naming the key);
//     this one runs whenever a job loads (runtime/job.cpp), as it costs nothing.
#pragma once

#include <string>

#include "hymoe/runtime/job.h"

namespace hymoe::runtime {

// Where the model's vocabulary comes from: "model.preset: tiny" or "model.config: <path>".
std::string vocab_source(const deck::Deck& deck);
// Collective. Loads tokenizer.path (when the deck has a tokenizer) and checks its ids fit.
void check_tokenizer_vocab(const Job& job);
// Collective: rank 0 scans the lora job's datasets, every rank gets the outcome. No-op for
// other kinds.
void check_train_data_vocab(const Job& job);
// Collective, no I/O: the deck's default stop strings and stop token ids.
void check_sampling_defaults(const Job& job);
// The tokenizer and data checks, for --check.
void preflight(const Job& job);

}  // namespace hymoe::runtime
