// The MLA/DSA block on the GPU (device_blocks.h attention_block): model::attention_forward itself
// on a CUDA context, over the layer's views of its device weights (model/model_views.h), with
// the step's rows and the layer's device pages (model/attention_views.h DeviceAttnRows) and the
// device LoRA adapters as factor views on the step's rows of each adapter (model/lora_views.h).
// The fused DSA kernels where the step allows them (step.fused, bf16, sizes their plans take:
// model/fused_step.h).
#include <algorithm>

#include "device_blocks.h"
#include "hymoe/backend/ctx.h"
#include "hymoe/model/attention_views.h"
#include "hymoe/model/fused_step.h"

namespace hymoe::model::gpu {

namespace {

// The most keys a row of the step sees: the longest sequence's length after the step.
int64_t max_visible(const StepBatch& step) {
    const SeqBatch& batch = *step.batch;
    int64_t most = 0;
    for (int64_t q = 0; q < step.n_seq; ++q)
        most = std::max(most, batch.pos0[q] + batch.length(q));
    return most;
}

}  // namespace

void attention_block(Gpu& g,
                     const ModelConfig& cfg,
                     const LayerSpec& spec,
                     const MlaWeightViews& w,
                     const Tensor& x,
                     const StepBatch& step,
                     int layer,
                     DType cd,
                     const comm::Comm* tp,
                     Tensor& y,
                     double* indexer_seconds) {
    const bool dsa = spec.mixer == Mixer::dsa;
    const backend::Ctx ctx{Device::cuda, &g.stream, &g.arena, &g.blas};
    const cu::KvPages kv = step.pages_of(layer);
    DeviceAttnRows dev;
    dev.pages.dtype = DType::f32;
    dev.pages.r_kv = cfg.mla.kv_lora_rank;
    dev.pages.d_r = cfg.mla.qk_rope_head_dim;
    dev.pages.d_i = dsa ? cfg.indexer.head_dim : 0;
    dev.pages.page_tokens = kv.page_tokens;
    dev.pages.row_stride = kv.row_stride;
    dev.pages.base = kv.pages;
    dev.pages.page_stride = kv.page_stride;
    dev.pages.block_table = kv.block_table;
    dev.pages.max_pages = kv.max_pages;
    dev.pos = step.positions;
    dev.row_seq = step.row_seq;
    ops::MlaDeviceRows& r = dev.rows;
    r.row_seq = step.row_seq.ptr<int32_t>();
    r.visible = step.visible.ptr<int32_t>();
    r.n_one = step.n_one;
    r.one_rows = step.n_one > 0 ? step.one_rows.ptr<int64_t>() : nullptr;
    r.one_table = step.n_one > 0 ? step.one_table.ptr<int32_t>() : nullptr;
    r.one_keys = step.n_one > 0 ? step.one_keys.ptr<int32_t>() : nullptr;
    r.one_max_keys = step.one_max_keys;
    const DsaFusedPlan fused =
        dsa && step.fused && cd == DType::bf16
            ? dsa_fused_plan(
                  cfg, step.n_tok, max_visible(step), step.n_seq == 1, cu::device_sm_count())
            : DsaFusedPlan{};
    if (fused.supported) {
        r.indexer_plan = &fused.indexer;
        r.sparse_plan = &fused.attention;
        r.fused_top_k = fused.top_k;
    }
    MlaWeightViews views = w;  // the adapters on the step's rows
    views.lora_rows = &step.lora.rows;
    AttnStats stats;
    attention_forward(ctx,
                      cfg,
                      spec,
                      views,
                      x,
                      *step.batch,
                      {},
                      y,
                      AttnMode::automatic,
                      indexer_seconds ? &stats : nullptr,
                      tp,
                      &dev);
    if (indexer_seconds)
        *indexer_seconds += stats.indexer_seconds;
}

}  // namespace hymoe::model::gpu
