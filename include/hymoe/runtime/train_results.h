// What a lora job records per step and per evaluation, kept in its checkpoints (so a resumed run
// writes the whole history) and written to out/results.h5:
//   /train/{step, loss, lr, grad_norm, tokens, seconds, tokens_per_s, skipped}   [S]
//   /eval/{step, domain_loss, general_loss, domain_accuracy, general_accuracy}   [M] (NaN: none)
//   /experts/layers [L] MoE layer indices; /experts/load [S, L, E] share of assignments
//   /drift/top_k_overlap, /drift/kl [S, L] against the base model on a fixed probe batch
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hymoe/io/checkpoint.h"
#include "hymoe/io/meta.h"

namespace hymoe::runtime {

struct TrainHistory {
    std::vector<double> step, loss, lr, grad_norm, tokens, seconds, tokens_per_s, skipped;
    std::vector<double> eval_step, domain_loss, general_loss, domain_accuracy, general_accuracy;
    std::vector<int64_t> moe_layers;  // [L]
    int64_t n_expert = 0;             // E
    std::vector<double> load;         // [S, L, E]
    std::vector<double> overlap, kl;  // [S, L]

    // Every series as whole tensors for a checkpoint (the buffers live in this object).
    std::vector<io::CkptEntry> entries();
    // Sizes the series for `steps` steps and `evals` evaluations before load_checkpoint fills
    // entries() (the counts come from the checkpoint's state).
    void resize(int64_t steps, int64_t evals);
    void write(const std::string& path, const io::RunMeta& meta) const;
};

}  // namespace hymoe::runtime
