// The one description of the model's weights: every tensor a rank holds (full HF name, local
// shape, split, init rule, block: model/weights.h TensorSpec) from the config and the rank's part
// (model/shard.h) alone, in load order. Bound to a Model's buffers (model.h model_tensors) it is
// what loading, random init, checkpoints and conversion walk; unbound, count_params (config.h)
// and the plan's weights (runtime/plan.h) sum it.
#pragma once

#include "hymoe/model/config.h"
#include "hymoe/model/shard.h"
#include "hymoe/model/weights.h"

namespace hymoe::model {

struct Model;

// The tensors of the part `sh` of cfg, unbound (every dest null, dtype f32): the embedding (first
// stage; the last stage too when tied, as WeightBlock::head when that is not the first), per layer
// of the stage its two RMSNorms, mixer (kda_tensors, attention_tensors) and FFN (ffn_tensors,
// each layer's hosted routed experts, E/ep of them, stacked: TensorSpec::count), the vision tower
// (first stage), the final norm and the untied head (last stage). Shapes are this rank's
// (local_config). Allocates no weight.
TensorList weight_list(const ModelConfig& cfg, const ModelShard& sh);
// What weight_list lists for decoder layer `layer` of the part sh alone (its shapes depend only
// on the layer's LayerSpec and the cut: the plan describes each kind of layer once). With
// sh.end_layer = sh.first_layer, weight_list lists the rest: embedding, vision, final norm, head.
TensorList layer_weight_list(const ModelConfig& cfg, const ModelShard& sh, int layer);
// model_tensors (model.h) of a model that is only read: the same list, for reading its buffers
// (uploading them, viewing them: model_views.h); nothing may be written through its dests.
TensorList model_tensors(const Model& m);

}  // namespace hymoe::model
