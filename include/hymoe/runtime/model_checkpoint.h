// Model checkpoints: the convert job (HF safetensors folder + config → a hymoe checkpoint cut
// for the job's layout: one HDF5 file per pipeline stage, stage<S>.h5, plus stage<S>-ep<E>.h5 with
// the routed experts ep rank E hosts; each split tensor chunked by the layout's slices, bf16 kept;
// manifest.json with the model config, the layout, the source files' sha256 and every piece's
// sha256), and such a checkpoint as model.weights of any job at any layout (io/checkpoint.h reads
// each rank's slices from the pieces they overlap). README "Checkpoints" documents the layout.
#pragma once

#include <memory>
#include <string>

#include "hymoe/io/checkpoint.h"
#include "hymoe/model/model.h"
#include "hymoe/runtime/job.h"

namespace hymoe::runtime {

// Whether dir holds a hymoe checkpoint (a manifest.json of a hymoe format), rather than a
// safetensors folder. A training checkpoint is refused by open_model_checkpoint.
bool is_model_checkpoint(const std::string& dir);

// The checkpoint at dir opened for a job whose model is cfg: a different model config or family
// is a collective Exit::checkpoint error naming the first differing config key. The ReadTensor
// fills this rank's part of a tensor (a missing tensor, a shape mismatch, a bad checksum or an
// unreadable file: Exit::checkpoint naming the tensor and the file).
model::ReadTensor open_model_checkpoint(const std::string& dir, const model::ModelConfig& cfg);

// This rank's part of a model (or adapter) tensor as a checkpoint entry, into tensors.h5.
io::CkptEntry checkpoint_entry(const model::TensorSpec& t, const model::ModelShard& shard);

// The convert job (collective): refuses an output folder that holds another job's outputs
// (Exit::invalid), then writes the checkpoint into job.deck.job.output. Returns the exit code.
void check_convert_output(const Job& job);
int run_convert(const Job& job, const parallel::Grid& grid);

}  // namespace hymoe::runtime
