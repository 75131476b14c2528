// LoRA adapters on a Ctx (model/lora_views.h): the host slot's run-wise form on the CPU, then
// each adapter's factors on its rows through ops::lora_rows_add.
#include "hymoe/model/lora_views.h"

#include "hymoe/backend/ops_lora.h"
#include "hymoe/core/error.h"
#include "hymoe/model/lora.h"

namespace hymoe::model {

void lora_forward(const backend::Ctx& ctx,
                  const LoraSlot* host,
                  const LoraSlotView& factors,
                  const SeqBatch& batch,
                  const std::vector<LoraRowsView>* rows,
                  const Tensor& x,
                  Tensor& y) {
    if (host != nullptr) {
        HYMOE_CHECK(ctx.device == Device::cpu,
                    "lora_forward: host adapters on a ",
                    to_string(ctx.device),
                    " context (upload them as factor views)");
        lora_forward(host, batch, x, y);
    }
    if (rows == nullptr)
        return;
    for (const LoraRowsView& r : *rows) {
        if (r.adapter < 0 || r.adapter >= static_cast<int>(factors.size()))
            continue;
        const LoraFactorsView& f = factors[static_cast<size_t>(r.adapter)];
        if (f.A.data != nullptr)
            ops::lora_rows_add(ctx, r.rows, f.A, f.B, f.scale, x, y);
    }
}

}  // namespace hymoe::model
