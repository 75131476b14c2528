// The MLA/DSA block on the GPU (device_blocks.h attention_block), model::attention_forward in its
// absorbed (MQA) form, which spec/model-math.md §4 shows equal to the expanded one (the CPU's
// prefill) to fp32 rounding. Projections of every new token at once (query, latent c_kv and rope
// key k_r, the indexer's q, k, w), the new rows appended to the layer's device pages, then
//   q̂_h = [W_kvb[h, :d_n]ᵀ q_n,h | q_r,h],  ō_h = softmax(τ q̂_h · [c_kv | k_r]ᵀ + mask) · c_kv,
//   o_h = W_kvb[h, d_n:] ō_h,  y = o_proj(concat_h o_h [⊙ σ(W_g x)]),
// with the keys of each query its visible ones (position + 1, its own included), for DSA only the
// indexer's top-k of them (ops::indexer_mask: ties to the smaller key, all of them when they
// are no more than top-k). DSA with the fused kernels (step.fused, bf16, sizes their plans take,
// model/fused_step.h): every row of the step in one indexer_topk over the pages and one
// mla_sparse over the selected rows (cuda_fused.h; bf16 operands, fp32 scores and softmax).
// Otherwise the generic ops: single-token rows (decode) of all sequences in paged launches
// (cuda_ops.h mla_decode; DSA: the top-k of the indexer's scores over the pages), and each
// prefill chunk by two GEMMs over its sequence's gathered latent, all heads at once; both in
// groups (of sequences, or of a chunk's queries) whose scores stay under kScoreFloats (DSA: the
// indexer mask of ops::indexer_mask per block of queries).
#include <algorithm>
#include <cmath>

#include "device_blocks.h"
#include "hymoe/backend/cuda_ops.h"
#include "hymoe/core/timer.h"
#include "hymoe/model/fused_step.h"

namespace hymoe::model::gpu {

namespace {

// The sizes of model/mla_project.h, as int64.
struct Dims {
    int64_t d, H, d_n, d_r, d_v, r_q, r_kv, h_i, d_i;
    int64_t d_qk() const { return d_n + d_r; }
    int64_t d_lat() const { return r_kv + d_r; }
};

Dims dims_of(const ModelConfig& cfg) {
    const MlaConfig& c = cfg.mla;
    return {cfg.hidden_size,
            c.n_head,
            c.qk_nope_head_dim,
            c.qk_rope_head_dim,
            c.v_head_dim,
            c.q_lora_rank,
            c.kv_lora_rank,
            cfg.indexer.n_head,
            cfg.indexer.head_dim};
}

Tensor device_view(void* p, Shape shape) {
    return Tensor{p, DType::f32, Device::cuda, std::move(shape)};
}

// The new tokens' projections (model/mla_project.cpp and model/indexer.cpp).
struct Projected {
    Tensor q;      // [n, H·d_qk] per head [q_n | q_r], q_r rotated
    Tensor c_kv;   // [n, r_kv] after kv_a_layernorm
    Tensor k_r;    // [n, d_r] rotated
    Tensor q_idx;  // [n, H_I·d_I] dsa: indexer queries, rotate-half RoPE on the first d_r
    Tensor k_idx;  // [n, d_I] dsa: LayerNorm(wk x), RoPE
    Tensor w_idx;  // [n, H_I] dsa: weights_proj x · scale_heads^{-1/2} · d_I^{-1/2}
};

Projected project(Gpu& g,
                  Scratch& s,
                  const ModelConfig& cfg,
                  bool dsa,
                  const MlaW& w,
                  const Tensor& xc,
                  const StepBatch& step,
                  DType cd,
                  double* indexer_seconds) {
    const Dims m = dims_of(cfg);
    const int64_t n = step.n_tok;
    const cu::Stream& st = g.stream;
    const float eps = static_cast<float>(cfg.mla.norm_eps);
    const int64_t* pos = step.positions.ptr<int64_t>();
    const ops::RopeFreqs freqs = mla_rope_freqs(cfg.mla);
    Projected p;
    p.q = s(DType::f32, {n, m.H * m.d_qk()});
    Tensor cqc;  // [n, r_q] c_q in cd: the query latent the indexer reads too
    if (m.r_q > 0) {
        Tensor c_q = s(DType::f32, {n, m.r_q});
        g.blas.linear(xc, w.q_a, c_q);
        cu::rms_norm(st, c_q, w.q_a_norm, eps, c_q);
        cqc = in_dtype(g, s, c_q, cd);
        g.blas.linear(cqc, w.q_b, p.q);
        lora_apply(g, w.lora.q, step.lora.rows, c_q, p.q);
    } else {
        g.blas.linear(xc, w.q, p.q);
        lora_apply(g, w.lora.q, step.lora.rows, xc, p.q);
    }
    p.c_kv = s(DType::f32, {n, m.r_kv});
    p.k_r = s(DType::f32, {n, m.d_r});
    g.blas.gemm(cd,
                DType::f32,
                false,
                true,
                n,
                m.r_kv,
                m.d,
                1.0f,
                xc.data,
                m.d,
                w.kv_a.data,
                m.d,
                0.0f,
                p.c_kv.data,
                m.r_kv);
    g.blas.gemm(cd,
                DType::f32,
                false,
                true,
                n,
                m.d_r,
                m.d,
                1.0f,
                xc.data,
                m.d,
                at(w.kv_a, m.r_kv * m.d),
                m.d,
                0.0f,
                p.k_r.data,
                m.d_r);
    // kv_a's adapter: its B rows [0, r_kv) onto c_kv, [r_kv, r_kv + d_r) onto k_r
    lora_apply(g, w.lora.kv, step.lora.rows, xc, p.c_kv, 0, 0, m.r_kv);
    lora_apply(g, w.lora.kv, step.lora.rows, xc, p.k_r, 0, m.r_kv, m.d_r);
    cu::rms_norm(st, p.c_kv, w.kv_a_norm, eps, p.c_kv);
    if (!cfg.mla.nope) {
        cu::rope(
            st, DType::f32, at(p.q, m.d_n), n, m.H, m.H * m.d_qk(), m.d_qk(), pos, freqs, true);
        cu::rope(st, DType::f32, p.k_r.data, n, 1, m.d_r, m.d_r, pos, freqs, true);
    }
    if (!dsa)
        return p;
    if (indexer_seconds)
        st.synchronize();
    const double start = wall_seconds();
    const IndexerW& iw = w.indexer;
    p.q_idx = s(DType::f32, {n, m.h_i * m.d_i});
    p.k_idx = s(DType::f32, {n, m.d_i});
    p.w_idx = s(DType::f32, {n, m.h_i});
    g.blas.linear(cqc, iw.wq_b, p.q_idx);
    g.blas.linear(xc, iw.wk, p.k_idx);
    cu::layer_norm(st, p.k_idx, iw.k_norm_w, iw.k_norm_b, 1e-6f, p.k_idx);
    cu::rope(st, DType::f32, p.q_idx.data, n, m.h_i, m.h_i * m.d_i, m.d_i, pos, freqs, false);
    cu::rope(st, DType::f32, p.k_idx.data, n, 1, m.d_i, m.d_i, pos, freqs, false);
    g.blas.linear(xc, iw.weights_proj, p.w_idx);
    const int64_t scale_heads = cfg.indexer.scale_heads > 0 ? cfg.indexer.scale_heads : m.h_i;
    cu::scale_inplace(
        st, p.w_idx, static_cast<float>(1.0 / std::sqrt(static_cast<double>(scale_heads * m.d_i))));
    if (indexer_seconds) {
        st.synchronize();
        *indexer_seconds += wall_seconds() - start;
    }
    return p;
}

// ō of the single-token rows: mla_decode over every such sequence's pages, in groups of sequences
// whose scores [group, H, keys] (and DSA's indexer scores [group, keys]) stay under kScoreFloats.
void attend_one_rows(Gpu& g,
                     const ModelConfig& cfg,
                     bool dsa,
                     const Projected& p,
                     const Tensor& q_hat,  // [n, H·d_lat]
                     const StepBatch& step,
                     int layer,
                     Tensor& o_bar) {  // [n, H·r_kv]
    const Dims m = dims_of(cfg);
    const int64_t B = step.n_one, n_keys = step.one_max_keys, mp = step.max_pages;
    const int64_t k_sel = dsa ? std::min<int64_t>(cfg.indexer.top_k, n_keys) : 0;
    const cu::Stream& st = g.stream;
    Scratch s(g.arena);
    Tensor q1 = s(DType::f32, {B, m.H * m.d_lat()}), o1 = s(DType::f32, {B, m.H * m.r_kv});
    Tensor qi, wi;  // dsa: [B, H_I·d_I], [B, H_I] the indexer's queries and weights
    cu::gather_rows(st, q_hat, step.one_rows, q1);
    if (dsa) {
        qi = s(DType::f32, {B, m.h_i * m.d_i});
        wi = s(DType::f32, {B, m.h_i});
        cu::gather_rows(st, p.q_idx, step.one_rows, qi);
        cu::gather_rows(st, p.w_idx, step.one_rows, wi);
    }
    const int64_t per_seq = dsa ? n_keys + m.H * k_sel : m.H * n_keys;  // score floats
    const int64_t group = std::clamp<int64_t>(kScoreFloats / std::max<int64_t>(per_seq, 1), 1, B);
    for (int64_t b0 = 0; b0 < B; b0 += group) {
        const int64_t nb = std::min(group, B - b0);
        Scratch sg(g.arena);
        cu::KvPages kv = step.pages_of(layer);
        kv.block_table = step.one_table.ptr<int32_t>() + b0 * mp;
        cu::MlaDecodeParams d;
        d.n_seq = static_cast<int>(nb);
        d.n_head = static_cast<int>(m.H);
        d.r_kv = static_cast<int>(m.r_kv);
        d.d_r = static_cast<int>(m.d_r);
        d.tau = static_cast<float>(mla_softmax_scale(cfg.mla));
        d.q_hat = q1.ptr<float>() + b0 * m.H * m.d_lat();
        d.pages = kv.pages;
        d.page_stride = kv.page_stride;
        d.row_stride = kv.row_stride;
        d.page_tokens = kv.page_tokens;
        d.block_table = kv.block_table;
        d.max_pages = kv.max_pages;
        d.n_keys = step.one_keys.ptr<int32_t>() + b0;
        d.max_keys = static_cast<int>(n_keys);
        d.o_bar = o1.ptr<float>() + b0 * m.H * m.r_kv;
        if (dsa) {  // each query's top-k keys by the indexer, read from the pages
            Tensor scores = sg(DType::f32, {nb, n_keys});
            cu::IndexerDecode id;
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
            cu::indexer_decode_scores(st, id);
            Tensor idx = sg(DType::i64, {nb, k_sel}), sel = sg(DType::i32, {nb, k_sel});
            cu::top_k_rows(st, scores, k_sel, idx);
            cu::narrow_indices(st, idx, sel);
            d.selected = sel.ptr<int32_t>();
            d.n_selected = static_cast<int>(k_sel);
            d.max_keys = static_cast<int>(k_sel);
        }
        Tensor scores = sg(DType::f32, {nb, m.H, d.max_keys});
        d.scores = scores.ptr<float>();
        cu::mla_decode(st, d);
    }
    cu::scatter_rows(st, o1, step.one_rows, o_bar);
}

// ō of sequence `seq`'s rows (a prefill chunk of n_q > 1 tokens after pos0 cached ones).
void attend_chunk(Gpu& g,
                  const ModelConfig& cfg,
                  bool dsa,
                  const Projected& p,
                  const Tensor& q_hat,  // [n, H·d_lat]
                  const StepBatch& step,
                  int layer,
                  int64_t seq,
                  Tensor& o_bar) {  // [n, H·r_kv]
    const Dims m = dims_of(cfg);
    const SeqBatch& batch = *step.batch;
    const int64_t row0 = batch.offsets[seq], n_q = batch.length(seq), pos0 = batch.pos0[seq];
    const int64_t n_k = pos0 + n_q;
    const float tau = static_cast<float>(mla_softmax_scale(cfg.mla));
    const cu::Stream& st = g.stream;
    const cu::KvPages kv = step.pages_of(layer);
    Scratch s(g.arena);
    Tensor lat = s(DType::f32, {n_k, m.d_lat()});  // [n_k, r_kv + d_r] the sequence's keys
    cu::kv_gather(st, kv, static_cast<int>(seq), n_k, 0, m.d_lat(), lat.ptr<float>());
    Tensor k_idx;  // [n_k, d_I] dsa
    if (dsa) {
        k_idx = s(DType::f32, {n_k, m.d_i});
        cu::kv_gather(st, kv, static_cast<int>(seq), n_k, m.d_lat(), m.d_i, k_idx.ptr<float>());
    }
    const int64_t block = std::clamp<int64_t>(kScoreFloats / (m.H * n_k), 1, 65535);
    for (int64_t i0 = 0; i0 < n_q; i0 += block) {
        const int64_t n_b = std::min(block, n_q - i0), n_kb = pos0 + i0 + n_b;
        Scratch sb(g.arena);
        Tensor scores = sb(DType::f32, {n_b, m.H, n_kb});  // [n_b, H, n_kb]
        g.blas.gemm(DType::f32,
                    DType::f32,
                    false,
                    true,
                    n_b * m.H,
                    n_kb,
                    m.d_lat(),
                    tau,
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
            Tensor kept = sb(DType::i64, {n_b, std::min<int64_t>(cfg.indexer.top_k, n_kb)});
            mask = sb(DType::f32, {n_b, n_kb});
            cu::indexer_scores(
                st,
                device_view(at(p.q_idx, (row0 + i0) * m.h_i * m.d_i), {n_b, m.h_i * m.d_i}),
                device_view(at(p.w_idx, (row0 + i0) * m.h_i), {n_b, m.h_i}),
                k_idx.rows(0, n_kb),
                index);
            cu::indexer_mask(st, index, pos0 + i0, cfg.indexer.top_k, kept, mask);
        }
        cu::causal_softmax(st, scores, m.H, pos0 + i0, dsa ? &mask : nullptr);
        g.blas.gemm(DType::f32,
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

// The most keys a row of the step sees: the longest sequence's length after the step.
int64_t max_visible(const StepBatch& step) {
    const SeqBatch& batch = *step.batch;
    int64_t most = 0;
    for (int64_t q = 0; q < step.n_seq; ++q)
        most = std::max(most, batch.pos0[q] + batch.length(q));
    return most;
}

// ō of every row of the step at once (DSA, fused kernels): indexer_topk ranks each row's visible
// keys (the indexer keys at column d_lat of the layer's page rows) and keeps its top-k, then
// mla_sparse attends to those latent rows. The indexer's time goes to indexer_seconds.
void attend_fused(Gpu& g,
                  const ModelConfig& cfg,
                  const DsaFusedPlan& plan,
                  const Projected& p,
                  const Tensor& q_hat,  // [n, H·d_lat]
                  const StepBatch& step,
                  int layer,
                  Tensor& o_bar,  // [n, H·r_kv]
                  double* indexer_seconds) {
    const Dims m = dims_of(cfg);
    const int n = static_cast<int>(step.n_tok);
    const cu::Stream& st = g.stream;
    const cu::KvPages kv = step.pages_of(layer);
    auto columns_from = [&](int64_t col) {  // the layer's page rows from column col on
        cu::PagedRows r;
        r.rows = kv.pages + col;
        r.dtype = DType::f32;
        r.row_stride = kv.row_stride;
        r.page_stride = kv.page_stride;
        r.page_tokens = kv.page_tokens;
        r.block_table = kv.block_table;
        r.max_pages = kv.max_pages;
        return r;
    };
    Scratch s(g.arena);
    Tensor idx = s(DType::i32, {n, plan.top_k});  // [n, top_k] keys best first, −1 after
    Tensor scratch;                               // the indexer's split candidates
    if (plan.indexer.scratch_bytes > 0)
        scratch = s(DType::i32, {(plan.indexer.scratch_bytes + 3) / 4});
    if (indexer_seconds)
        st.synchronize();
    const double start = wall_seconds();
    cu::IndexerTopkParams ip;
    ip.n_q = n;
    ip.n_head = static_cast<int>(m.h_i);
    ip.d = static_cast<int>(m.d_i);
    ip.top_k = plan.top_k;
    ip.q_dtype = DType::f32;
    ip.q = p.q_idx.data;
    ip.w = p.w_idx.ptr<float>();
    ip.visible = step.visible.ptr<int32_t>();
    // two queries a block share the block table's row 0 (one sequence), else each its own row
    ip.seq = plan.indexer.queries_per_block == 1 ? step.row_seq.ptr<int32_t>() : nullptr;
    ip.keys = columns_from(m.d_lat());
    ip.idx = idx.ptr<int32_t>();
    ip.scratch = scratch.data;
    cu::indexer_topk(st, ip, plan.indexer);
    if (indexer_seconds) {
        st.synchronize();
        *indexer_seconds += wall_seconds() - start;
    }
    cu::MlaSparseParams ap;
    ap.n_q = n;
    ap.n_head = static_cast<int>(m.H);
    ap.r_kv = static_cast<int>(m.r_kv);
    ap.d_r = static_cast<int>(m.d_r);
    ap.tau = static_cast<float>(mla_softmax_scale(cfg.mla));
    ap.q_hat = q_hat.ptr<float>();
    ap.cache = columns_from(0);
    ap.seq = step.row_seq.ptr<int32_t>();
    ap.visible = step.visible.ptr<int32_t>();
    ap.selected = idx.ptr<int32_t>();
    ap.n_selected = plan.top_k;
    ap.o_bar = o_bar.ptr<float>();
    cu::mla_sparse(st, ap, plan.attention);
}

}  // namespace

void attention_block(Gpu& g,
                     const ModelConfig& cfg,
                     const LayerSpec& spec,
                     const MlaW& w,
                     const Tensor& x,
                     const StepBatch& step,
                     int layer,
                     DType cd,
                     Tensor& y,
                     double* indexer_seconds) {
    const Dims m = dims_of(cfg);
    const int64_t n = step.n_tok, H = m.H;
    const bool dsa = spec.mixer == Mixer::dsa;
    const cu::Stream& st = g.stream;
    Scratch s(g.arena);
    const Tensor xc = in_dtype(g, s, x, cd);
    const Projected p = project(g, s, cfg, dsa, w, xc, step, cd, indexer_seconds);
    cu::kv_append(st,
                  step.pages_of(layer),
                  n,
                  step.row_seq.ptr<int32_t>(),
                  step.positions.ptr<int64_t>(),
                  p.c_kv.ptr<float>(),
                  static_cast<int>(m.r_kv),
                  p.k_r.ptr<float>(),
                  static_cast<int>(m.d_r),
                  dsa ? p.k_idx.ptr<float>() : nullptr,
                  static_cast<int>(m.d_i));

    // q̂ [n, H, d_lat]: q̂_h = [W_kvb[h, :d_n]ᵀ q_n,h | q_r,h]
    const Tensor qc = in_dtype(g, s, p.q, cd);
    Tensor q_hat = s(DType::f32, {n, H * m.d_lat()});
    for (int64_t h = 0; h < H; ++h)
        g.blas.gemm(cd,
                    DType::f32,
                    false,
                    false,
                    n,
                    m.r_kv,
                    m.d_n,
                    1.0f,
                    at(qc, h * m.d_qk()),
                    H * m.d_qk(),
                    at(w.kv_b, h * (m.d_n + m.d_v) * m.r_kv),
                    m.r_kv,
                    0.0f,
                    at(q_hat, h * m.d_lat()),
                    H * m.d_lat());
    cu::copy_2d(
        st, DType::f32, at(p.q, m.d_n), m.d_qk(), at(q_hat, m.r_kv), m.d_lat(), n * H, m.d_r);

    // ō [n, H, r_kv] over each query's keys
    Tensor o_bar = s(DType::f32, {n, H * m.r_kv});
    const DsaFusedPlan fused =
        dsa && step.fused && cd == DType::bf16
            ? dsa_fused_plan(cfg, n, max_visible(step), step.n_seq == 1, cu::device_sm_count())
            : DsaFusedPlan{};
    if (fused.supported) {
        attend_fused(g, cfg, fused, p, q_hat, step, layer, o_bar, indexer_seconds);
    } else {
        if (step.n_one > 0)
            attend_one_rows(g, cfg, dsa, p, q_hat, step, layer, o_bar);
        for (int64_t seq = 0; seq < step.n_seq; ++seq)
            if (step.batch->length(seq) > 1)
                attend_chunk(g, cfg, dsa, p, q_hat, step, layer, seq, o_bar);
    }

    // o_h = W_kvb[h, d_n:] ō_h, the gate, o_proj
    const Tensor obc = in_dtype(g, s, o_bar, cd);
    Tensor o = s(DType::f32, {n, H * m.d_v});
    for (int64_t h = 0; h < H; ++h)
        g.blas.gemm(cd,
                    DType::f32,
                    false,
                    true,
                    n,
                    m.d_v,
                    m.r_kv,
                    1.0f,
                    at(obc, h * m.r_kv),
                    H * m.r_kv,
                    at(w.kv_b, (h * (m.d_n + m.d_v) + m.d_n) * m.r_kv),
                    m.r_kv,
                    0.0f,
                    at(o, h * m.d_v),
                    H * m.d_v);
    if (spec.gated) {  // o ⊙ σ(W_g x), σ in fp32
        Tensor gate = s(DType::f32, {n, H * m.d_v});
        g.blas.linear(xc, w.g_proj, gate);
        cu::sigmoid_inplace(st, gate);
        cu::mul_inplace(st, o, gate);
    }
    g.blas.linear(in_dtype(g, s, o, cd), w.o_proj, y);
    lora_apply(g, w.lora.o, step.lora.rows, o, y);
}

}  // namespace hymoe::model::gpu
