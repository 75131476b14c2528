// LoRA adapters in and out of jobs: the lora job exports its trained adapter in PEFT format
// (out/adapters/final; with finetune.export_merged also out/merged, the base weights with the
// adapter merged, as safetensors + config.json), and the infer job loads the PEFT folders of
// inference.adapters, one adapter id each, so each request picks its own (io::Request::adapter).
#pragma once

#include <map>
#include <string>

#include "hymoe/model/lora_model.h"
#include "hymoe/parallel/grid.h"
#include "hymoe/runtime/job.h"

namespace hymoe::runtime {

// Collective: rank 0 writes the adapter (adapter 0 of lm) to out/adapters/<folder> (replacing
// it atomically) and, for folder "final" with finetune.export_merged, the merged weights, whole at
// any layout (every rank's parts are gathered through scratch checkpoint files under the output
// folder; for the merged weights rank 0 holds the whole model once, and lm is merged into m).
void export_adapters(const Job& job,
                     model::Model& m,
                     model::LoraModel& lm,
                     const parallel::Grid& grid,
                     const std::string& folder);

// The infer job's adapters: every folder of inference.adapters loaded as adapter id 0, 1, ... in
// name order, on the attention projections (q, k, v, o; an adapter of other modules is refused:
// Exit::bad_input naming the folder and module). ids: name → adapter id.
struct InferAdapters {
    model::LoraModel lm;
    std::map<std::string, int> ids;
};
InferAdapters load_infer_adapters(const Job& job, model::Model& m);
// Whether an adapter of inference.adapters adapts routed experts: a key under ".mlp.experts." in
// its adapter_model.safetensors (the files' headers alone are read; the same on every rank).
bool adapters_adapt_routed_experts(const Job& job);

}  // namespace hymoe::runtime
