// The CPU form of the MLA/DSA attention over the latent cache (backend/ops_mla.h), moved here
// from model/attention.cpp unchanged: per sequence, over its whole cache in blocks of queries.
// Query i of a sequence (position p = pos0 + i) sees keys 0..p; a block of queries is given only
// the keys its last query can see, so scratch stays [block, n_k]. A DSA prefill attends
// sparsely: each query over its own top-k keys only. And the CPU latent_append.
#include <algorithm>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_attention.h"
#include "hymoe/backend/ops_mla.h"
#include "hymoe/core/error.h"
#include "hymoe/core/timer.h"

namespace hymoe::ops {

namespace {

using backend::LatentCol;

constexpr int64_t query_block = kMlaQueryBlock;

// The MLA widths of a call.
struct Dims {
    int64_t n_head, d_n, d_r, d_v, r_kv;
    int64_t d_qk() const { return d_n + d_r; }    // per-head query width
    int64_t d_kvb() const { return d_n + d_v; }   // per-head rows of kv_b_proj
    int64_t d_lat() const { return r_kv + d_r; }  // cached latent entry [c_kv | k_r]
};
Dims dims_of(const MlaAttendParams& p) {
    return {p.n_head, p.d_n, p.d_r, p.d_v, p.r_kv};
}

// A view of host fp32 memory (read-only where the pointer is const: the view type is not).
Tensor view_of(const float* p, Shape shape) {
    return Tensor{const_cast<float*>(p), DType::f32, Device::cpu, std::move(shape)};
}

// A sequence's cached rows (block-table row 0 of its view): single rows where they lie (a page
// or the planes), and whole columns made contiguous on first use (paged caches gather them once
// per call), so a DSA decode token copies only its indexer keys and its top-k rows, not the whole
// cache.
class CacheRows {
public:
    CacheRows(const LatentCache& cache, int64_t n) : c_(cache), n_(n) {}
    int64_t n() const { return n_; }
    // row u's c_kv [r_kv] and k_r [d_r] into out
    void c_kv_row(int64_t u, float* out) const {
        backend::latent_read(c_, 0, u, LatentCol::c_kv, out);
    }
    void k_r_row(int64_t u, float* out) const {
        backend::latent_read(c_, 0, u, LatentCol::k_r, out);
    }
    const float* c_kv_all() const { return all(c_kv_, LatentCol::c_kv); }     // [n, r_kv]
    const float* k_r_all() const { return all(k_r_, LatentCol::k_r); }        // [n, d_r]
    const float* k_idx_all() const { return all(k_idx_, LatentCol::k_idx); }  // [n, d_I]
    // The indexer keys run in bf16 when they are cached in bf16 (a bf16 pool).
    bool bf16_indexer() const { return c_.paged() && c_.dtype == DType::bf16; }
    // The cached indexer keys [n, d_I] in bf16 tiles (bf16_indexer() only), packed on first use.
    const ops::IndexerKeys& k_idx_bf16() const {
        if (!k_idx_tiles_) {
            k_idx_tiles_.emplace(n_, c_.d_i);
            for (int64_t u = 0; u < n_; ++u)
                k_idx_tiles_->put(
                    u,
                    static_cast<const uint16_t*>(backend::latent_at(c_, 0, u, LatentCol::k_idx)));
        }
        return *k_idx_tiles_;
    }

private:
    const float* all(std::vector<float>& gathered, LatentCol col) const {
        if (!c_.paged())
            return c_.planes[static_cast<int>(col)];
        const int64_t width = backend::latent_col_width(c_, col);
        if (gathered.empty() && n_ > 0) {
            gathered.resize(static_cast<size_t>(n_ * width));
            for (int64_t u = 0; u < n_; ++u)
                backend::latent_read(c_, 0, u, col, gathered.data() + u * width);
        }
        return gathered.data();
    }

    const LatentCache& c_;
    int64_t n_;
    mutable std::vector<float> c_kv_, k_r_, k_idx_;  // gathered columns of a paged cache
    mutable std::optional<ops::IndexerKeys> k_idx_tiles_;
};

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
    const float* q_idx = nullptr;  // [n_q, H_I·d_I] indexer queries (dsa), else null
    const float* w_idx = nullptr;  // [n_q, H_I] indexer head weights (dsa)
};

// The indexer scores of the query block [i0, i0 + n_b) over its n_kb = pos0 + i0 + n_b visible
// keys, summed over the tp ranks' heads.
void block_scores(const MlaAttendParams& p, const SeqWork& s, int64_t i0, Tensor& scores) {
    const int64_t n_b = scores.dim(0), n_kb = scores.dim(1);
    const int64_t h_i = p.idx_heads, d_i = p.idx_dim;
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
    if (p.reduce.fn != nullptr)
        p.reduce.fn(scores, p.reduce.arg);  // Σ over every rank's heads
}

// The mask of the query block [i0, i0 + n_b) over its n_kb = pos0 + i0 + n_b visible keys.
void block_mask(const MlaAttendParams& p,
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
    block_scores(p, s, i0, scores.view());
    ops::indexer_mask(scores.view(), s.pos0 + i0, p.top_k, mask);
}

// MHA form: k_h = [k_n,h | k_r], v_h up-projected from every cached c_kv.
void attend_expanded(const MlaAttendParams& p, const SeqWork& s, double& indexer_seconds) {
    const Dims m = dims_of(p);
    const int64_t n_k = s.cache->n(), n_head = m.n_head;
    const float tau = p.tau;
    Buffer kvb(DType::f32, {n_k, n_head * m.d_kvb()});
    ops::linear(view_of(s.cache->c_kv_all(), {n_k, m.r_kv}), p.kv_b, kvb.view());
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
        block_mask(p, s, i0, mask.view(), indexer_seconds);
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
void attend_absorbed(const MlaAttendParams& p, const SeqWork& s, double& indexer_seconds) {
    const Dims m = dims_of(p);
    const int64_t n_head = m.n_head;
    const float tau = p.tau;
    const ops::WeightRef w_kvb = ops::weight_ref(p.kv_b);  // [H, d_n + d_v, r_kv]
    const int64_t ld_q = n_head * m.d_qk(), ld_o = n_head * m.d_v;
    for (int64_t i0 = 0; i0 < s.n_q; i0 += query_block) {
        const int64_t n_b = std::min(query_block, s.n_q - i0), n_kb = s.pos0 + i0 + n_b;
        Buffer full_mask(DType::f32, {n_b, n_kb}), q_hat(DType::f32, {n_b, m.d_lat()});
        Buffer o_bar(DType::f32, {n_b, m.r_kv});
        block_mask(p, s, i0, full_mask.view(), indexer_seconds);
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
void attend_sparse(const MlaAttendParams& p, const SeqWork& s, double& indexer_seconds) {
    const Dims m = dims_of(p);
    const int64_t n_head = m.n_head, d_lat = m.d_lat(), top_k = p.top_k;
    const float tau = p.tau;
    const ops::WeightRef w_kvb = ops::weight_ref(p.kv_b);  // [H, d_n + d_v, r_kv]
    const int64_t ld_q = n_head * m.d_qk(), ld_o = n_head * m.d_v;
    const int64_t rows = std::min(query_block, s.n_q);  // a block's queries, at most
    Buffer q_hat(DType::f32, {rows, n_head, d_lat});
    Buffer o_bar(DType::f32, {rows, n_head, m.r_kv});
    Buffer lat(DType::f32, {top_k, d_lat});  // [n_i, d_lat] a query's gathered rows
    std::vector<float> probs(static_cast<size_t>(n_head * top_k));  // [H, n_i]
    std::vector<int64_t> keep(static_cast<size_t>(rows * top_k)), n_keep(rows);
    for (int64_t i0 = 0; i0 < s.n_q; i0 += query_block) {
        const int64_t n_b = std::min(query_block, s.n_q - i0), n_kb = s.pos0 + i0 + n_b;
        {
            ScopedTimer timer(indexer_seconds);
            Buffer scores(DType::f32, {n_b, n_kb});
            block_scores(p, s, i0, scores.view());
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
                      probs.data(),
                      n_i);
            ops::softmax_rows(probs.data(), n_head, n_i);
            ops::gemm(false,
                      false,
                      n_head,
                      m.r_kv,
                      n_i,
                      1.0f,
                      probs.data(),
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

}  // namespace

void latent_append(const LatentCache& cache,
                   const int32_t* row_seq,
                   const int64_t* pos,
                   const Tensor& c_kv,
                   const Tensor& k_r,
                   const Tensor& k_idx) {
    const int64_t n = c_kv.dim(0);
    for (int64_t t = 0; t < n; ++t) {
        backend::latent_write(
            cache, row_seq[t], pos[t], LatentCol::c_kv, c_kv.ptr<float>() + t * cache.r_kv);
        backend::latent_write(
            cache, row_seq[t], pos[t], LatentCol::k_r, k_r.ptr<float>() + t * cache.d_r);
        if (k_idx.data != nullptr)
            backend::latent_write(
                cache, row_seq[t], pos[t], LatentCol::k_idx, k_idx.ptr<float>() + t * cache.d_i);
    }
}

void mla_attend(const MlaAttendParams& p) {
    const Dims m = dims_of(p);
    const bool dsa = p.top_k > 0;
    double unused = 0;
    double& indexer_seconds = p.indexer_seconds ? *p.indexer_seconds : unused;
    for (int64_t s = 0; s < p.n_seq; ++s) {
        const int64_t row0 = p.offsets[s], n_q = p.offsets[s + 1] - row0;
        if (n_q == 0)
            continue;
        const CacheRows rows(p.caches[s], p.pos0[s] + n_q);
        SeqWork work;
        work.q = p.q.ptr<float>() + row0 * m.n_head * m.d_qk();
        work.o = p.o.ptr<float>() + row0 * m.n_head * m.d_v;
        work.n_q = n_q;
        work.pos0 = p.pos0[s];
        work.cache = &rows;
        if (dsa) {
            work.q_idx = p.q_idx.ptr<float>() + row0 * p.idx_heads * p.idx_dim;
            work.w_idx = p.w_idx.ptr<float>() + row0 * p.idx_heads;
        }
        const bool automatic = p.form == MlaForm::automatic || (p.form == MlaForm::sparse && !dsa);
        if (p.form == MlaForm::absorbed || (automatic && n_q == 1))
            attend_absorbed(p, work, indexer_seconds);
        else if (dsa && (p.form == MlaForm::sparse || automatic))
            attend_sparse(p, work, indexer_seconds);
        else
            attend_expanded(p, work, indexer_seconds);
    }
}

}  // namespace hymoe::ops
