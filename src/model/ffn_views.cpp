// The one MLP every FFN path runs (model/ffn_views.h): dense layers, each routed expert and the
// shared experts, on any Ctx. The activation between the two products runs in the intermediate's
// dtype (fp32 on the CPU: DS32's SwiGLU in fp32, model-math §10).
#include "hymoe/model/ffn_views.h"

#include "hymoe/backend/ops.h"
#include "hymoe/model/lora.h"

namespace hymoe::model {

DenseFfnViews ffn_views(const DenseFfnWeights& w) {
    DenseFfnViews v;
    v.gate_proj = w.gate_proj.view();
    v.up_proj = w.up_proj.view();
    v.down_proj = w.down_proj.view();
    v.lora = &w.lora;
    return v;
}

void dense_ffn_forward(const backend::Ctx& ctx,
                       const DenseFfnViews& w,
                       ExpertAct act,
                       const Tensor& x /*[n_tok, w]*/,
                       Tensor& y /*[n_tok, w]*/,
                       const SeqBatch* row_batch,
                       const std::vector<LoraRowsView>* lora_rows) {
    const int64_t n = x.dim(0);
    const int64_t inter = w.up_proj.dim(0);
    const LoraSlots none;
    const LoraSlots& host = w.lora ? *w.lora : none;
    // [n, I] temporaries, each written in full by its product before it is read: not zero-filled
    // on the CPU (a pass over them would cost ~1% of a prefill).
    backend::Scratch scratch(ctx);
    Buffer host_up, host_gate;
    auto temp = [&](Buffer& buf) {
        if (ctx.device != Device::cpu)
            return scratch(x.dtype, {n, inter});
        buf = Buffer(x.dtype, {n, inter}, uninit);
        return buf.view();
    };
    Tensor up = temp(host_up);  // [n, I]
    const SeqBatch rows = row_batch ? *row_batch : single_sequence(n);
    auto adapters =
        [&](const LoraSlot* slot, const LoraSlotView& f, const Tensor& in, Tensor& out) {
            lora_forward(ctx, slot, f, rows, lora_rows, in, out);
        };
    ops::linear(ctx, x, w.up_proj, up);
    adapters(host.up, w.lora_views.up, x, up);
    switch (act) {
        case ExpertAct::swiglu: {
            Tensor gate = temp(host_gate);  // [n, I], then SiLU(gate) ⊙ up in place
            ops::linear(ctx, x, w.gate_proj, gate);
            adapters(host.gate, w.lora_views.gate, x, gate);
            ops::swiglu(ctx, gate, up, gate);
            ops::linear(ctx, gate, w.down_proj, y);
            adapters(host.down, w.lora_views.down, gate, y);
            return;
        }
        case ExpertAct::relu2:
            ops::relu2_inplace(ctx, up);
            ops::linear(ctx, up, w.down_proj, y);
            adapters(host.down, w.lora_views.down, up, y);
            return;
    }
}

}  // namespace hymoe::model
