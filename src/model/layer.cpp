// One inference step's blocks on any Ctx (layer.h run_step_layers): each layer's mixer and FFN
// on the pass's weight views, its sequences' states as the step's StepStates addresses them, then
// the tp sum of the partial output. MoE layers take the one MoE path whatever the layout.
#include "layer.h"

#include "hymoe/backend/ops_rows.h"
#include "hymoe/core/timer.h"
#include "hymoe/model/attention_views.h"
#include "hymoe/model/ffn_views.h"
#include "hymoe/model/moe_parallel.h"

namespace hymoe::model::detail {

MoeParallel moe_groups(const Model& m) {
    MoeParallel par;
    par.tp = m.shard.tp > 1 ? &m.comms->tp : nullptr;
    par.ep = m.shard.ep > 1 ? &m.comms->ep : nullptr;
    par.etp = m.shard.etp;
    return par;
}

namespace {

class StepBlocks final : public LayerBlocks {
public:
    StepBlocks(const ModelOn& on,
               const SeqBatch& batch,
               StepStates& step,
               const ForwardOptions& options,
               ForwardStats& stats,
               bool timed)
        : on_(on), batch_(batch), step_(step), options_(options), stats_(stats), timed_(timed) {}
    const backend::Ctx& ctx() const override { return on_.ctx; }
    const Tensor& attn_norm(int i) const override { return on_.weights.layers[i].attn_norm; }
    const Tensor& ffn_norm(int i) const override { return on_.weights.layers[i].ffn_norm; }
    double clock() const override {
        if (timed_)
            ops::synchronize(on_.ctx);
        return wall_seconds();
    }

    void mixer(int i, const Tensor& xn, Tensor& y) override {
        const ModelConfig& cfg = on_.m.local;
        const LayerViews& w = on_.weights.layers[i];
        if (cfg.layers[i].mixer == Mixer::kda) {
            kda_forward(on_.ctx, cfg, w.kda, xn, step_.kda(i), y, options_.kda_mode);
        } else {
            const StepStates::Attention cache = step_.attention(i);
            MlaWeightViews views = w.mla;
            if (step_.lora_rows() != nullptr)
                views.lora_rows = step_.lora_rows();
            attention_forward(on_.ctx,
                              cfg,
                              cfg.layers[i],
                              views,
                              xn,
                              batch_,
                              cache.caches,
                              y,
                              options_.attn_mode,
                              timed_ ? &stats_.attn : nullptr,
                              tp(),
                              cache.dev);
            step_.leave_attention(i);
        }
        tp_sum(y);
    }

    void ffn(int i, const Tensor& xn, Tensor& y, MoeCommStats* stats) override {
        const LayerSpec& spec = on_.m.local.layers[i];
        const LayerViews& w = on_.weights.layers[i];
        if (spec.ffn == Ffn::dense) {
            backend::Scratch s(on_.ctx);
            Tensor x = xn;  // [n, d] in the pass's activation dtype
            if (x.dtype != on_.act) {
                x = s(on_.act, xn.shape);
                ops::cast(on_.ctx, xn, x);
            }
            dense_ffn_forward(
                on_.ctx, w.dense, ExpertAct::swiglu, x, y, step_.ffn_rows(), step_.lora_rows());
            tp_sum(y);
        } else {  // the tp sum is the MoE path's own (it also places each etp block's rows)
            MoeParallel par = moe_groups(on_.m);
            par.fused = on_.fused;
            par.fused_load = timed_;  // the expert load only when timed (a download waits)
            par.overlap = on_.ep_overlap && par.ep != nullptr;
            moe_forward_parallel(on_.ctx,
                                 on_.m.cfg,
                                 spec,
                                 w.moe,
                                 xn,
                                 y,
                                 par,
                                 stats,
                                 step_.ffn_rows(),
                                 nullptr,
                                 step_.lora_rows());
        }
    }

private:
    const comm::Comm* tp() const { return on_.m.shard.tp > 1 ? &on_.m.comms->tp : nullptr; }
    // x ← Σ over tp of x: the partial outputs of this rank's heads and widths.
    void tp_sum(Tensor& x) const {
        if (tp() == nullptr)
            return;
        ops::synchronize(on_.ctx);  // comm:: runs outside the device's stream
        comm::all_reduce(x, *tp());
    }

    const ModelOn& on_;
    const SeqBatch& batch_;
    StepStates& step_;
    const ForwardOptions& options_;
    ForwardStats& stats_;
    bool timed_;
};

}  // namespace

void run_step_layers(const ModelOn& on,
                     const SeqBatch& batch,
                     StepStates& step,
                     const ForwardOptions& options,
                     Tensor& h,
                     ForwardStats& stats,
                     bool timed) {
    const ModelShard& sh = on.m.shard;
    StepBlocks blocks(on, batch, step, options, stats, timed);
    run_layers(on.m.local, sh.first_layer, sh.end_layer, sh.tp * sh.ep > 1, blocks, h, stats);
    step.end_step();
}

}  // namespace hymoe::model::detail
