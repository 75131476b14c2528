// One layer's mixer and FFN as the CPU model's inference pass runs them (layer.h): the block its
// LayerSpec names on this rank's heads and widths, then the tp sum of the partial output. MoE
// layers take the one MoE path whatever the layout. The CPU model's LayerBlocks run these.
#include "layer.h"

#include <algorithm>
#include <unordered_set>

#include "hymoe/model/attention_views.h"
#include "hymoe/model/ffn_views.h"
#include "hymoe/model/kv_cache.h"
#include "hymoe/model/moe_parallel.h"

namespace hymoe::model::detail {

namespace {

const comm::Comm* tp_comm(const Model& m) {
    return m.shard.tp > 1 ? &m.comms->tp : nullptr;
}

// x ← Σ over tp of x: the partial outputs (forward) or input gradients (backward) of this rank's
// heads and widths.
void tp_sum(const Model& m, Tensor& x) {
    if (m.shard.tp > 1)
        comm::all_reduce(x, m.comms->tp);
}

}  // namespace

MoeParallel moe_groups(const Model& m) {
    MoeParallel par;
    par.tp = tp_comm(m);
    par.ep = m.shard.ep > 1 ? &m.comms->ep : nullptr;
    par.etp = m.shard.etp;
    return par;
}

void mixer_forward(const Model& m,
                   int i,
                   const Tensor& xn,
                   const SeqBatch& batch,
                   const MixerPass& pass,
                   Tensor& y) {
    const LayerSpec& spec = m.local.layers[i];
    const size_t n_seq = static_cast<size_t>(batch.n_seq());
    if (spec.mixer == Mixer::kda) {
        std::vector<KdaState*> states(n_seq);
        for (size_t s = 0; s < n_seq; ++s)
            states[s] = &(*pass.states)[s]->kda[i];
        kda_forward(m.ctx, m.local, m.layers[i].kda, xn, batch, states, y, pass.kda_mode);
    } else {
        std::vector<AttnCache*> caches;  // [n_seq]
        for (SequenceState* s : *pass.states)
            caches.push_back(&s->attn[i]);
        attention_forward(m.ctx,
                          m.local,
                          spec,
                          m.layers[i].attn,
                          xn,
                          batch,
                          caches,
                          y,
                          pass.attn_mode,
                          pass.attn_stats,
                          tp_comm(m));
    }
    tp_sum(m, y);
}

void ffn_forward(
    const Model& m, int i, const Tensor& xn, Tensor& y, const SeqBatch* rows, MoeCommStats* stats) {
    const LayerSpec& spec = m.local.layers[i];
    if (spec.ffn == Ffn::dense) {
        dense_ffn_forward(m.ctx, m.layers[i].dense, ExpertAct::swiglu, xn, y, rows);
        tp_sum(m, y);
    } else {  // the tp sum is the MoE path's own (it also places each etp block's rows)
        moe_forward_parallel(m.cfg, spec, m.layers[i].moe, xn, y, moe_groups(m), stats, rows);
    }
}

ModelBlocks::ModelBlocks(const Model& m,
                         const SeqBatch& batch,
                         const MixerPass& pass,
                         const SeqBatch* rows)
    : m_(m), batch_(batch), pass_(pass), rows_(rows) {
    const ModelShard& sh = m.shard;
    std::vector<std::vector<int32_t>> pages;  // [pool] the step's pages, block tables in order
    for (const SequenceState* s : *pass.states)
        for (int i = sh.first_layer; i < sh.end_layer; ++i) {
            KvPool* pool = s->attn.empty() ? nullptr : s->attn[i].pool;
            if (pool == nullptr)
                continue;
            const size_t k = std::find(pools_.begin(), pools_.end(), pool) - pools_.begin();
            if (k == pools_.size())
                pools_.push_back(pool), pages.emplace_back();
            pages[k].insert(pages[k].end(), s->pages.begin(), s->pages.end());
            break;
        }
    for (size_t k = 0; k < pools_.size(); ++k) {  // block tables may share pages (a cached
        std::vector<int32_t> once;                //   prompt prefix): first occurrences
        std::unordered_set<int32_t> seen;
        for (int32_t p : pages[k])
            if (seen.insert(p).second)
                once.push_back(p);
        pools_[k]->begin_step(once);
    }
}

void ModelBlocks::mixer(int i, const Tensor& xn, Tensor& y) {
    if (m_.local.layers[i].mixer != Mixer::kda)
        for (KvPool* pool : pools_)
            pool->enter_layer(i);
    mixer_forward(m_, i, xn, batch_, pass_, y);
}

void ModelBlocks::ffn(int i, const Tensor& xn, Tensor& y, MoeCommStats* stats) {
    ffn_forward(m_, i, xn, y, rows_, stats);
}

void ModelBlocks::end_step() const {
    for (KvPool* pool : pools_)
        pool->end_step();
}

}  // namespace hymoe::model::detail
