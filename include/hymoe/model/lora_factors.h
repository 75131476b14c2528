// A LoRA model's trainable adapter (id 0) held on a Ctx's device, for training off the host's
// slots (LoRA training on a GPU, model/train.h TrainOn): each module's factors A [r, in] and
// B [out, r] with their gradients dA, dB, the weight views with every adapted projection reading
// them as factor views (model/lora_views.h, on all rows: a training pass uses adapter 0), and the
// copies between the host slots and the device. The host slots stay the state of record (the
// optimizer, the gradient sums over ranks and the checkpoints read them): the factors go up after
// each update, the gradients come down after each pass. The factor views drop out their input as
// the host slots do, reading each slot's dropout, seed and stream at every call (the masks are the
// host slots' bit for bit: lora_views.h).
#pragma once

#include <unordered_map>

#include "hymoe/backend/held.h"
#include "hymoe/model/lora_model.h"
#include "hymoe/model/model_views.h"

namespace hymoe::model {

class LoraFactors {
public:
    // lm's adapter 0 (trainable: with gradient buffers) of the model m was attached to, on ctx's
    // device: the factors copied there, the gradients zero. ctx, lm and m must outlive this.
    LoraFactors(const backend::Ctx& ctx, const Model& m, LoraModel& lm);
    // v, m's weight views on ctx's device without host adapters, with every projection that
    // carries one of lm's modules reading this one's factor views (gradient views set).
    ModelViews attach(ModelViews v) const;
    void upload_factors();  // host A, B → device (after an update or a resume)
    void download_grads();  // device dA, dB → host dA, dB (complete when it returns)
    void zero_grads();      // device dA, dB ← 0

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
