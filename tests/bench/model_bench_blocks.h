// bench_model's block costs: the KDA scans on one sequence, a DSA layer and its prefill chunk
// over a cache, and one decode token through a DSA or KDA layer.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <sys/resource.h>
#include <thread>
#include <vector>

#include <cblas.h>

#include "hymoe/backend/ops.h"
#include "hymoe/core/allocator.h"
#include "hymoe/core/error.h"
#include "hymoe/core/rng.h"
#include "hymoe/core/timer.h"
#include "hymoe/model/config.h"
#include "hymoe/model/kv_cache.h"
#include "hymoe/model/model.h"
#include "model_bench_common.h"

namespace hymoe_bench {

// The KDA scans timed on one sequence: forward chunked (chunks of 64 and of 32) and recurrent,
// each the best of 3 samples, backward chunked and per token (from the same checkpoints, chunk
// 64).
struct KdaScanSpans {
    Span chunked, chunked32, recurrent, back_chunked, back_tokens;
};

// kda_chunked, kda_recurrent, then both backwards of one sequence of T tokens from a zero state,
// with inputs shaped as kda_forward makes them: q, k unit rows (q scaled by K^{-1/2}),
// g = −u² ∈ (−1, 0], β ∈ [0, 1); ∂L/∂o standard normal.
inline KdaScanSpans kda_scans(int64_t T, int H, int K, int V) {
    const auto n_k = static_cast<size_t>(T * H * K), n_v = static_cast<size_t>(T * H * V);
    std::vector<float> q(n_k), k(n_k), g(n_k), v(n_v), beta(static_cast<size_t>(T * H));
    std::vector<float> o(n_v), S(static_cast<size_t>(H * K * V));
    Philox rng(seed, 3, 0);
    rng.fill_normal(q.data(), n_k, 0.0f, 1.0f);
    rng.fill_normal(k.data(), n_k, 0.0f, 1.0f);
    rng.fill_normal(v.data(), n_v, 0.0f, 1.0f);
    rng.fill_uniform(g.data(), n_k, 0.0f, 1.0f);
    rng.fill_uniform(beta.data(), beta.size(), 0.0f, 1.0f);
    for (float& x : g)
        x = -x * x;
    const auto width = static_cast<size_t>(K);
    for (size_t r = 0; r < n_k; r += width) {
        float sq = 0, sk = 0;
        for (size_t i = r; i < r + width; ++i) {
            sq += q[i] * q[i];
            sk += k[i] * k[i];
        }
        for (size_t i = r; i < r + width; ++i) {
            q[i] /= std::sqrt(sq * static_cast<float>(K));
            k[i] /= std::sqrt(sk);
        }
    }
    model::KdaScanParams p;
    p.n_tok = T;
    p.n_head = H;
    p.d_k = K;
    p.d_v = V;
    p.q = q.data();
    p.k = k.data();
    p.v = v.data();
    p.g = g.data();
    p.beta = beta.data();
    p.S = S.data();
    p.o = o.data();
    Span fwd[3];  // chunk 64, chunk 32, recurrent: samples interleaved, the fastest kept
    for (int sample = 0; sample < 3; ++sample) {
        for (int form = 0; form < 3; ++form) {
            std::fill(S.begin(), S.end(), 0.0f);
            Probe probe;
            if (form == 2)
                ops::kda_recurrent(p);
            else
                ops::kda_chunked(p, form == 0 ? 64 : 32);
            const Span t = probe.stop();
            if (sample == 0 || t.wall < fwd[form].wall)
                fwd[form] = t;
        }
    }
    std::fill(S.begin(), S.end(), 0.0f);
    std::vector<float> ckpt(static_cast<size_t>((T + 63) / 64 * H * K * V)), dO(n_v);
    rng.fill_normal(dO.data(), n_v, 0.0f, 1.0f);
    ops::kda_chunked_checkpoints(p, ckpt.data());
    std::vector<float> dq(n_k), dk(n_k), dv(n_v), dg(n_k), dbeta(beta.size());
    const ops::KdaScanGrads d{dO.data(), dq.data(), dk.data(), dv.data(), dg.data(), dbeta.data()};
    Probe back_chunked;
    ops::kda_scan_backward(p, ckpt.data(), d);
    const Span bc = back_chunked.stop();
    Probe back_tokens;
    ops::kda_scan_backward_tokens(p, ckpt.data(), d);
    return {fwd[0], fwd[1], fwd[2], bc, back_tokens.stop()};
}

// One sequence's cache of up to `tokens` tokens in layer `layer`: the private fp32 arrays for
// kv f32, else a pool of kv rows (bf16: the indexer runs in bf16) with its block table reserved.
struct DsaCache {
    std::unique_ptr<model::KvPool> pool;
    std::vector<int32_t> table;
    model::AttnCache cache;
    DsaCache(const model::Model& m, int layer, int64_t tokens, DType kv) {
        if (kv == DType::f32)
            return;
        const int page = 64;
        pool = std::make_unique<model::KvPool>(
            m.local, m.shard, page, (tokens + page - 1) / page, model::KvStoreFactory{}, kv);
        HYMOE_CHECK(pool->reserve(table, tokens), "bench: KV pool of ", tokens, " tokens");
        cache.pool = pool.get(), cache.pages = &table, cache.layer = layer;
    }
};

// attention_forward of layer `layer` on one new sequence of T random rows, caching in kv rows.
inline model::AttnStats dsa_layer(
    const model::Model& m, int layer, int64_t T, DType kv, Span& span) {
    const int64_t d = m.cfg.hidden_size;
    Buffer x(DType::f32, {T, d}), y(DType::f32, {T, d});
    Philox rng(seed, 4, 0);
    rng.fill_normal(x.ptr<float>(), static_cast<size_t>(T * d), 0.0f, 1.0f);
    DsaCache dc(m, layer, T, kv);
    model::AttnCache& cache = dc.cache;
    model::AttnStats stats;
    Probe probe;
    model::attention_forward(m.ctx,
                             m.cfg,
                             m.cfg.layers[static_cast<size_t>(layer)],
                             m.layers[static_cast<size_t>(layer)].attn,
                             x.view(),
                             model::single_sequence(T),
                             {&cache},
                             y.view(),
                             model::AttnMode::automatic,
                             &stats);
    span = probe.stop();
    return stats;
}

// One decode token's cost in MLA/DSA layer `layer` over a cache of `context` tokens (random
// cached rows: the cost does not depend on their values), absorbed form, best of 3: seconds of
// the indexer and of the rest.
inline model::AttnStats decode_cost(const model::Model& m, int layer, int64_t context) {
    const model::ModelConfig& cfg = m.cfg;
    const int64_t d = cfg.hidden_size, r_kv = cfg.mla.kv_lora_rank, d_r = cfg.mla.qk_rope_head_dim;
    const bool dsa = cfg.layers[static_cast<size_t>(layer)].mixer == model::Mixer::dsa;
    Philox rng(seed, 5, 0);
    model::AttnCache filled;
    filled.n = context;
    filled.c_kv.resize(static_cast<size_t>(context * r_kv));
    filled.k_r.resize(static_cast<size_t>(context * d_r));
    filled.k_idx.resize(dsa ? static_cast<size_t>(context * cfg.indexer.head_dim) : 0);
    rng.fill_normal(filled.c_kv.data(), filled.c_kv.size(), 0.0f, 1.0f);
    rng.fill_normal(filled.k_r.data(), filled.k_r.size(), 0.0f, 1.0f);
    rng.fill_normal(filled.k_idx.data(), filled.k_idx.size(), 0.0f, 1.0f);
    Buffer x(DType::f32, {1, d}), y(DType::f32, {1, d});
    rng.fill_normal(x.ptr<float>(), static_cast<size_t>(d), 0.0f, 1.0f);
    model::AttnStats best;
    for (int rep = 0; rep < 3; ++rep) {
        model::AttnCache cache = filled;  // with room for the new token: no reallocation timed
        cache.c_kv.reserve(cache.c_kv.size() + static_cast<size_t>(r_kv));
        cache.k_r.reserve(cache.k_r.size() + static_cast<size_t>(d_r));
        cache.k_idx.reserve(cache.k_idx.size() + static_cast<size_t>(cfg.indexer.head_dim));
        model::AttnStats stats;
        model::attention_forward(hymoe::backend::cpu_ctx(),
                                 cfg,
                                 cfg.layers[static_cast<size_t>(layer)],
                                 m.layers[static_cast<size_t>(layer)].attn,
                                 x.view(),
                                 model::single_sequence(1, context),
                                 {&cache},
                                 y.view(),
                                 model::AttnMode::absorbed,
                                 &stats);
        if (rep == 0 || stats.indexer_seconds + stats.attention_seconds <
                            best.indexer_seconds + best.attention_seconds)
            best = stats;
    }
    return best;
}

// The bytes of KDA layer `layer`'s weights (a decode token reads them all).
inline double kda_weight_bytes(model::Model& m, int layer) {
    double bytes = 0;
    for (const model::TensorSpec& t :
         model::kda_tensors(m.cfg, m.layers[static_cast<size_t>(layer)].kda))
        bytes += static_cast<double>(t.dest->view().bytes());
    return bytes;
}

// One decode token through KDA layer `layer`: its projections' weights (read whole) and the state
// update, whatever the context; best of 3.
inline double kda_decode_cost(const model::Model& m, int layer) {
    const int64_t d = m.cfg.hidden_size;
    Buffer x(DType::f32, {1, d}), y(DType::f32, {1, d});
    Philox rng(seed, 6, 0);
    rng.fill_normal(x.ptr<float>(), static_cast<size_t>(d), 0.0f, 1.0f);
    model::KdaState state = model::make_kda_state(m.cfg);
    double best = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
        Probe probe;
        model::kda_forward(m.ctx,
                           m.cfg,
                           m.layers[static_cast<size_t>(layer)].kda,
                           x.view(),
                           model::single_sequence(1),
                           {&state},
                           y.view());
        best = std::min(best, probe.stop().wall);
    }
    return best;
}

// One prefill chunk of n_new tokens through DSA layer `layer` after a cache of `context` random
// tokens (their values do not change the cost) in kv rows, automatic mode (sparse), best of 2: the
// indexer scans every cached key, the attention only each query's top-k.
inline model::AttnStats dsa_chunk_cost(
    const model::Model& m, int layer, int64_t context, int64_t n_new, DType kv) {
    const model::ModelConfig& cfg = m.cfg;
    const int64_t d = cfg.hidden_size, r_kv = cfg.mla.kv_lora_rank, d_r = cfg.mla.qk_rope_head_dim;
    Philox rng(seed, 7, 0);
    DsaCache dc(m, layer, context + n_new, kv);
    model::AttnCache& filled = dc.cache;
    filled.n = context;
    if (dc.pool) {
        const int64_t width = dc.pool->row_width(layer), page = dc.pool->page_tokens();
        std::vector<float> row(static_cast<size_t>(width));
        for (int64_t u = 0; u < context; ++u) {
            rng.fill_normal(row.data(), row.size(), 0.0f, 1.0f);
            dc.pool->write_row(layer, dc.table[u / page], u % page, 0, width, row.data());
        }
    } else {
        filled.c_kv.resize(static_cast<size_t>(context * r_kv));
        filled.k_r.resize(static_cast<size_t>(context * d_r));
        filled.k_idx.resize(static_cast<size_t>(context * cfg.indexer.head_dim));
        rng.fill_normal(filled.c_kv.data(), filled.c_kv.size(), 0.0f, 1.0f);
        rng.fill_normal(filled.k_r.data(), filled.k_r.size(), 0.0f, 1.0f);
        rng.fill_normal(filled.k_idx.data(), filled.k_idx.size(), 0.0f, 1.0f);
    }
    Buffer x(DType::f32, {n_new, d}), y(DType::f32, {n_new, d});
    rng.fill_normal(x.ptr<float>(), static_cast<size_t>(n_new * d), 0.0f, 1.0f);
    model::AttnStats best;
    for (int rep = 0; rep < 2; ++rep) {
        model::AttnCache cache = filled;
        model::AttnStats stats;
        model::attention_forward(hymoe::backend::cpu_ctx(),
                                 cfg,
                                 cfg.layers[static_cast<size_t>(layer)],
                                 m.layers[static_cast<size_t>(layer)].attn,
                                 x.view(),
                                 model::single_sequence(n_new, context),
                                 {&cache},
                                 y.view(),
                                 model::AttnMode::automatic,
                                 &stats);
        if (rep == 0 || stats.indexer_seconds + stats.attention_seconds <
                            best.indexer_seconds + best.attention_seconds)
            best = stats;
    }
    return best;
}

}  // namespace hymoe_bench
