// A LoRA model's trainable adapter (id 0) held on a Ctx's device, for training off the host's
// slots (LoRA training on a GPU, model/train.h TrainOn): each module's factors A [r, in] and
// B [out, r] with their gradients dA, dB, the weight views with every adapted projection reading
// them as factor views (model/lora_views.h, on all rows: a training pass uses adapter 0), and the
// copies between the host slots and the device. While training, the device copies are the state
// of record (the gradient sums over ranks, the norm and AdamW run on them, runtime/lora_grads.h,
// optimizer.h); the host slots are brought up to date only when something on the host reads them
// (a checkpoint, the adapters written out, the CPU's routing-drift probe) and are put back up
// after a resume. The factor views drop out their input as the host slots do, reading each slot's
// dropout, seed and stream at every call (the masks are the host slots' bit for bit:
// lora_views.h).
#pragma once

#include <unordered_map>
#include <vector>

#include "hymoe/backend/held.h"
#include "hymoe/model/lora_model.h"
#include "hymoe/model/model_views.h"

namespace hymoe::model {

// Adapter 0's trainable tensors on a trainer's Ctx, in lm.tensors(0) order (A then B of each
// module): the factors and their gradients.
struct TrainableLora {
    std::vector<Tensor> factors, grads;
};

// The host slots themselves (a trainer on the CPU).
TrainableLora host_trainable(LoraModel& lm);

class LoraFactors {
public:
    // lm's adapter 0 (trainable: with gradient buffers) of the model m was attached to, on ctx's
    // device: the factors copied there, the gradients zero. ctx, lm and m must outlive this.
    LoraFactors(const backend::Ctx& ctx, const Model& m, LoraModel& lm);
    // v, m's weight views on ctx's device without host adapters, with every projection that
    // carries one of lm's modules reading this one's factor views (gradient views set).
    ModelViews attach(ModelViews v) const;
    TrainableLora trainable() const;  // the device tensors
    void upload_factors();            // host A, B → device (a resume)
    // Device → host, complete when they return (one wait for the stream each).
    void download_factors();  // A, B (a checkpoint, the adapters out)
    void download_grads();    // dA, dB (tests)

private:
    struct Pair {
        backend::Held A, B, dA, dB;
        float scale = 1.0f;
    };
    LoraSlotView view_of(const LoraSlot* slot) const;  // empty when no module has it
    const backend::Ctx& ctx_;
    const Model& m_;
    LoraModel& lm_;
    std::unordered_map<const LoraSlot*, Pair> pairs_;
};

}  // namespace hymoe::model
