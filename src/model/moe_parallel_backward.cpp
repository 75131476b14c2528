// Interim: the MoE backward over tp/ep ranks (lora_job refuses those layouts until it lands).
#include "hymoe/core/error.h"
#include "hymoe/model/moe_parallel.h"
namespace hymoe::model {
void moe_backward_parallel(const ModelConfig&,
                           const LayerSpec&,
                           const MoeWeights&,
                           const Tensor&,
                           const Tensor&,
                           Tensor&,
                           const MoeParallel&,
                           MoeCommStats*) {
    HYMOE_FAIL(Exit::internal, "moe_backward_parallel: not built yet");
}
}  // namespace hymoe::model
