// The lora job (DESIGN.md "Job kinds"): LoRA fine-tuning of the frozen model on the deck's
// domain/general mix, with AdamW, evaluation, expert-load and routing-drift monitoring, a
// non-finite/loss-spike guard, checkpoints (every checkpoint.every steps, on SIGUSR1/SIGTERM/
// SIGINT and at job.max_hours: exit 75, and a rerun resumes bit-identically), a step line every
// finetune.log_every steps, results.h5 rewritten then and at every evaluation and checkpoint, the
// checkpoint of the lowest eval metric kept as checkpoints/best (its adapter in adapters/best),
// early stopping (finetune.early_stopping: exit 0, the final checkpoint and adapter written) and
// the adapters in PEFT format (out/adapters/final, and out/merged with finetune.export_merged).
// Layouts: any grid. The micro-batches of a step run 1F1B over pp (model/train.h), and each LoRA
// gradient is summed over the ranks that replicate its adapter (runtime/lora_grads.h). On a GPU
// (on_gpu: job.device, runtime/device_choice.h) the passes run there on the uploaded weights with
// the adapter's factors, gradients and AdamW moments on the device, which is the state of record:
// the gradient sums, the norm and the update run there too (the CPU's code on the GPU's Ctx), and
// the factors and moments come down only when a checkpoint or the adapters are written (and the
// factors for the CPU's routing-drift probe), so a run moves between CPU and GPU at any
// checkpoint.
#pragma once

#include "hymoe/parallel/grid.h"
#include "hymoe/runtime/job.h"

namespace hymoe::runtime {

int run_lora(const Job& job, const parallel::Grid& grid, bool on_gpu);

}  // namespace hymoe::runtime
