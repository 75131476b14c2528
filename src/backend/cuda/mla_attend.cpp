// The CUDA forms of ops::latent_append and ops::mla_attend (backend/ops_mla.h), moved here from
// the GPU model's attention block: always the absorbed (MQA) form, which spec/model-math.md §4
// shows equal to the expanded one (the CPU's prefill) to fp32 rounding, over the layer's device
// pages (f32 rows):
//   q̂_h = [W_kvb[h, :d_n]ᵀ q_n,h | q_r,h],  ō_h = softmax(τ q̂_h · [c_kv | k_r]ᵀ + mask) · c_kv,
//   o_h = W_kvb[h, d_n:] ō_h,
// with the keys of each query its visible ones (position + 1, its own included), for DSA only
// the indexer's top-k of them (ties to the smaller key, all of them when they are no more than
// top-k). With a fused plan (rows.indexer_plan, sparse_plan): every row in one indexer_topk over
// the pages and one mla_sparse over the selected rows (cuda_fused.h; bf16 operands, fp32 scores
// and softmax). Otherwise the single-row sequences (decode) in paged mla_decode launches (DSA:
// the top-k of indexer_decode_scores over the pages), and each longer sequence's chunk by two
// GEMMs over its gathered latent, all heads at once; both in groups (of sequences, or of a
// chunk's queries) whose scores stay under kMlaScoreFloats. The indexer's scores are reduced
// over tp (p.reduce) before any top-k.
#include <algorithm>
#include <utility>

#include "hymoe/backend/cuda_arena.h"
#include "hymoe/backend/cuda_fused.h"
#include "hymoe/backend/cuda_gemm.h"
#include "hymoe/backend/cuda_model_ops.h"
#include "hymoe/backend/cuda_ops.h"
#include "hymoe/backend/ops_mla.h"
#include "hymoe/core/error.h"
#include "hymoe/core/timer.h"

namespace hymoe::backend::cuda {

namespace {

// The indexer's scores summed over tp (p.reduce, when set) once the stream has written them: the
// reduction runs outside the stream (comm::), so the stream is waited for first.
void reduce_scores(const Stream& st, const ops::MlaAttendParams& p, Tensor& scores) {
    if (p.reduce.fn == nullptr)
        return;
    st.synchronize();
    p.reduce.fn(scores, p.reduce.arg);
}

using ops::MlaAttendParams;

struct Dims {
    int64_t H, d_n, d_r, d_v, r_kv, h_i, d_i;
    int64_t d_qk() const { return d_n + d_r; }
    int64_t d_lat() const { return r_kv + d_r; }
};

// `elements` elements into t's storage (sub-blocks of a row-major tensor for strided GEMMs).
void* at(const Tensor& t, int64_t elements) {
    return static_cast<char*>(t.data) + elements * static_cast<int64_t>(dtype_size(t.dtype));
}

Tensor device_view(void* p, Shape shape) {
    return Tensor{p, DType::f32, Device::cuda, std::move(shape)};
}

KvPages pages_of(const LatentCache& c) {
    HYMOE_CHECK(c.base != nullptr && c.dtype == DType::f32,
                "mla_attend: the device latent cache must be one f32 page block (a ",
                to_string(c.dtype),
                " view)");
    return {static_cast<float*>(c.base),
            c.page_stride,
            c.row_stride,
            c.page_tokens,
            c.block_table,
            c.max_pages};
}

// x itself when it is already of dtype `cd`, else a cast copy in s.
Tensor in_dtype(const Ctx& ctx, Scratch& s, const Tensor& x, DType cd) {
    if (x.dtype == cd)
        return x;
    Tensor c = s(cd, x.shape);
    cast(*ctx.stream, x, c);
    return c;
}

// The indexer's wall time around f when asked for (a synchronisation each side).
template <class F>
void indexer_timed(const Ctx& ctx, const MlaAttendParams& p, F&& f) {
    if (p.indexer_seconds)
        ctx.stream->synchronize();
    const double start = wall_seconds();
    f();
    if (p.indexer_seconds) {
        ctx.stream->synchronize();
        *p.indexer_seconds += wall_seconds() - start;
    }
}

// ō of the single-token rows: mla_decode over every such sequence's pages, in groups of sequences
// whose scores [group, H, keys] (and DSA's indexer scores [group, keys]) stay under the bound.
void attend_one_rows(const Ctx& ctx,
                     const MlaAttendParams& p,
                     const Tensor& q_hat,  // [n, H·d_lat]
                     Tensor& o_bar) {      // [n, H·r_kv]
    const Dims m{p.n_head, p.d_n, p.d_r, p.d_v, p.r_kv, p.idx_heads, p.idx_dim};
    const ops::MlaDeviceRows& r = *p.rows;
    const bool dsa = p.top_k > 0;
    const int64_t B = r.n_one, n_keys = r.one_max_keys, mp = p.caches[0].max_pages;
    const int64_t k_sel = dsa ? std::min<int64_t>(p.top_k, n_keys) : 0;
    const Stream& st = *ctx.stream;
    Scratch s(ctx);
    const Tensor one_rows{const_cast<int64_t*>(r.one_rows), DType::i64, Device::cuda, {B}};
    Tensor q1 = s(DType::f32, {B, m.H * m.d_lat()}), o1 = s(DType::f32, {B, m.H * m.r_kv});
    Tensor qi, wi;  // dsa: [B, H_I·d_I], [B, H_I] the indexer's queries and weights
    gather_rows(st, q_hat, one_rows, q1);
    if (dsa) {
        qi = s(DType::f32, {B, m.h_i * m.d_i});
        wi = s(DType::f32, {B, m.h_i});
        gather_rows(st, p.q_idx, one_rows, qi);
        gather_rows(st, p.w_idx, one_rows, wi);
    }
    const int64_t per_seq = dsa ? n_keys + m.H * k_sel : m.H * n_keys;  // score floats
    const int64_t group =
        std::clamp<int64_t>(ops::kMlaScoreFloats / std::max<int64_t>(per_seq, 1), 1, B);
    for (int64_t b0 = 0; b0 < B; b0 += group) {
        const int64_t nb = std::min(group, B - b0);
        Scratch sg(ctx);
        KvPages kv = pages_of(p.caches[0]);
        kv.block_table = r.one_table + b0 * mp;
        MlaDecodeParams d;
        d.n_seq = static_cast<int>(nb);
        d.n_head = static_cast<int>(m.H);
        d.r_kv = static_cast<int>(m.r_kv);
        d.d_r = static_cast<int>(m.d_r);
        d.tau = p.tau;
        d.q_hat = q1.ptr<float>() + b0 * m.H * m.d_lat();
        d.pages = kv.pages;
        d.page_stride = kv.page_stride;
        d.row_stride = kv.row_stride;
        d.page_tokens = kv.page_tokens;
        d.block_table = kv.block_table;
        d.max_pages = kv.max_pages;
        d.n_keys = r.one_keys + b0;
        d.max_keys = static_cast<int>(n_keys);
        d.o_bar = o1.ptr<float>() + b0 * m.H * m.r_kv;
        if (dsa) {  // each query's top-k keys by the indexer, read from the pages
            Tensor scores = sg(DType::f32, {nb, n_keys});
            Tensor idx = sg(DType::i64, {nb, k_sel}), sel = sg(DType::i32, {nb, k_sel});
            indexer_timed(ctx, p, [&] {
                IndexerDecode id;
                id.kv = kv;
                id.col = m.d_lat();
                id.n_seq = static_cast<int>(nb);
                id.n_head = static_cast<int>(m.h_i);
                id.head_dim = static_cast<int>(m.d_i);
                id.q = qi.ptr<float>() + b0 * m.h_i * m.d_i;
                id.w = wi.ptr<float>() + b0 * m.h_i;
                id.n_keys = d.n_keys;
                id.max_keys = n_keys;
                id.scores = scores.ptr<float>();
                indexer_decode_scores(st, id);
                reduce_scores(st, p, scores);
                top_k_rows(st, scores, k_sel, idx);
                narrow_indices(st, idx, sel);
            });
            d.selected = sel.ptr<int32_t>();
            d.n_selected = static_cast<int>(k_sel);
            d.max_keys = static_cast<int>(k_sel);
        }
        Tensor scores = sg(DType::f32, {nb, m.H, d.max_keys});
        d.scores = scores.ptr<float>();
        mla_decode(st, d);
    }
    scatter_rows(st, o1, one_rows, o_bar);
}

// ō of sequence `seq`'s rows (a chunk of n_q > 1 tokens after pos0 cached ones).
void attend_chunk(const Ctx& ctx,
                  const MlaAttendParams& p,
                  const Tensor& q_hat,  // [n, H·d_lat]
                  int64_t seq,
                  Tensor& o_bar) {  // [n, H·r_kv]
    const Dims m{p.n_head, p.d_n, p.d_r, p.d_v, p.r_kv, p.idx_heads, p.idx_dim};
    const bool dsa = p.top_k > 0;
    const int64_t row0 = p.offsets[seq], n_q = p.offsets[seq + 1] - row0, pos0 = p.pos0[seq];
    const int64_t n_k = pos0 + n_q;
    const Stream& st = *ctx.stream;
    const KvPages kv = pages_of(p.caches[0]);
    Scratch s(ctx);
    Tensor lat = s(DType::f32, {n_k, m.d_lat()});  // [n_k, r_kv + d_r] the sequence's keys
    kv_gather(st, kv, static_cast<int>(seq), n_k, 0, m.d_lat(), lat.ptr<float>());
    Tensor k_idx;  // [n_k, d_I] dsa
    if (dsa) {
        k_idx = s(DType::f32, {n_k, m.d_i});
        kv_gather(st, kv, static_cast<int>(seq), n_k, m.d_lat(), m.d_i, k_idx.ptr<float>());
    }
    const int64_t block = std::clamp<int64_t>(ops::kMlaScoreFloats / (m.H * n_k), 1, 65535);
    for (int64_t i0 = 0; i0 < n_q; i0 += block) {
        const int64_t n_b = std::min(block, n_q - i0), n_kb = pos0 + i0 + n_b;
        Scratch sb(ctx);
        Tensor scores = sb(DType::f32, {n_b, m.H, n_kb});  // [n_b, H, n_kb]
        ctx.blas->gemm(DType::f32,
                       DType::f32,
                       false,
                       true,
                       n_b * m.H,
                       n_kb,
                       m.d_lat(),
                       p.tau,
                       at(q_hat, (row0 + i0) * m.H * m.d_lat()),
                       m.d_lat(),
                       lat.data,
                       m.d_lat(),
                       0.0f,
                       scores.data,
                       n_kb);
        Tensor mask;  // [n_b, n_kb] dsa: 0 at each query's top-k keys, −inf elsewhere
        if (dsa) {
            Tensor index = sb(DType::f32, {n_b, n_kb});
            Tensor kept = sb(DType::i64, {n_b, std::min<int64_t>(p.top_k, n_kb)});
            mask = sb(DType::f32, {n_b, n_kb});
            indexer_timed(ctx, p, [&] {
                indexer_scores(
                    st,
                    device_view(at(p.q_idx, (row0 + i0) * m.h_i * m.d_i), {n_b, m.h_i * m.d_i}),
                    device_view(at(p.w_idx, (row0 + i0) * m.h_i), {n_b, m.h_i}),
                    k_idx.rows(0, n_kb),
                    index);
                reduce_scores(st, p, index);
                indexer_mask(st, index, pos0 + i0, p.top_k, kept, mask);
            });
        }
        causal_softmax(st, scores, m.H, pos0 + i0, dsa ? &mask : nullptr);
        ctx.blas->gemm(DType::f32,
                       DType::f32,
                       false,
                       false,
                       n_b * m.H,
                       m.r_kv,
                       n_kb,
                       1.0f,
                       scores.data,
                       n_kb,
                       lat.data,
                       m.d_lat(),
                       0.0f,
                       at(o_bar, (row0 + i0) * m.H * m.r_kv),
                       m.r_kv);
    }
}

// ō of every row at once (DSA, fused kernels): indexer_topk ranks each row's visible keys (the
// indexer keys at column d_lat of the layer's page rows) and keeps its top-k, then mla_sparse
// attends to those latent rows.
void attend_fused(const Ctx& ctx,
                  const MlaAttendParams& p,
                  const Tensor& q_hat,  // [n, H·d_lat]
                  Tensor& o_bar) {      // [n, H·r_kv]
    const Dims m{p.n_head, p.d_n, p.d_r, p.d_v, p.r_kv, p.idx_heads, p.idx_dim};
    const ops::MlaDeviceRows& r = *p.rows;
    const IndexerPlan& plan = *r.indexer_plan;
    const int n = static_cast<int>(p.o.dim(0));
    const KvPages kv = pages_of(p.caches[0]);
    auto columns_from = [&](int64_t col) {  // the layer's page rows from column col on
        PagedRows rows;
        rows.rows = kv.pages + col;
        rows.dtype = DType::f32;
        rows.row_stride = kv.row_stride;
        rows.page_stride = kv.page_stride;
        rows.page_tokens = kv.page_tokens;
        rows.block_table = kv.block_table;
        rows.max_pages = kv.max_pages;
        return rows;
    };
    Scratch s(ctx);
    Tensor idx = s(DType::i32, {n, r.fused_top_k});  // [n, top_k] keys best first, −1 after
    Tensor scratch;                                  // the indexer's split candidates
    if (plan.scratch_bytes > 0)
        scratch = s(DType::i32, {(plan.scratch_bytes + 3) / 4});
    indexer_timed(ctx, p, [&] {
        IndexerTopkParams ip;
        ip.n_q = n;
        ip.n_head = static_cast<int>(m.h_i);
        ip.d = static_cast<int>(m.d_i);
        ip.top_k = r.fused_top_k;
        ip.q_dtype = DType::f32;
        ip.q = p.q_idx.data;
        ip.w = p.w_idx.ptr<float>();
        ip.visible = r.visible;
        // two queries a block share the block table's row 0 (one sequence), else each its own
        ip.seq = plan.queries_per_block == 1 ? r.row_seq : nullptr;
        ip.keys = columns_from(m.d_lat());
        ip.idx = idx.ptr<int32_t>();
        ip.scratch = scratch.data;
        indexer_topk(*ctx.stream, ip, plan);
    });
    MlaSparseParams ap;
    ap.n_q = n;
    ap.n_head = static_cast<int>(m.H);
    ap.r_kv = static_cast<int>(m.r_kv);
    ap.d_r = static_cast<int>(m.d_r);
    ap.tau = p.tau;
    ap.q_hat = q_hat.ptr<float>();
    ap.cache = columns_from(0);
    ap.seq = r.row_seq;
    ap.visible = r.visible;
    ap.selected = idx.ptr<int32_t>();
    ap.n_selected = r.fused_top_k;
    ap.o_bar = o_bar.ptr<float>();
    mla_sparse(*ctx.stream, ap, *r.sparse_plan);
}

}  // namespace

void latent_append(const Ctx& ctx,
                   const LatentCache& cache,
                   const Tensor& row_seq,
                   const Tensor& pos,
                   const Tensor& c_kv,
                   const Tensor& k_r,
                   const Tensor& k_idx) {
    kv_append(*ctx.stream,
              pages_of(cache),
              c_kv.dim(0),
              row_seq.ptr<int32_t>(),
              pos.ptr<int64_t>(),
              c_kv.ptr<float>(),
              static_cast<int>(cache.r_kv),
              k_r.ptr<float>(),
              static_cast<int>(cache.d_r),
              k_idx.data != nullptr ? k_idx.ptr<float>() : nullptr,
              static_cast<int>(cache.d_i));
}

void mla_attend(const Ctx& ctx, const MlaAttendParams& p) {
    HYMOE_CHECK(p.rows != nullptr && p.caches != nullptr,
                "mla_attend: a CUDA call needs its rows on the device and its pages");
    const Dims m{p.n_head, p.d_n, p.d_r, p.d_v, p.r_kv, p.idx_heads, p.idx_dim};
    const int64_t n = p.o.dim(0), H = m.H;
    const DType cd = p.kv_b.dtype;  // the products' operand dtype
    const Stream& st = *ctx.stream;
    Scratch s(ctx);
    // q̂ [n, H, d_lat]: q̂_h = [W_kvb[h, :d_n]ᵀ q_n,h | q_r,h]
    const Tensor qc = in_dtype(ctx, s, p.q, cd);
    Tensor q_hat = s(DType::f32, {n, H * m.d_lat()});
    for (int64_t h = 0; h < H; ++h)
        ctx.blas->gemm(cd,
                       DType::f32,
                       false,
                       false,
                       n,
                       m.r_kv,
                       m.d_n,
                       1.0f,
                       at(qc, h * m.d_qk()),
                       H * m.d_qk(),
                       at(p.kv_b, h * (m.d_n + m.d_v) * m.r_kv),
                       m.r_kv,
                       0.0f,
                       at(q_hat, h * m.d_lat()),
                       H * m.d_lat());
    copy_2d(st, DType::f32, at(p.q, m.d_n), m.d_qk(), at(q_hat, m.r_kv), m.d_lat(), n * H, m.d_r);

    // ō [n, H, r_kv] over each query's keys
    Tensor o_bar = s(DType::f32, {n, H * m.r_kv});
    const bool fused = p.rows->indexer_plan != nullptr && p.rows->sparse_plan != nullptr &&
                       p.reduce.fn == nullptr;  // under tp the scores are summed before a top-k
    if (fused) {
        attend_fused(ctx, p, q_hat, o_bar);
    } else {
        if (p.rows->n_one > 0)
            attend_one_rows(ctx, p, q_hat, o_bar);
        for (int64_t seq = 0; seq < p.n_seq; ++seq)
            if (p.offsets[seq + 1] - p.offsets[seq] > 1)
                attend_chunk(ctx, p, q_hat, seq, o_bar);
    }

    // o_h = W_kvb[h, d_n:] ō_h
    const Tensor obc = in_dtype(ctx, s, o_bar, cd);
    for (int64_t h = 0; h < H; ++h)
        ctx.blas->gemm(cd,
                       DType::f32,
                       false,
                       true,
                       n,
                       m.d_v,
                       m.r_kv,
                       1.0f,
                       at(obc, h * m.r_kv),
                       H * m.r_kv,
                       at(p.kv_b, (h * (m.d_n + m.d_v) + m.d_n) * m.r_kv),
                       m.r_kv,
                       0.0f,
                       at(p.o, h * m.d_v),
                       H * m.d_v);
}

}  // namespace hymoe::backend::cuda
