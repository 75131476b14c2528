// MLA / DSA / gated attention forward on the CPU (spec/model-math.md §4-5; DeepSeek-V3.2
// inference/model.py `MLA.forward`, both branches). One call: project the new tokens of every
// sequence at once (queries, latent, rope key, indexer inputs), append the latent, rope key and
// indexer key to each sequence's cache, then attend per sequence over its whole cache in blocks of
// queries, then gate and project out. Query i of a sequence (position p = pos0 + i) sees keys
// 0..p; a block of queries is given only the keys its last query can see, so scratch stays
// [block, n_k]. A DSA prefill attends sparsely: each query over its own top-k keys only.
#include "hymoe/model/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_attention.h"
#include "hymoe/backend/ops_kda.h"
#include "hymoe/core/error.h"
#include "hymoe/core/timer.h"
#include "hymoe/model/attention_views.h"
#include "hymoe/model/kv_cache.h"
#include "hymoe/model/model.h"
#include "mla_project.h"

namespace hymoe::model {

using detail::mla_dims;
using detail::MlaDims;

namespace {

constexpr int64_t query_block = 256;  // queries per block of scores
static_assert(kPrefillAlign % query_block == 0, "model.h: kPrefillAlign");

// A view of host fp32 memory (read-only where the pointer is const: the view type is not).
Tensor view_of(const float* p, Shape shape) {
    return Tensor{const_cast<float*>(p), DType::f32, Device::cpu, std::move(shape)};
}

// HF DeepSeek yarn_get_mscale.
double yarn_get_mscale(double factor, double mscale) {
    return factor <= 1.0 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

// rows [row0, row0 + count) of a [n_tok, width] buffer appended to a cache array
void append_rows(std::vector<float>& dst, const Tensor& src, int64_t row0, int64_t count) {
    const int64_t width = src.dim(1);
    const float* p = src.ptr<float>() + row0 * width;
    dst.insert(dst.end(), p, p + count * width);
}

// A sequence's cached rows: single rows where they lie (a page or the private arrays), and whole
// arrays made contiguous on first use (paged caches gather them once per call), so a DSA decode
// token copies only its indexer keys and its top-k rows, not the whole cache.
class CacheRows {
public:
    CacheRows(const AttnCache& cache, int64_t r_kv, int64_t d_r, int64_t d_i)
        : cache_(cache), r_kv_(r_kv), d_r_(d_r), d_i_(d_i) {}
    int64_t n() const { return cache_.n; }
    // row u's c_kv [r_kv] and k_r [d_r] into out
    void c_kv_row(int64_t u, float* out) const { row(u, 0, cache_.c_kv, r_kv_, out); }
    void k_r_row(int64_t u, float* out) const { row(u, r_kv_, cache_.k_r, d_r_, out); }
    const float* c_kv_all() const { return all(c_kv_, 0, cache_.c_kv, r_kv_); }  // [n, r_kv]
    const float* k_r_all() const { return all(k_r_, r_kv_, cache_.k_r, d_r_); }  // [n, d_r]
    const float* k_idx_all() const {                                             // [n, d_I]
        return all(k_idx_, r_kv_ + d_r_, cache_.k_idx, d_i_);
    }
    // The indexer keys run in bf16 when they are cached in bf16 (a bf16 pool).
    bool bf16_indexer() const { return cache_.pool && cache_.pool->dtype() == DType::bf16; }
    // The cached indexer keys [n, d_I] in bf16 tiles (bf16_indexer() only), packed on first use.
    const ops::IndexerKeys& k_idx_bf16() const {
        if (!k_idx_tiles_) {
            k_idx_tiles_.emplace(cache_.n, d_i_);
            const int64_t pt = cache_.pool->page_tokens(),
                          width = cache_.pool->row_width(cache_.layer);
            for (int64_t u = 0; u < cache_.n; ++u) {
                const auto* page = static_cast<const uint16_t*>(
                    cache_.pool->store().page(cache_.layer, (*cache_.pages)[u / pt], false));
                k_idx_tiles_->put(u, page + (u % pt) * width + r_kv_ + d_r_);
            }
        }
        return *k_idx_tiles_;
    }

private:
    // row u of the array at `offset` in a paged row (widened to fp32), or of the private array
    // of `width`, into out [width]
    void row(
        int64_t u, int64_t offset, const std::vector<float>& own, int64_t width, float* out) const {
        if (cache_.pool == nullptr) {
            std::copy_n(own.data() + u * width, width, out);
            return;
        }
        const int64_t pt = cache_.pool->page_tokens();
        cache_.pool->read_row(cache_.layer, (*cache_.pages)[u / pt], u % pt, offset, width, out);
    }
    const float* all(std::vector<float>& gathered,
                     int64_t offset,
                     const std::vector<float>& own,
                     int64_t width) const {
        if (cache_.pool == nullptr)
            return own.data();
        if (gathered.empty() && cache_.n > 0) {
            gathered.resize(static_cast<size_t>(cache_.n * width));
            for (int64_t u = 0; u < cache_.n; ++u)
                row(u, offset, own, width, gathered.data() + u * width);
        }
        return gathered.data();
    }

    const AttnCache& cache_;
    int64_t r_kv_, d_r_, d_i_;
    mutable std::vector<float> c_kv_, k_r_, k_idx_;  // gathered arrays of a paged cache
    mutable std::optional<ops::IndexerKeys> k_idx_tiles_;
};

// Appends the new tokens' rows [row0, row0 + count) of c_kv, k_r (and k_idx) to the cache.
void append_tokens(AttnCache& cache,
                   const Tensor& c_kv,
                   const Tensor& k_r,
                   const Tensor* k_idx,
                   int64_t row0,
                   int64_t count) {
    if (cache.pool == nullptr) {
        append_rows(cache.c_kv, c_kv, row0, count);
        append_rows(cache.k_r, k_r, row0, count);
        if (k_idx)
            append_rows(cache.k_idx, *k_idx, row0, count);
    } else {
        const int64_t pt = cache.pool->page_tokens(), r_kv = c_kv.dim(1);
        const int64_t d_r = k_r.dim(1), d_i = k_idx ? k_idx->dim(1) : 0;
        HYMOE_CHECK(static_cast<int64_t>(cache.pages->size()) * pt >= cache.n + count,
                    "attention: the block table covers ",
                    cache.pages->size() * pt,
                    " tokens, not ",
                    cache.n + count);
        for (int64_t t = 0; t < count; ++t) {
            const int64_t u = cache.n + t;
            const int32_t page = (*cache.pages)[u / pt];
            auto put = [&](int64_t offset, const Tensor& src, int64_t width) {  // its row t
                cache.pool->write_row(cache.layer,
                                      page,
                                      u % pt,
                                      offset,
                                      width,
                                      src.ptr<float>() + (row0 + t) * width);
            };
            put(0, c_kv, r_kv);
            put(r_kv, k_r, d_r);
            if (k_idx)
                put(r_kv + d_r, *k_idx, d_i);
        }
    }
    cache.n += count;
}

// Causal mask of the queries at positions pos_first .. pos_first + n_q − 1 over n_k keys.
void causal_mask(int64_t pos_first, Tensor& mask) {  // [n_q, n_k]
    const int64_t n_q = mask.dim(0), n_k = mask.dim(1);
    float* mp = mask.ptr<float>();
    for (int64_t i = 0; i < n_q; ++i)
        for (int64_t u = 0; u < n_k; ++u)
            mp[i * n_k + u] = u <= pos_first + i ? 0.0f : -std::numeric_limits<float>::infinity();
}

// One sequence's work in a call: its rows of the call's tensors and its cache (already holding
// the new tokens).
struct SeqWork {
    const float* q = nullptr;  // [n_q, H·(d_n+d_r)] the sequence's query rows
    float* o = nullptr;        // [n_q, H·d_v] its rows of the attention output
    int64_t n_q = 0;           // new tokens
    int64_t pos0 = 0;          // position of the first
    const CacheRows* cache = nullptr;
    const float* q_idx = nullptr;    // [n_q, H_I·d_I] indexer queries (dsa), else null
    const float* w_idx = nullptr;    // [n_q, H_I] indexer head weights (dsa)
    const comm::Comm* tp = nullptr;  // indexer heads split over tp: its scores are all-reduced
};

// The indexer scores of the query block [i0, i0 + n_b) over its n_kb = pos0 + i0 + n_b visible
// keys, summed over the tp ranks' heads.
void block_scores(const ModelConfig& cfg, const SeqWork& s, int64_t i0, Tensor& scores) {
    const int64_t n_b = scores.dim(0), n_kb = scores.dim(1);
    const int64_t h_i = cfg.indexer.n_head, d_i = cfg.indexer.head_dim;
    if (s.cache->bf16_indexer())
        ops::indexer_scores_bf16(s.q_idx + i0 * h_i * d_i,
                                 s.w_idx + i0 * h_i,
                                 n_b,
                                 h_i,
                                 s.cache->k_idx_bf16(),
                                 n_kb,
                                 scores.ptr<float>(),
                                 n_kb);
    else
        ops::indexer_scores(view_of(s.q_idx + i0 * h_i * d_i, {n_b, h_i * d_i}),
                            view_of(s.w_idx + i0 * h_i, {n_b, h_i}),
                            view_of(s.cache->k_idx_all(), {n_kb, d_i}),
                            scores);
    if (s.tp != nullptr && s.tp->size() > 1)
        comm::all_reduce(scores, *s.tp);  // Σ over every rank's heads
}

// The mask of the query block [i0, i0 + n_b) over its n_kb = pos0 + i0 + n_b visible keys.
void block_mask(const ModelConfig& cfg,
                const SeqWork& s,
                int64_t i0,
                Tensor& mask,  // [n_b, n_kb]
                double& indexer_seconds) {
    const int64_t n_b = mask.dim(0), n_kb = mask.dim(1);
    if (s.q_idx == nullptr) {
        causal_mask(s.pos0 + i0, mask);
        return;
    }
    ScopedTimer timer(indexer_seconds);
    Buffer scores(DType::f32, {n_b, n_kb});
    block_scores(cfg, s, i0, scores.view());
    ops::indexer_mask(scores.view(), s.pos0 + i0, cfg.indexer.top_k, mask);
}

// MHA form: k_h = [k_n,h | k_r], v_h up-projected from every cached c_kv.
void attend_expanded(const ModelConfig& cfg,
                     const MlaWeightViews& w,
                     const SeqWork& s,
                     double& indexer_seconds) {
    const MlaDims m = mla_dims(cfg);
    const int64_t n_k = s.cache->n(), n_head = m.n_head;
    const float tau = static_cast<float>(mla_softmax_scale(cfg.mla));
    Buffer kvb(DType::f32, {n_k, n_head * m.d_kvb()});
    ops::linear(view_of(s.cache->c_kv_all(), {n_k, m.r_kv}), w.kv_b_proj, kvb.view());
    const float* k_r = s.cache->k_r_all();     // [n_k, d_r]
    std::vector<Buffer> k(n_head), v(n_head);  // per head [n_k, d_n+d_r], [n_k, d_v]
    for (int64_t h = 0; h < n_head; ++h) {
        k[h] = Buffer(DType::f32, {n_k, m.d_qk()});
        v[h] = Buffer(DType::f32, {n_k, m.d_v});
        for (int64_t u = 0; u < n_k; ++u) {
            const float* kv_u = kvb.ptr<float>() + (u * n_head + h) * m.d_kvb();
            float* k_u = k[h].ptr<float>() + u * m.d_qk();
            std::copy(kv_u, kv_u + m.d_n, k_u);
            std::copy_n(k_r + u * m.d_r, m.d_r, k_u + m.d_n);
            std::copy(kv_u + m.d_n, kv_u + m.d_kvb(), v[h].ptr<float>() + u * m.d_v);
        }
    }
    const int64_t ld_q = n_head * m.d_qk(), ld_o = n_head * m.d_v;
    for (int64_t i0 = 0; i0 < s.n_q; i0 += query_block) {
        const int64_t n_b = std::min(query_block, s.n_q - i0), n_kb = s.pos0 + i0 + n_b;
        Buffer mask(DType::f32, {n_b, n_kb}), q_h(DType::f32, {n_b, m.d_qk()});
        Buffer o_h(DType::f32, {n_b, m.d_v});
        block_mask(cfg, s, i0, mask.view(), indexer_seconds);
        for (int64_t h = 0; h < n_head; ++h) {
            for (int64_t i = 0; i < n_b; ++i) {
                const float* q_i = s.q + (i0 + i) * ld_q + h * m.d_qk();
                std::copy(q_i, q_i + m.d_qk(), q_h.ptr<float>() + i * m.d_qk());
            }
            ops::attention_core(q_h.view(),
                                k[h].view().rows(0, n_kb),
                                v[h].view().rows(0, n_kb),
                                mask.view(),
                                tau,
                                o_h.view());
            for (int64_t i = 0; i < n_b; ++i) {
                const float* o_i = o_h.ptr<float>() + i * m.d_v;
                std::copy(o_i, o_i + m.d_v, s.o + (i0 + i) * ld_o + h * m.d_v);
            }
        }
    }
}

// MQA form over the latent [c_kv | k_r]: q̂_h = [W_kvb[h, :d_n]ᵀ q_n,h | q_r,h],
// ō_h = softmax(q̂_h [c_kv | k_r]ᵀ τ) c_kv, o_h = W_kvb[h, d_n:] ō_h, over the keys the block's
// mask keeps (gathered: a DSA block reads only its queries' top-k rows).
void attend_absorbed(const ModelConfig& cfg,
                     const MlaWeightViews& w,
                     const SeqWork& s,
                     double& indexer_seconds) {
    const MlaDims m = mla_dims(cfg);
    const int64_t n_head = m.n_head;
    const float tau = static_cast<float>(mla_softmax_scale(cfg.mla));
    const ops::WeightRef w_kvb = ops::weight_ref(w.kv_b_proj);  // [H, d_n + d_v, r_kv]
    const int64_t ld_q = n_head * m.d_qk(), ld_o = n_head * m.d_v;
    for (int64_t i0 = 0; i0 < s.n_q; i0 += query_block) {
        const int64_t n_b = std::min(query_block, s.n_q - i0), n_kb = s.pos0 + i0 + n_b;
        Buffer full_mask(DType::f32, {n_b, n_kb}), q_hat(DType::f32, {n_b, m.d_lat()});
        Buffer o_bar(DType::f32, {n_b, m.r_kv});
        block_mask(cfg, s, i0, full_mask.view(), indexer_seconds);
        // The keys some query of the block attends to: all visible ones for MLA, the union of
        // the block's top-k for DSA, so a DSA decode token costs O(top-k) here, not O(context).
        std::vector<int64_t> keys;
        const float* fm = full_mask.ptr<float>();
        for (int64_t u = 0; u < n_kb; ++u)
            for (int64_t i = 0; i < n_b; ++i)
                if (fm[i * n_kb + u] == 0.0f) {
                    keys.push_back(u);
                    break;
                }
        const auto n_sel = static_cast<int64_t>(keys.size());
        Buffer lat(DType::f32, {n_sel, m.d_lat()}), c_kv(DType::f32, {n_sel, m.r_kv});
        Buffer mask(DType::f32, {n_b, n_sel});  // [n_b, n_sel] the mask on those keys
        for (int64_t j = 0; j < n_sel; ++j) {
            const int64_t u = keys[static_cast<size_t>(j)];
            float* l_j = lat.ptr<float>() + j * m.d_lat();
            s.cache->c_kv_row(u, l_j);
            s.cache->k_r_row(u, l_j + m.r_kv);
            std::copy_n(l_j, m.r_kv, c_kv.ptr<float>() + j * m.r_kv);
            for (int64_t i = 0; i < n_b; ++i)
                mask.ptr<float>()[i * n_sel + j] = fm[i * n_kb + u];
        }
        for (int64_t h = 0; h < n_head; ++h) {
            const float* q_h = s.q + i0 * ld_q + h * m.d_qk();
            const ops::WeightRef w_h = w_kvb.at(h * m.d_kvb() * m.r_kv);
            // q̂ [n_b, r_kv] = q_n [n_b, d_n] · W_kvb[h, :d_n] [d_n, r_kv]
            ops::gemm_w(false,
                        n_b,
                        m.r_kv,
                        m.d_n,
                        1.0f,
                        q_h,
                        ld_q,
                        w_h,
                        m.r_kv,
                        0.0f,
                        q_hat.ptr<float>(),
                        m.d_lat());
            for (int64_t i = 0; i < n_b; ++i)
                std::copy(q_h + i * ld_q + m.d_n,
                          q_h + i * ld_q + m.d_qk(),
                          q_hat.ptr<float>() + i * m.d_lat() + m.r_kv);
            ops::attention_core(
                q_hat.view(), lat.view(), c_kv.view(), mask.view(), tau, o_bar.view());
            // o_h [n_b, d_v] = ō [n_b, r_kv] · W_kvb[h, d_n:]ᵀ
            ops::gemm_w(true,
                        n_b,
                        m.d_v,
                        m.r_kv,
                        1.0f,
                        o_bar.ptr<float>(),
                        m.r_kv,
                        w_h.at(m.d_n * m.r_kv),
                        m.r_kv,
                        0.0f,
                        s.o + i0 * ld_o + h * m.d_v,
                        ld_o);
        }
    }
}

// DSA, sparse: per query i, the absorbed form over its own top-k keys only. The block's
// q̂ [n_b, H, d_lat] and the outputs o_h = ō_h W_kvb[h, d_n:]ᵀ are GEMMs over the block; per query,
// its n_i ≤ top-k latent rows [c_kv | k_r] are gathered and s [H, n_i] = q̂_i latᵀ·τ, softmax,
// ō_i [H, r_kv] = p c_kv are two GEMMs: a query's cost grows with top-k, not with the context.
void attend_sparse(const ModelConfig& cfg,
                   const MlaWeightViews& w,
                   const SeqWork& s,
                   double& indexer_seconds) {
    const MlaDims m = mla_dims(cfg);
    const int64_t n_head = m.n_head, d_lat = m.d_lat(), top_k = cfg.indexer.top_k;
    const float tau = static_cast<float>(mla_softmax_scale(cfg.mla));
    const ops::WeightRef w_kvb = ops::weight_ref(w.kv_b_proj);  // [H, d_n + d_v, r_kv]
    const int64_t ld_q = n_head * m.d_qk(), ld_o = n_head * m.d_v;
    const int64_t rows = std::min(query_block, s.n_q);  // a block's queries, at most
    Buffer q_hat(DType::f32, {rows, n_head, d_lat});
    Buffer o_bar(DType::f32, {rows, n_head, m.r_kv});
    Buffer lat(DType::f32, {top_k, d_lat});  // [n_i, d_lat] a query's gathered rows
    std::vector<float> p(static_cast<size_t>(n_head * top_k));  // [H, n_i]
    std::vector<int64_t> keep(static_cast<size_t>(rows * top_k)), n_keep(rows);
    for (int64_t i0 = 0; i0 < s.n_q; i0 += query_block) {
        const int64_t n_b = std::min(query_block, s.n_q - i0), n_kb = s.pos0 + i0 + n_b;
        {
            ScopedTimer timer(indexer_seconds);
            Buffer scores(DType::f32, {n_b, n_kb});
            block_scores(cfg, s, i0, scores.view());
            ops::indexer_select(scores.view(), s.pos0 + i0, top_k, keep.data(), n_keep.data());
        }
        for (int64_t h = 0; h < n_head; ++h) {  // q̂_h = [q_n W_kvb[h, :d_n] | q_r]
            const float* q_h = s.q + i0 * ld_q + h * m.d_qk();
            ops::gemm_w(false,
                        n_b,
                        m.r_kv,
                        m.d_n,
                        1.0f,
                        q_h,
                        ld_q,
                        w_kvb.at(h * m.d_kvb() * m.r_kv),
                        m.r_kv,
                        0.0f,
                        q_hat.ptr<float>() + h * d_lat,
                        n_head * d_lat);
            for (int64_t i = 0; i < n_b; ++i)
                std::copy(q_h + i * ld_q + m.d_n,
                          q_h + i * ld_q + m.d_qk(),
                          q_hat.ptr<float>() + (i * n_head + h) * d_lat + m.r_kv);
        }
        // The block reads n_b · top-k rows: when that is more than the cache holds, the whole
        // cache is gathered once (widened from a paged cache's dtype), else row by row.
        const bool whole = n_b * top_k >= s.cache->n();
        const float* c_kv_all = whole ? s.cache->c_kv_all() : nullptr;  // [n, r_kv]
        const float* k_r_all = whole ? s.cache->k_r_all() : nullptr;    // [n, d_r]
        for (int64_t i = 0; i < n_b; ++i) {
            const int64_t n_i = n_keep[i];
            for (int64_t j = 0; j < n_i; ++j) {
                const int64_t u = keep[i * top_k + j];
                float* l_j = lat.ptr<float>() + j * d_lat;
                if (whole) {
                    std::copy_n(c_kv_all + u * m.r_kv, m.r_kv, l_j);
                    std::copy_n(k_r_all + u * m.d_r, m.d_r, l_j + m.r_kv);
                } else {
                    s.cache->c_kv_row(u, l_j);
                    s.cache->k_r_row(u, l_j + m.r_kv);
                }
            }
            ops::gemm(false,
                      true,
                      n_head,
                      n_i,
                      d_lat,
                      tau,
                      q_hat.ptr<float>() + i * n_head * d_lat,
                      d_lat,
                      lat.ptr<float>(),
                      d_lat,
                      0.0f,
                      p.data(),
                      n_i);
            ops::softmax_rows(p.data(), n_head, n_i);
            ops::gemm(false,
                      false,
                      n_head,
                      m.r_kv,
                      n_i,
                      1.0f,
                      p.data(),
                      n_i,
                      lat.ptr<float>(),
                      d_lat,
                      0.0f,
                      o_bar.ptr<float>() + i * n_head * m.r_kv,
                      m.r_kv);
        }
        for (int64_t h = 0; h < n_head; ++h)  // o_h [n_b, d_v] = ō_h · W_kvb[h, d_n:]ᵀ
            ops::gemm_w(true,
                        n_b,
                        m.d_v,
                        m.r_kv,
                        1.0f,
                        o_bar.ptr<float>() + h * m.r_kv,
                        n_head * m.r_kv,
                        w_kvb.at(h * m.d_kvb() * m.r_kv + m.d_n * m.r_kv),
                        m.r_kv,
                        0.0f,
                        s.o + i0 * ld_o + h * m.d_v,
                        ld_o);
    }
}

void check_call(const ModelConfig& cfg,
                const LayerSpec& spec,
                const Tensor& x,
                const SeqBatch& batch,
                const std::vector<AttnCache*>& caches,
                const Tensor& y) {
    const MlaDims m = mla_dims(cfg);
    HYMOE_CHECK(spec.mixer == Mixer::mla || spec.mixer == Mixer::dsa,
                "attention_forward on a ",
                to_string(spec.mixer),
                " layer");
    HYMOE_CHECK(
        x.shape.size() == 2 && x.dim(0) == batch.n_tok() && x.dim(1) == m.d && y.shape == x.shape,
        "attention_forward: x ",
        shape_string(x.shape),
        " y ",
        shape_string(y.shape),
        " for ",
        batch.n_tok(),
        " tokens of width ",
        m.d);
    HYMOE_CHECK(caches.empty() || static_cast<int64_t>(caches.size()) == batch.n_seq(),
                "attention_forward: ",
                caches.size(),
                " caches for ",
                batch.n_seq(),
                " sequences");
    for (int64_t s = 0; s < batch.n_seq(); ++s) {
        HYMOE_CHECK(caches.empty() || caches[s] != nullptr, "attention_forward: no cache for ", s);
        const int64_t held = caches.empty() ? 0 : caches[s]->n;
        HYMOE_CHECK(batch.pos0[s] == held,
                    "attention_forward: sequence ",
                    s,
                    " starts at ",
                    batch.pos0[s],
                    " but its cache holds ",
                    held,
                    " tokens");
    }
    if (spec.mixer == Mixer::dsa)
        HYMOE_CHECK(m.r_q > 0 && cfg.indexer.top_k > 0,
                    "attention_forward: DSA needs a query ",
                    "latent (q_lora_rank ",
                    m.r_q,
                    ") and top-k > 0 (",
                    cfg.indexer.top_k,
                    ")");
}

}  // namespace

TensorList attention_tensors(const ModelConfig& cfg, const LayerSpec& spec, MlaWeights* w) {
    const MlaDims m = mla_dims(cfg);
    const int64_t q_rows = m.n_head * m.d_qk();  // n_head: this rank's heads under tp
    using W = MlaWeights;
    using X = IndexerWeights;
    TensorList list;  // the MLA block's, then the indexer's
    if (m.r_q > 0) {
        list.push_back({"q_a_proj.weight", {m.r_q, m.d}, slot(w, &W::q_a_proj)});
        list.push_back({"q_a_layernorm.weight", {m.r_q}, slot(w, &W::q_a_layernorm), Init::ones});
        list.push_back(split(0, {"q_b_proj.weight", {q_rows, m.r_q}, slot(w, &W::q_b_proj)}));
    } else {
        list.push_back(split(0, {"q_proj.weight", {q_rows, m.d}, slot(w, &W::q_proj)}));
    }
    list.push_back(
        {"kv_a_proj_with_mqa.weight", {m.d_lat(), m.d}, slot(w, &W::kv_a_proj_with_mqa)});
    list.push_back({"kv_a_layernorm.weight", {m.r_kv}, slot(w, &W::kv_a_layernorm), Init::ones});
    list.push_back(
        split(0, {"kv_b_proj.weight", {m.n_head * m.d_kvb(), m.r_kv}, slot(w, &W::kv_b_proj)}));
    list.push_back(split(1, {"o_proj.weight", {m.d, m.n_head * m.d_v}, slot(w, &W::o_proj)}));
    if (spec.gated)
        list.push_back(split(0, {"g_proj.weight", {m.n_head * m.d_v, m.d}, slot(w, &W::g_proj)}));
    list = in_block(WeightBlock::mla, std::move(list));
    if (spec.mixer == Mixer::dsa) {
        const int64_t h_i = cfg.indexer.n_head, d_i = cfg.indexer.head_dim;  // h_i: under tp
        IndexerWeights* x = w ? &w->indexer : nullptr;
        const TensorList indexer = in_block(
            WeightBlock::indexer,
            {split(0, {"indexer.wq_b.weight", {h_i * d_i, m.r_q}, slot(x, &X::wq_b)}),
             {"indexer.wk.weight", {d_i, m.d}, slot(x, &X::wk)},
             {"indexer.k_norm.weight", {d_i}, slot(x, &X::k_norm_weight), Init::ones},
             {"indexer.k_norm.bias", {d_i}, slot(x, &X::k_norm_bias), Init::zeros},
             split(0, {"indexer.weights_proj.weight", {h_i, m.d}, slot(x, &X::weights_proj)})});
        list.insert(list.end(), indexer.begin(), indexer.end());
    }
    return list;
}

ops::RopeFreqs mla_rope_freqs(const MlaConfig& mla) {
    if (mla.rope_scaling != RopeScaling::yarn)
        return ops::rope_freqs(mla.qk_rope_head_dim, mla.rope_theta);
    const double mscale = yarn_get_mscale(mla.yarn_factor, mla.yarn_mscale) /
                          yarn_get_mscale(mla.yarn_factor, mla.yarn_mscale_all_dim);
    return ops::rope_freqs_yarn(mla.qk_rope_head_dim,
                                mla.rope_theta,
                                mla.yarn_factor,
                                mla.yarn_original_max_position,
                                mla.yarn_beta_fast,
                                mla.yarn_beta_slow,
                                mscale);
}

MlaWeightViews attention_views(const MlaWeights& w) {
    const IndexerWeights& x = w.indexer;
    return {w.q_a_proj.view(),
            w.q_a_layernorm.view(),
            w.q_b_proj.view(),
            w.q_proj.view(),
            w.kv_a_proj_with_mqa.view(),
            w.kv_a_layernorm.view(),
            w.kv_b_proj.view(),
            w.o_proj.view(),
            w.g_proj.view(),
            {x.wq_b.view(),
             x.wk.view(),
             x.k_norm_weight.view(),
             x.k_norm_bias.view(),
             x.weights_proj.view()},
            &w.lora};
}

void attention_forward(const backend::Ctx& ctx,
                       const ModelConfig& cfg,
                       const LayerSpec& spec,
                       const MlaWeights& w,
                       const Tensor& x,
                       const SeqBatch& batch,
                       const std::vector<AttnCache*>& caches,
                       Tensor& y,
                       AttnMode mode,
                       AttnStats* stats,
                       const comm::Comm* tp) {
    attention_forward(ctx, cfg, spec, attention_views(w), x, batch, caches, y, mode, stats, tp);
}

void attention_forward(const backend::Ctx& ctx,
                       const ModelConfig& cfg,
                       const LayerSpec& spec,
                       const MlaWeightViews& w,
                       const Tensor& x,
                       const SeqBatch& batch,
                       const std::vector<AttnCache*>& caches,
                       Tensor& y,
                       AttnMode mode,
                       AttnStats* stats,
                       const comm::Comm* tp) {
    const double start = wall_seconds();
    double indexer_seconds = 0;
    check_call(cfg, spec, x, batch, caches, y);
    HYMOE_CHECK(ctx.device == Device::cpu,
                "attention_forward: the latent cache and the attention over it run on the host so "
                "far (the projections, RoPE, gate and output are ops): a ",
                to_string(ctx.device),
                " context");
    const LoraSlots none;
    const LoraSlots& lora = w.lora ? *w.lora : none;
    const MlaDims m = mla_dims(cfg);
    const int64_t n_tok = x.dim(0), n_seq = batch.n_seq();
    backend::Scratch scratch(ctx);
    std::vector<int64_t> pos_host(static_cast<size_t>(n_tok));
    for (int64_t s = 0; s < n_seq; ++s)
        for (int64_t t = batch.offsets[s]; t < batch.offsets[s + 1]; ++t)
            pos_host[t] = batch.pos0[s] + (t - batch.offsets[s]);
    Tensor pos = scratch(DType::i64, {n_tok});  // [n_tok] positions on ctx's device
    ops::upload(ctx, Tensor{pos_host.data(), DType::i64, Device::cpu, {n_tok}}, pos);

    detail::ProjectedViews p;
    p.q = scratch(DType::f32, {n_tok, m.n_head * m.d_qk()});
    p.c_kv = scratch(DType::f32, {n_tok, m.r_kv});
    p.k_r = scratch(DType::f32, {n_tok, m.d_r});
    if (m.r_q > 0)
        p.c_q = scratch(DType::f32, {n_tok, m.r_q});
    detail::mla_project(ctx, cfg, w, x, batch, pos, p);
    const bool dsa = spec.mixer == Mixer::dsa;
    Tensor q_idx, k_idx, w_idx;  // dsa: [n_tok, H_I·d_I], [n_tok, d_I], [n_tok, H_I]
    if (dsa) {
        ScopedTimer timer(indexer_seconds);
        const int64_t h_i = cfg.indexer.n_head, d_i = cfg.indexer.head_dim;
        q_idx = scratch(DType::f32, {n_tok, h_i * d_i});
        k_idx = scratch(DType::f32, {n_tok, d_i});
        w_idx = scratch(DType::f32, {n_tok, h_i});
        indexer_project(ctx, cfg, w.indexer, x, p.c_q, pos, q_idx, k_idx, w_idx);
    }

    std::vector<AttnCache> own(caches.empty() ? n_seq : 0);  // no caches: this call only
    Tensor o = scratch(DType::f32, {n_tok, m.n_head * m.d_v});
    for (int64_t s = 0; s < n_seq; ++s) {
        AttnCache& cache = caches.empty() ? own[s] : *caches[s];
        const int64_t row0 = batch.offsets[s], n_q = batch.length(s);
        append_tokens(cache, p.c_kv, p.k_r, dsa ? &k_idx : nullptr, row0, n_q);
        if (n_q == 0)
            continue;
        const CacheRows rows(cache, m.r_kv, m.d_r, dsa ? cfg.indexer.head_dim : 0);
        SeqWork work;
        work.q = p.q.ptr<float>() + row0 * m.n_head * m.d_qk();
        work.o = o.ptr<float>() + row0 * m.n_head * m.d_v;
        work.n_q = n_q;
        work.pos0 = batch.pos0[s];
        work.cache = &rows;
        work.tp = tp;
        if (dsa) {
            work.q_idx = q_idx.ptr<float>() + row0 * cfg.indexer.n_head * cfg.indexer.head_dim;
            work.w_idx = w_idx.ptr<float>() + row0 * cfg.indexer.n_head;
        }
        const bool automatic = mode == AttnMode::automatic || (mode == AttnMode::sparse && !dsa);
        if (mode == AttnMode::absorbed || (automatic && n_q == 1))
            attend_absorbed(cfg, w, work, indexer_seconds);
        else if (dsa && (mode == AttnMode::sparse || automatic))
            attend_sparse(cfg, w, work, indexer_seconds);
        else
            attend_expanded(cfg, w, work, indexer_seconds);
    }

    if (spec.gated) {  // u = o ⊙ σ(W_g x), σ in fp32
        Tensor g = scratch(DType::f32, {n_tok, m.n_head * m.d_v});
        ops::linear(ctx, x, w.g_proj, g);
        ops::sigmoid_inplace(ctx, g);
        ops::mul_inplace(ctx, o, g);
    }
    ops::linear(ctx, o, w.o_proj, y);
    lora_forward(lora.o, batch, o, y);
    if (stats != nullptr) {
        stats->indexer_seconds += indexer_seconds;
        stats->attention_seconds += wall_seconds() - start - indexer_seconds;
    }
}

}  // namespace hymoe::model
