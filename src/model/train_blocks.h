// One training pass's blocks on a Ctx (train.cpp): this rank's layers over weight views (the
// CPU's host views with the adapters as host slots, or a GPU's uploaded weights with the adapters
// as factor views, model/train.h TrainOn), every sequence fresh (zero KDA state and conv tails,
// no attention cache, the expanded attention form its backward differentiates), forward for the
// model's one layer loop and backward for its reverse. Each block's partial output (or input
// gradient) is summed over tp here; MoE layers take the one MoE path.
#pragma once

#include <vector>

#include "hymoe/backend/held.h"
#include "hymoe/model/train.h"
#include "layer.h"

namespace hymoe::model::detail {

class TrainBlocks final : public LayerBlocks {
public:
    // batch: the pass's sequences (every pos0 = 0), on the host.
    TrainBlocks(const TrainOn& on, const SeqBatch& batch);
    const backend::Ctx& ctx() const override { return on_.ctx; }
    const Tensor& attn_norm(int i) const override { return on_.weights.layers[i].attn_norm; }
    const Tensor& ffn_norm(int i) const override { return on_.weights.layers[i].ffn_norm; }
    void mixer(int i, const Tensor& xn, Tensor& y) override;
    void ffn(int i, const Tensor& xn, Tensor& y, MoeCommStats* stats) override;
    // dxn [n, d] = ∂L/∂xn of layer i's mixer (FFN) from dy [n, d]; adapters accumulate.
    void mixer_backward(int i, const Tensor& xn, const Tensor& dy, Tensor& dxn);
    void ffn_backward(int i, const Tensor& xn, const Tensor& dy, Tensor& dxn);

private:
    void tp_sum(Tensor& x) const;           // x ← Σ over tp (after the stream's work)
    MlaWeightViews mla_views(int i) const;  // layer i's, adapters on every row
    const TrainOn& on_;
    const SeqBatch& batch_;
    backend::Held all_rows_;               // i64 [n] 0 … n−1 on ctx's device
    std::vector<LoraRowsView> lora_rows_;  // adapter 0 on every row (factor-view adapters)
    backend::Held pos_;                    // i64 [n] each row's position in its sequence
};

// The stream a training pass keeps at a stage's block boundaries, on the pass's device.
struct TrainStream {
    std::vector<backend::Held> before_mixer;  // [n_layer] [n, d] layer inputs (this stage's)
    std::vector<backend::Held> before_ffn;    // [n_layer] [n, d] (empty with recompute)
    backend::Held out;                        // [n, d] after the stage's last layer
};

// The reverse of run_layers over the stage's layers through blocks: dh [n, d], the gradient of
// the stage's output, becomes the gradient of its input; st's tensors are released as it goes;
// with recompute, each layer's FFN input is made again by rerunning its mixer.
void run_layers_backward(const ModelConfig& cfg,
                         int first,
                         int end,
                         TrainBlocks& blocks,
                         TrainStream& st,
                         bool recompute,
                         Tensor& dh);

}  // namespace hymoe::model::detail
