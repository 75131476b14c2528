// The whole model: weight list with HF names, random init, and the layer-by-layer forward.
#include "hymoe/model/model.h"

#include <algorithm>

#include "hymoe/backend/ops.h"
#include "hymoe/core/error.h"
#include "hymoe/core/timer.h"

namespace hymoe::model {

namespace {

// Prefix of a layer's mixer and FFN weights in the HF checkpoints of each family.
std::string layer_prefix(int i) {
    return "model.layers." + std::to_string(i) + ".";
}

std::string ffn_prefix(const ModelConfig& cfg, int i) {
    const bool kimi_moe = cfg.model_type == "kimi_linear" && cfg.layers[i].ffn != Ffn::dense;
    return layer_prefix(i) + (kimi_moe ? "block_sparse_moe." : "mlp.");
}

void append(TensorList& out, TensorList part, const std::string& prefix) {
    for (TensorSpec& s : part) {
        s.name = prefix + s.name;
        out.push_back(std::move(s));
    }
}

// 32-bit FNV-1a of a tensor name: its random-init stream.
uint32_t name_stream(const std::string& name) {
    uint32_t h = 2166136261u;
    for (unsigned char c : name)
        h = (h ^ c) * 16777619u;
    return h;
}

}  // namespace

TensorList model_tensors(Model& m) {
    const ModelConfig& cfg = m.cfg;
    const int64_t d = cfg.hidden_size;
    TensorList list;
    list.push_back({"model.embed_tokens.weight", {cfg.vocab_size, d}, &m.embed});
    for (int i = 0; i < static_cast<int>(cfg.layers.size()); ++i) {
        const LayerSpec& spec = cfg.layers[i];
        LayerWeights& lw = m.layers[i];
        const std::string p = layer_prefix(i);
        list.push_back({p + "input_layernorm.weight", {d}, &lw.attn_norm, Init::ones});
        if (spec.mixer == Mixer::kda)
            append(list, kda_tensors(cfg, lw.kda), p + "self_attn.");
        else
            append(list, attention_tensors(cfg, spec, lw.attn), p + "self_attn.");
        list.push_back({p + "post_attention_layernorm.weight", {d}, &lw.ffn_norm, Init::ones});
        const bool dense = spec.ffn == Ffn::dense;
        append(list,
               ffn_tensors(cfg, spec, dense ? &lw.dense : nullptr, dense ? nullptr : &lw.moe),
               ffn_prefix(cfg, i));
    }
    list.push_back({"model.norm.weight", {d}, &m.final_norm, Init::ones});
    if (!cfg.tie_word_embeddings)
        list.push_back({"lm_head.weight", {cfg.vocab_size, d}, &m.lm_head});
    return list;
}

Model make_model(const ModelConfig& cfg) {
    Model m;
    m.cfg = cfg;
    m.layers.resize(cfg.layers.size());
    return m;
}

void init_model_random(Model& m, uint64_t seed) {
    for (const TensorSpec& spec : model_tensors(m)) {
        Philox rng(seed, name_stream(spec.name), 0);
        init_random({spec}, rng);
    }
}

void load_model_weights(Model& m,
                        const std::function<void(const std::string& name, Tensor& dest)>& read) {
    load_named(model_tensors(m), "", read);
}

SequenceState make_sequence_state(const ModelConfig& cfg) {
    SequenceState s;
    s.kda.resize(cfg.layers.size());
    s.attn.resize(cfg.layers.size());
    for (size_t i = 0; i < cfg.layers.size(); ++i)
        if (cfg.layers[i].mixer == Mixer::kda)
            s.kda[i] = make_kda_state(cfg);
    return s;
}

void forward(const Model& m,
             const std::vector<int64_t>& tokens,
             const SeqBatch& batch,
             const std::vector<SequenceState*>& states,
             Buffer& logits,
             const ForwardOptions& options) {
    const ModelConfig& cfg = m.cfg;
    const int64_t n = batch.n_tok(), d = cfg.hidden_size, V = cfg.vocab_size;
    HYMOE_CHECK(static_cast<int64_t>(tokens.size()) == n &&
                    static_cast<int64_t>(states.size()) == batch.n_seq(),
                "forward: ",
                tokens.size(),
                " tokens / ",
                states.size(),
                " states for a batch of ",
                n,
                " tokens / ",
                batch.n_seq(),
                " sequences");
    for (int64_t s = 0; s < batch.n_seq(); ++s)
        HYMOE_CHECK(states[s]->n_tokens == batch.pos0[s],
                    "forward: sequence ",
                    s,
                    " state holds ",
                    states[s]->n_tokens,
                    " tokens but the batch continues at ",
                    batch.pos0[s]);

    ForwardStats scratch;  // where timings go when the caller asked for none
    ForwardStats& stats = options.stats ? *options.stats : scratch;
    stats.mixer_seconds.resize(cfg.layers.size());
    stats.ffn_seconds.resize(cfg.layers.size());
    const float eps = static_cast<float>(cfg.rms_norm_eps);
    Buffer h(DType::f32, {n, d});  // [n_tok, d] the residual stream
    {
        ScopedTimer timer(stats.head_seconds);
        for (int64_t t = 0; t < n; ++t) {
            HYMOE_CHECK(tokens[t] >= 0 && tokens[t] < V,
                        "forward: token id ",
                        tokens[t],
                        " outside the vocabulary [0, ",
                        V,
                        ")");
            std::copy_n(m.embed.ptr<float>() + tokens[t] * d, d, h.ptr<float>() + t * d);
        }
    }
    Buffer xn(DType::f32, {n, d}), y(DType::f32, {n, d});  // [n_tok, d] normed input, block out
    std::vector<KdaState*> kda_states(states.size());
    std::vector<AttnCache*> caches(states.size());
    for (size_t i = 0; i < cfg.layers.size(); ++i) {
        const LayerSpec& spec = cfg.layers[i];
        const LayerWeights& lw = m.layers[i];
        {
            ScopedTimer timer(stats.mixer_seconds[i]);
            ops::rms_norm(h.view(), lw.attn_norm.view(), eps, xn.view());
            if (spec.mixer == Mixer::kda) {
                for (size_t s = 0; s < states.size(); ++s)
                    kda_states[s] = &states[s]->kda[i];
                kda_forward(cfg, lw.kda, xn.view(), batch, kda_states, y.view(), options.kda_mode);
            } else {
                for (size_t s = 0; s < states.size(); ++s)
                    caches[s] = &states[s]->attn[i];
                attention_forward(cfg,
                                  spec,
                                  lw.attn,
                                  xn.view(),
                                  batch,
                                  caches,
                                  y.view(),
                                  options.attn_mode,
                                  &stats.attn);
            }
            ops::add_inplace(h.view(), y.view());
        }
        ScopedTimer timer(stats.ffn_seconds[i]);
        ops::rms_norm(h.view(), lw.ffn_norm.view(), eps, xn.view());
        if (spec.ffn == Ffn::dense)
            dense_ffn_forward(lw.dense, ExpertAct::swiglu, xn.view(), y.view());
        else
            moe_forward(cfg, spec, lw.moe, xn.view(), y.view());
        ops::add_inplace(h.view(), y.view());
    }
    for (int64_t s = 0; s < batch.n_seq(); ++s)
        states[s]->n_tokens += batch.length(s);

    // Final norm and head, on every row or only the last row of each sequence.
    ScopedTimer timer(stats.head_seconds);
    Buffer rows;
    const Tensor* hv = &h.view();
    if (options.logits == Logits::last) {
        rows = Buffer(DType::f32, {batch.n_seq(), d});
        for (int64_t s = 0; s < batch.n_seq(); ++s)
            std::copy_n(
                h.ptr<float>() + (batch.offsets[s + 1] - 1) * d, d, rows.ptr<float>() + s * d);
        hv = &rows.view();
    }
    Buffer normed(DType::f32, hv->shape);
    ops::rms_norm(*hv, m.final_norm.view(), eps, normed.view());
    logits = Buffer(DType::f32, {hv->dim(0), V});
    ops::linear(normed.view(), m.head().view(), logits.view());
}

}  // namespace hymoe::model
