// The MLA/DSA block's steps on a CUDA context against the same steps on the CPU context
// (model/attention_views.h): the new ops of backend/ops_attention.h (RoPE over strided heads,
// the column slice, the indexer key's LayerNorm, the host copy, the attention core, the indexer's
// scores, and its top-k mask, which must be equal), then the block's projections
// (detail::mla_project: query through the latent or full-rank, latent c_kv and rope key k_r with
// their RMSNorms and RoPE) and the indexer's (indexer_project), for a prefill batch (7, 1 and 30
// tokens from position 0) and a decode step after it (positions 7, 1, 30); fp32 within 1e-5,
// bf16 matrices within 1e-2; then attention_forward itself over device pages (the GPU model's
// path: DeviceAttnRows, the decode rows through mla_decode, the chunks through the gathered
// latent) against the CPU's over its own caches, the same prefill and decode, MLA and DSA, fp32
// within 1e-5; and the same with LoRA adapters on q, kv (onto [c_kv | k_r]) and o, the sequences
// on adapters 2, none and 0: device factor views on device row lists (the GPU model's form)
// against the host slots on the CPU. Never run on a GPU yet; each case skips without one.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "../../src/model/mla_project.h"
#include "cuda_test.h"
#include "hymoe/backend/cuda_gemm.h"
#include "hymoe/backend/ops_attention.h"
#include "hymoe/core/rng.h"
#include "hymoe/model/attention_views.h"
#include "hymoe/model/lora.h"
#include "hymoe/model/lora_rows.h"
#include "hymoe/model/weights.h"

namespace utf = boost::unit_test;
using namespace hymoe;
using namespace hymoe::cuda_test;

namespace {

// One attention layer of a tiny preset, projections N(0, fan_in^{-1/2}) (as
// tests/unit/model/test_attention.cpp), the matrices held at `storage`.
// With adapters: 0 and 2 on q, kv and o (adapter 1 leaves them alone), B random.
struct Layer {
    model::ModelConfig cfg;
    model::LayerSpec spec;
    model::MlaWeights w;
    model::LoraSlot q, kv, o;
    Layer(const std::string& preset, model::Mixer mixer, DType storage, bool adapters = false)
        : cfg(model::preset_config(preset)), spec{mixer, true, model::Ffn::moe} {
        model::TensorList list =
            model::with_storage(model::attention_tensors(cfg, spec, w), storage);
        for (model::TensorSpec& t : list)
            t.std = 1.0f / std::sqrt(static_cast<float>(t.shape.back()));
        Philox rng(7, 0, 0);
        model::init_random(list, rng);
        if (!adapters)
            return;
        adapt(q, cfg.mla.q_lora_rank > 0 ? w.q_b_proj.view() : w.q_proj.view(), 10);
        adapt(kv, w.kv_a_proj_with_mqa.view(), 20);  // B [r_kv + d_r, 4]
        adapt(o, w.o_proj.view(), 30);
        w.lora.q = &q;
        w.lora.kv = &kv;
        w.lora.o = &o;
    }
    static void adapt(model::LoraSlot& slot, const Tensor& proj, uint32_t stream) {
        const int64_t out = proj.dim(0), in = proj.dim(1);
        for (uint32_t a = 0; a < 3; ++a) {
            model::LoraPair& p = slot.adapters.emplace_back();
            if (a == 1)
                continue;
            p = model::make_lora_pair(
                out, in, 4, 0.5f + static_cast<float>(a), 5, stream + a, false);
            Philox(9, stream + a, 0)
                .fill_normal(p.B.ptr<float>(), static_cast<size_t>(out * 4), 0.0f, 0.3f);
        }
    }
};

// A CUDA context over a test's stream and arena.
model::MlaWeightViews upload(GpuCtx& gc, const model::MlaWeights& w) {
    const model::IndexerWeights& x = w.indexer;
    return {gc.weight(w.q_a_proj),
            gc.weight(w.q_a_layernorm),
            gc.weight(w.q_b_proj),
            gc.weight(w.q_proj),
            gc.weight(w.kv_a_proj_with_mqa),
            gc.weight(w.kv_a_layernorm),
            gc.weight(w.kv_b_proj),
            gc.weight(w.o_proj),
            gc.weight(w.g_proj),
            {gc.weight(x.wq_b),
             gc.weight(x.wk),
             gc.weight(x.k_norm_weight),
             gc.weight(x.k_norm_bias),
             gc.weight(x.weights_proj)},
            nullptr,
            {},
            nullptr};
}

// A host slot's adapters as device factor views (adapter 1's stays empty).
model::LoraSlotView upload_slot(GpuCtx& gc, const model::LoraSlot& slot) {
    model::LoraSlotView v;
    for (const model::LoraPair& p : slot.adapters)
        v.push_back({gc.weight(p.A), gc.weight(p.B), p.scale});
    return v;
}

// A batch's rows of each of 3 adapters as device index lists.
std::vector<model::LoraRowsView> upload_rows(GpuCtx& gc, const model::SeqBatch& b) {
    const model::LoraRows lr = model::adapter_rows(b, 3);
    std::vector<model::LoraRowsView> rows;
    for (const model::LoraSegment& seg : lr.segments) {
        const std::vector<int64_t> r(lr.rows.begin() + seg.begin,
                                     lr.rows.begin() + seg.begin + seg.count);
        rows.push_back({seg.adapter, to_device_i64(r, gc.g.arena, gc.g.s)});
    }
    return rows;
}

// The positions of a batch's rows (as attention_forward computes them).
std::vector<int64_t> positions(const model::SeqBatch& b) {
    std::vector<int64_t> pos;
    for (int64_t s = 0; s < b.n_seq(); ++s)
        for (int64_t t = 0; t < b.length(s); ++t)
            pos.push_back(b.pos0[s] + t);
    return pos;
}

// The prefill batch (7, 1, 30 tokens) and the decode step after it (one token each).
const model::SeqBatch kPrefill{{0, 7, 8, 38}, {0, 0, 0}, {}};
const model::SeqBatch kDecode{{0, 1, 2, 3}, {7, 1, 30}, {}};
// The same with the sequences on adapters 2, none and 0.
const model::SeqBatch kPrefillLora{{0, 7, 8, 38}, {0, 0, 0}, {2, -1, 0}};
const model::SeqBatch kDecodeLora{{0, 1, 2, 3}, {7, 1, 30}, {2, -1, 0}};

void close(
    const char* what, const Tensor& dev, const Tensor& want, const cu::Stream& s, double tol) {
    Buffer got = to_host(dev, s);
    const double err = rel_error(got.ptr<float>(), want.ptr<float>(), want.numel());
    BOOST_TEST_INFO(what << ": normalised error " << err);
    BOOST_TEST(err < tol);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_attention_forward, *utf::label("cuda"))

BOOST_AUTO_TEST_CASE(attention_ops_on_a_cuda_ctx_match_the_cpu, *utf::precondition(need_gpu)) {
    GpuCtx gc;
    const backend::Ctx cpu = backend::cpu_ctx();
    const int64_t n = 38, width = 3 * 24;  // 3 heads of 24, 16 rotated dims from column 8
    const std::vector<int64_t> pos = positions(kPrefill);
    const Tensor pos_host{const_cast<int64_t*>(pos.data()), DType::i64, Device::cpu, {n}};
    Tensor pos_dev = gc.g.arena.tensor(DType::i64, {n});
    ops::upload(gc.ctx, pos_host, pos_dev);
    const ops::RopeFreqs freqs = ops::rope_freqs(16, 10000.0);
    for (const bool interleaved : {true, false}) {
        Buffer x = random({n, width}, interleaved ? 1 : 2, DType::f32);
        Tensor xd = gc.up(x);
        ops::rope(cpu, x.view(), 8, 3, 24, pos_host, freqs, interleaved);
        ops::rope(gc.ctx, xd, 8, 3, 24, pos_dev, freqs, interleaved);
        close(interleaved ? "rope, interleaved" : "rope, rotate-half", xd, x.view(), gc.g.s, 1e-5);
    }
    Buffer src = random({n, width}, 3, DType::f32), cols(DType::f32, {n, 20});
    Tensor cols_dev = gc.f32({n, 20});
    ops::copy_cols(cpu, src.view(), 30, cols.view());
    ops::copy_cols(gc.ctx, gc.up(src), 30, cols_dev);
    close("copy_cols", cols_dev, cols.view(), gc.g.s, 1e-7);
    Buffer w = random({width}, 4, DType::f32), b = random({width}, 5, DType::f32);
    Buffer ln(DType::f32, {n, width});
    Tensor ln_dev = gc.f32({n, width});
    ops::layer_norm(cpu, src.view(), w.view(), b.view(), 1e-6f, ln.view());
    ops::layer_norm(gc.ctx, gc.up(src), gc.up(w), gc.up(b), 1e-6f, ln_dev);
    close("layer_norm", ln_dev, ln.view(), gc.g.s, 1e-5);

    // the attention core under a causal mask, the indexer's scores and its causal top-k mask
    const int64_t n_q = 12, n_k = 40, d_qk = 24, d_v = 16;
    const Buffer q = random({n_q, d_qk}, 6, DType::f32), k = random({n_k, d_qk}, 7, DType::f32);
    const Buffer v = random({n_k, d_v}, 8, DType::f32);
    Buffer mask(DType::f32, {n_q, n_k}), o(DType::f32, {n_q, d_v});
    for (int64_t i = 0; i < n_q; ++i)
        for (int64_t u = 0; u < n_k; ++u)
            mask.ptr<float>()[i * n_k + u] = u <= n_k - n_q + i ? 0.0f : -INFINITY;
    Tensor o_dev = gc.f32({n_q, d_v});
    ops::attention_core(cpu, q.view(), k.view(), v.view(), mask.view(), 0.2f, o.view());
    ops::attention_core(gc.ctx, gc.up(q), gc.up(k), gc.up(v), gc.up(mask), 0.2f, o_dev);
    close("attention_core", o_dev, o.view(), gc.g.s, 1e-5);
    const Buffer w_idx = random({n_q, 3}, 9, DType::f32), keys = random({n_k, 8}, 10, DType::f32);
    Buffer scores(DType::f32, {n_q, n_k}), kept(DType::f32, {n_q, n_k});
    Tensor scores_dev = gc.f32({n_q, n_k}), kept_dev = gc.f32({n_q, n_k});
    ops::indexer_scores(cpu, q.view(), w_idx.view(), keys.view(), scores.view());  // 3 heads of 8
    ops::indexer_scores(gc.ctx, gc.up(q), gc.up(w_idx), gc.up(keys), scores_dev);
    close("indexer_scores", scores_dev, scores.view(), gc.g.s, 1e-5);
    ops::indexer_mask(cpu, scores.view(), n_k - n_q, 16, kept.view());
    ops::indexer_mask(gc.ctx, gc.up(scores), n_k - n_q, 16, kept_dev);
    const Buffer got = to_host(kept_dev, gc.g.s);
    BOOST_TEST(std::memcmp(got.view().data, kept.view().data, kept.view().bytes()) == 0);
}

BOOST_AUTO_TEST_CASE(mla_and_indexer_projections_on_a_cuda_ctx_match_the_cpu,
                     *utf::precondition(need_gpu)) {
    struct Case {
        const char* preset;
        model::Mixer mixer;
        DType storage;
    };
    for (const Case c : {Case{"tiny", model::Mixer::dsa, DType::f32},
                         Case{"tiny", model::Mixer::dsa, DType::bf16},
                         Case{"tiny-kimi", model::Mixer::mla, DType::f32}}) {
        BOOST_TEST_CONTEXT(c.preset << ", " << to_string(c.storage) << " matrices") {
            const Layer layer(c.preset, c.mixer, c.storage);
            const model::ModelConfig& cfg = layer.cfg;
            const model::detail::MlaDims m = model::detail::mla_dims(cfg);
            const double tol = tolerance(c.storage);
            GpuCtx gc;
            const model::MlaWeightViews dw = upload(gc, layer.w);
            uint32_t stream = 80;
            for (const model::SeqBatch* b : {&kPrefill, &kDecode}) {
                const int64_t n = b->n_tok();
                const std::vector<int64_t> pos = positions(*b);
                Tensor pos_dev = to_device_i64(pos, gc.g.arena, gc.g.s);
                Buffer x = random({n, m.d}, stream++, DType::f32);
                const Tensor xd = gc.up(x);
                const model::detail::Projected want =
                    model::detail::mla_project(cfg, layer.w, x.view(), *b, pos);
                model::detail::ProjectedViews got;
                got.q = gc.f32({n, m.n_head * m.d_qk()});
                got.c_kv = gc.f32({n, m.r_kv});
                got.k_r = gc.f32({n, m.d_r});
                if (m.r_q > 0)
                    got.c_q = gc.f32({n, m.r_q});
                model::detail::mla_project(gc.ctx, cfg, dw, xd, *b, pos_dev, got);
                close("q", got.q, want.q.view(), gc.g.s, tol);
                close("c_kv", got.c_kv, want.c_kv.view(), gc.g.s, tol);
                close("k_r", got.k_r, want.k_r.view(), gc.g.s, tol);
                if (c.mixer != model::Mixer::dsa)
                    continue;
                const int64_t h_i = cfg.indexer.n_head, d_i = cfg.indexer.head_dim;
                const model::IndexerInputs in =
                    model::indexer_project(cfg, layer.w.indexer, x.view(), want.c_q.view(), pos);
                Tensor q = gc.f32({n, h_i * d_i}), k = gc.f32({n, d_i}), w = gc.f32({n, h_i});
                model::indexer_project(gc.ctx, cfg, dw.indexer, xd, got.c_q, pos_dev, q, k, w);
                close("indexer q", q, in.q.view(), gc.g.s, tol);
                close("indexer k", k, in.k.view(), gc.g.s, tol);
                close("indexer w", w, in.w.view(), gc.g.s, tol);
            }
        }
    }
}

namespace {

// attention_forward on a CUDA context over paged device rows (page_tokens 4, each sequence's pages
// interleaved with the others') against the CPU over private caches: prefill (7, 1, 30 tokens:
// sequence 1 a single row, so both the decode and the chunk paths run), then a decode step.
// lora: the layer's adapters as device factor views on the batch's device rows against its host
// slots on the CPU.
void forward_over_device_pages(const char* preset, model::Mixer mixer, bool lora) {
    BOOST_TEST_CONTEXT(preset << ", " << model::to_string(mixer) << (lora ? ", LoRA" : "")) {
        const Layer layer(preset, mixer, DType::f32, lora);
        const model::ModelConfig& cfg = layer.cfg;
        const model::detail::MlaDims m = model::detail::mla_dims(cfg);
        const int64_t d_i = mixer == model::Mixer::dsa ? cfg.indexer.head_dim : 0;
        const int64_t width = m.d_lat() + d_i, pt = 4, max_pages = 8, n_seq = 3;
        GpuCtx gc;
        model::MlaWeightViews dw = upload(gc, layer.w);
        if (lora) {
            dw.lora_views.q = upload_slot(gc, layer.q);
            dw.lora_views.kv = upload_slot(gc, layer.kv);
            dw.lora_views.o = upload_slot(gc, layer.o);
        }
        Tensor pages = gc.f32({n_seq * max_pages, pt, width});
        std::vector<int32_t> table(static_cast<size_t>(n_seq * max_pages));
        for (int64_t s = 0; s < n_seq; ++s)
            for (int64_t k = 0; k < max_pages; ++k)
                table[static_cast<size_t>(s * max_pages + k)] = static_cast<int32_t>(k * n_seq + s);
        const Tensor table_dev = to_device_i32(table, gc.g.arena, gc.g.s);
        std::vector<model::AttnCache> host(static_cast<size_t>(n_seq));
        std::vector<model::AttnCache*> caches{&host[0], &host[1], &host[2]};
        uint32_t stream = 90;
        for (const model::SeqBatch* b :
             {lora ? &kPrefillLora : &kPrefill, lora ? &kDecodeLora : &kDecode}) {
            const int64_t n = b->n_tok();
            Buffer x = random({n, m.d}, stream++, DType::f32);
            Buffer want(DType::f32, {n, m.d});
            model::attention_forward(
                backend::cpu_ctx(), cfg, layer.spec, layer.w, x.view(), *b, caches, want.view());
            std::vector<int32_t> row_seq, visible, one_keys;
            std::vector<int32_t> one_table;
            std::vector<int64_t> one_rows;
            for (int64_t s = 0; s < n_seq; ++s) {
                for (int64_t t = 0; t < b->length(s); ++t) {
                    row_seq.push_back(static_cast<int32_t>(s));
                    visible.push_back(static_cast<int32_t>(b->pos0[s] + t + 1));
                }
                if (b->length(s) == 1) {
                    one_rows.push_back(b->offsets[s]);
                    one_keys.push_back(static_cast<int32_t>(b->pos0[s] + 1));
                    one_table.insert(one_table.end(),
                                     table.begin() + s * max_pages,
                                     table.begin() + (s + 1) * max_pages);
                }
            }
            model::DeviceAttnRows dev;
            dev.pages.r_kv = m.r_kv;
            dev.pages.d_r = m.d_r;
            dev.pages.d_i = d_i;
            dev.pages.page_tokens = static_cast<int>(pt);
            dev.pages.row_stride = width;
            dev.pages.base = pages.data;
            dev.pages.page_stride = pt * width;
            dev.pages.block_table = table_dev.ptr<int32_t>();
            dev.pages.max_pages = static_cast<int>(max_pages);
            dev.pos = to_device_i64(positions(*b), gc.g.arena, gc.g.s);
            dev.row_seq = to_device_i32(row_seq, gc.g.arena, gc.g.s);
            const Tensor visible_dev = to_device_i32(visible, gc.g.arena, gc.g.s);
            const Tensor one_rows_dev = to_device_i64(one_rows, gc.g.arena, gc.g.s);
            const Tensor one_table_dev = to_device_i32(one_table, gc.g.arena, gc.g.s);
            const Tensor one_keys_dev = to_device_i32(one_keys, gc.g.arena, gc.g.s);
            dev.rows.row_seq = dev.row_seq.ptr<int32_t>();
            dev.rows.visible = visible_dev.ptr<int32_t>();
            dev.rows.n_one = static_cast<int64_t>(one_rows.size());
            dev.rows.one_rows = one_rows_dev.ptr<int64_t>();
            dev.rows.one_table = one_table_dev.ptr<int32_t>();
            dev.rows.one_keys = one_keys_dev.ptr<int32_t>();
            dev.rows.one_max_keys = *std::max_element(one_keys.begin(), one_keys.end());
            const std::vector<model::LoraRowsView> rows =
                lora ? upload_rows(gc, *b) : std::vector<model::LoraRowsView>{};
            dw.lora_rows = lora ? &rows : nullptr;
            const Tensor xd = gc.up(x);
            Tensor y = gc.f32({n, m.d});
            model::attention_forward(gc.ctx,
                                     cfg,
                                     layer.spec,
                                     dw,
                                     xd,
                                     *b,
                                     {},
                                     y,
                                     model::AttnMode::automatic,
                                     nullptr,
                                     nullptr,
                                     &dev);
            close(b->pos0[0] == 0 ? "prefill y" : "decode y", y, want.view(), gc.g.s, 1e-5);
        }
    }
}

}  // namespace

BOOST_AUTO_TEST_CASE(attention_forward_over_device_pages_matches_the_cpu,
                     *utf::precondition(need_gpu)) {
    for (const model::Mixer mixer : {model::Mixer::mla, model::Mixer::dsa})
        forward_over_device_pages("tiny", mixer, false);
}

// q through q_b_proj (tiny) and through q_proj (tiny-kimi, no query latent).
BOOST_AUTO_TEST_CASE(adapters_as_device_factor_views_match_the_cpu_slots,
                     *utf::precondition(need_gpu)) {
    for (const model::Mixer mixer : {model::Mixer::mla, model::Mixer::dsa})
        forward_over_device_pages("tiny", mixer, true);
    forward_over_device_pages("tiny-kimi", model::Mixer::mla, true);
}

BOOST_AUTO_TEST_SUITE_END()
