// What a lora job records per step and per evaluation, kept in its checkpoints (so a resumed run
// writes the whole history) and written to out/results.h5:
//   /train/{step, loss, lr, grad_norm, tokens, seconds, tokens_per_s, skipped}   [S]
//   /eval/{step, domain_loss, general_loss, domain_accuracy, general_accuracy}   [M] (NaN: none)
//   /experts/layers [L] MoE layer indices; /experts/load [S, L, E] share of assignments
//   /drift/top_k_overlap, /drift/kl [S, L] against the base model on a fixed probe batch
//   /train/status: running | stopped | early_stopped | done; /eval/metric, /eval/best_step [1]
// Rank 0 rewrites the whole file (atomically: NAME.partial renamed) at every log interval,
// evaluation, checkpoint and stop, so a reader sees the curves while the job runs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hymoe/io/checkpoint.h"
#include "hymoe/io/meta.h"

namespace hymoe::runtime {

// Where the run stands, for readers of a results.h5 written while it runs.
struct TrainStatus {
    std::string status;      // running | stopped (a signal or job.max_hours) | early_stopped | done
    std::string metric;      // finetune.eval.metric
    int64_t best_step = -1;  // the evaluation with the lowest metric after step 0; -1: none
};

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
    void write(const std::string& path, const io::RunMeta& meta, const TrainStatus& st) const;
};

}  // namespace hymoe::runtime
