// The whole-model training pass: forward keeping the residual stream at block boundaries, the
// masked cross-entropy head, and the reverse sweep through each block's backward.
#include "hymoe/model/train.h"

#include <algorithm>
#include <cmath>

#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_backward.h"
#include "hymoe/core/error.h"

namespace hymoe::model {

namespace {

constexpr int64_t kHeadRows = 256;  // LM head rows per chunk: bounds the [rows, V] logits

void check_trainable(const Model& m, const TrainBatch& b) {
    HYMOE_CHECK(m.shard.tp == 1 && m.shard.pp == 1 && m.shard.ep == 1,
                "training runs on whole-model ranks (tp = pp = ep = 1)");
    HYMOE_CHECK(b.tokens.size() == b.targets.size() &&
                    static_cast<int64_t>(b.tokens.size()) == b.batch.n_tok(),
                "train: ",
                b.tokens.size(),
                " tokens, ",
                b.targets.size(),
                " targets for a batch of ",
                b.batch.n_tok());
    for (int64_t p : b.batch.pos0)
        HYMOE_CHECK(p == 0, "train: every sequence of a training batch starts at position 0");
}

// y [n, d] = the mixer of layer i on xn [n, d], every sequence fresh.
void mixer_forward(const Model& m, int i, const TrainBatch& b, const Tensor& xn, Tensor& y) {
    const LayerSpec& spec = m.cfg.layers[i];
    if (spec.mixer == Mixer::kda) {
        std::vector<KdaState> states(static_cast<size_t>(b.batch.n_seq()));
        std::vector<KdaState*> ptrs;
        for (KdaState& s : states)
            s = make_kda_state(m.cfg), ptrs.push_back(&s);
        kda_forward(m.cfg, m.layers[i].kda, xn, b.batch, ptrs, y);
    } else {
        attention_forward(m.cfg, spec, m.layers[i].attn, xn, b.batch, {}, y, AttnMode::expanded);
    }
}

void ffn_forward(const Model& m, int i, const Tensor& xn, Tensor& y, Routing* routing) {
    const LayerSpec& spec = m.cfg.layers[i];
    if (spec.ffn == Ffn::dense)
        dense_ffn_forward(m.layers[i].dense, ExpertAct::swiglu, xn, y);
    else
        moe_forward(m.cfg, spec, m.layers[i].moe, xn, y, routing);
}

// The residual stream at the block boundaries of one forward.
struct Stream {
    std::vector<Buffer> before_mixer;  // [n_layer] [n, d] layer inputs
    std::vector<Buffer> before_ffn;    // [n_layer] [n, d] (empty with recompute)
    Buffer out;                        // [n, d] after the last layer
};

Stream forward_stream(const Model& m,
                      const TrainBatch& b,
                      bool keep_mid,
                      std::vector<std::vector<int64_t>>* expert_load,
                      std::vector<Buffer>* ffn_inputs) {
    const int64_t n = b.batch.n_tok(), d = m.cfg.hidden_size;
    const float eps = static_cast<float>(m.cfg.rms_norm_eps);
    const int n_layer = static_cast<int>(m.cfg.layers.size());
    Stream st;
    st.before_mixer.resize(n_layer);
    st.before_ffn.resize(n_layer);
    Buffer h(DType::f32, {n, d});
    for (int64_t t = 0; t < n; ++t) {
        HYMOE_CHECK(b.tokens[t] >= 0 && b.tokens[t] < m.cfg.vocab_size,
                    "train: token id ",
                    b.tokens[t],
                    " outside the vocabulary");
        std::copy_n(m.embed.ptr<float>() + b.tokens[t] * d, d, h.ptr<float>() + t * d);
    }
    for (size_t i = 0; i < b.media.rows.size(); ++i)
        std::copy_n(b.media.embeds.ptr<float>() + static_cast<int64_t>(i) * d,
                    d,
                    h.ptr<float>() + b.media.rows[i] * d);
    Buffer xn(DType::f32, {n, d}), y(DType::f32, {n, d});
    for (int i = 0; i < n_layer; ++i) {
        st.before_mixer[i] = Buffer(DType::f32, {n, d});
        std::copy_n(h.ptr<float>(), n * d, st.before_mixer[i].ptr<float>());
        ops::rms_norm(h.view(), m.layers[i].attn_norm.view(), eps, xn.view());
        mixer_forward(m, i, b, xn.view(), y.view());
        ops::add_inplace(h.view(), y.view());
        if (keep_mid) {
            st.before_ffn[i] = Buffer(DType::f32, {n, d});
            std::copy_n(h.ptr<float>(), n * d, st.before_ffn[i].ptr<float>());
        }
        ops::rms_norm(h.view(), m.layers[i].ffn_norm.view(), eps, xn.view());
        if (ffn_inputs && m.cfg.layers[i].ffn != Ffn::dense) {
            (*ffn_inputs)[i] = Buffer(DType::f32, {n, d});
            std::copy_n(xn.ptr<float>(), n * d, (*ffn_inputs)[i].ptr<float>());
        }
        Routing routing;
        ffn_forward(m, i, xn.view(), y.view(), &routing);
        if (expert_load && m.cfg.layers[i].ffn != Ffn::dense) {
            std::vector<int64_t>& load = (*expert_load)[i];
            load.resize(routing.tokens_per_expert.size());
            for (size_t e = 0; e < load.size(); ++e)
                load[e] += routing.tokens_per_expert[e];
        }
        ops::add_inplace(h.view(), y.view());
    }
    st.out = std::move(h);
    return st;
}

// The masked cross-entropy over the rows with a target, and (when dh is given) ∂(scale·Σ loss)
// with respect to the last residual stream h [n, d].
LossSums loss_head(const Model& m, const TrainBatch& b, const Tensor& h, double scale, Buffer* dh) {
    const int64_t n = b.batch.n_tok(), d = m.cfg.hidden_size, V = m.cfg.vocab_size;
    const float eps = static_cast<float>(m.cfg.rms_norm_eps);
    std::vector<int64_t> rows;  // rows with a target
    for (int64_t t = 0; t < n; ++t)
        if (b.targets[t] >= 0)
            rows.push_back(t);
    Buffer normed(DType::f32, {n, d});
    ops::rms_norm(h, m.final_norm.view(), eps, normed.view());
    Buffer dnormed(DType::f32, {n, d});  // zero on rows without a target
    std::vector<uint8_t> right(static_cast<size_t>(n), 1);
    LossSums sums;
    const Tensor head = m.head().view();  // [V, d]
    for (size_t c = 0; c < rows.size(); c += kHeadRows) {
        const int64_t k = std::min<int64_t>(kHeadRows, static_cast<int64_t>(rows.size() - c));
        Buffer x(DType::f32, {k, d}), logits(DType::f32, {k, V});
        for (int64_t r = 0; r < k; ++r)
            std::copy_n(normed.ptr<float>() + rows[c + r] * d, d, x.ptr<float>() + r * d);
        ops::linear(x.view(), head, logits.view());
        for (int64_t r = 0; r < k; ++r) {
            float* z = logits.ptr<float>() + r * V;
            const int64_t target = b.targets[rows[c + r]];
            HYMOE_CHECK(target < V, "train: target id ", target, " outside the vocabulary");
            const int64_t best = std::max_element(z, z + V) - z;
            const double zmax = z[best];
            double sum = 0;
            for (int64_t v = 0; v < V; ++v)
                sum += std::exp(static_cast<double>(z[v]) - zmax);
            sums.loss += std::log(sum) + zmax - static_cast<double>(z[target]);
            sums.targets += 1;
            sums.correct += best == target;
            right[rows[c + r]] = best == target;
            for (int64_t v = 0; v < V; ++v)  // dlogits = scale·(softmax − onehot)
                z[v] = static_cast<float>(scale * std::exp(static_cast<double>(z[v]) - zmax) / sum);
            z[target] -= static_cast<float>(scale);
        }
        if (!dh)
            continue;
        Buffer dx(DType::f32, {k, d});  // [k, d] = dlogits · head
        ops::gemm(false,
                  false,
                  k,
                  d,
                  V,
                  1.0f,
                  logits.ptr<float>(),
                  V,
                  head.ptr<float>(),
                  d,
                  0.0f,
                  dx.ptr<float>(),
                  d);
        for (int64_t r = 0; r < k; ++r)
            std::copy_n(dx.ptr<float>() + r * d, d, dnormed.ptr<float>() + rows[c + r] * d);
    }
    for (int64_t s = 0; s < b.batch.n_seq(); ++s) {
        bool any = false, all = true;
        for (int64_t t = b.batch.offsets[s]; t < b.batch.offsets[s + 1]; ++t)
            if (b.targets[t] >= 0)
                any = true, all = all && right[t];
        sums.seqs += any;
        sums.seqs_correct += any && all;
    }
    if (dh) {
        *dh = Buffer(DType::f32, {n, d});
        ops::rms_norm_backward(h, m.final_norm.view(), eps, dnormed.view(), dh->view());
    }
    return sums;
}

// dh += ∂ through x ↦ norm(x; w) of dxn, at the block input x [n, d].
void add_norm_backward(const Tensor& x, const Buffer& w, float eps, const Tensor& dxn, Tensor& dh) {
    Buffer dx(DType::f32, x.shape);
    ops::rms_norm_backward(x, w.view(), eps, dxn, dx.view());
    ops::add_inplace(dh, dx.view());
}

}  // namespace

void LossSums::add(const LossSums& o) {
    loss += o.loss;
    targets += o.targets;
    correct += o.correct;
    seqs += o.seqs;
    seqs_correct += o.seqs_correct;
}

LossSums train_forward_backward(const Model& m, const TrainBatch& b, const TrainOptions& options) {
    check_trainable(m, b);
    const int64_t n = b.batch.n_tok(), d = m.cfg.hidden_size;
    const float eps = static_cast<float>(m.cfg.rms_norm_eps);
    Stream st = forward_stream(m, b, !options.recompute, options.expert_load, nullptr);
    Buffer dh;
    const LossSums sums = loss_head(m, b, st.out.view(), options.grad_scale, &dh);
    Buffer xn(DType::f32, {n, d}), dxn(DType::f32, {n, d}), y(DType::f32, {n, d});
    for (int i = static_cast<int>(m.cfg.layers.size()) - 1; i >= 0; --i) {
        const LayerSpec& spec = m.cfg.layers[i];
        const LayerWeights& lw = m.layers[i];
        Buffer& h_in = st.before_mixer[i];
        ops::rms_norm(h_in.view(), lw.attn_norm.view(), eps, xn.view());
        if (options.recompute) {  // the FFN's input: rerun the mixer
            mixer_forward(m, i, b, xn.view(), y.view());
            st.before_ffn[i] = Buffer(DType::f32, {n, d});
            std::copy_n(h_in.ptr<float>(), n * d, st.before_ffn[i].ptr<float>());
            ops::add_inplace(st.before_ffn[i].view(), y.view());
        }
        // h_out = h_mid + ffn(norm h_mid)
        Buffer& h_mid = st.before_ffn[i];
        Buffer xn2(DType::f32, {n, d});
        ops::rms_norm(h_mid.view(), lw.ffn_norm.view(), eps, xn2.view());
        if (spec.ffn == Ffn::dense)
            dense_ffn_backward(lw.dense, ExpertAct::swiglu, xn2.view(), dh.view(), dxn.view());
        else
            moe_backward(m.cfg, spec, lw.moe, xn2.view(), dh.view(), dxn.view());
        add_norm_backward(h_mid.view(), lw.ffn_norm, eps, dxn.view(), dh.view());
        h_mid = Buffer();
        // h_mid = h_in + mixer(norm h_in)
        if (spec.mixer == Mixer::kda)
            kda_backward(m.cfg, lw.kda, xn.view(), b.batch, dh.view(), dxn.view());
        else
            attention_backward(m.cfg, spec, lw.attn, xn.view(), b.batch, dh.view(), dxn.view());
        add_norm_backward(h_in.view(), lw.attn_norm, eps, dxn.view(), dh.view());
        h_in = Buffer();
    }
    return sums;
}

LossSums evaluate_loss(const Model& m, const TrainBatch& b) {
    check_trainable(m, b);
    const Stream st = forward_stream(m, b, false, nullptr, nullptr);
    return loss_head(m, b, st.out.view(), 1.0, nullptr);
}

std::vector<Buffer> router_distributions(const Model& m, const TrainBatch& b) {
    check_trainable(m, b);
    std::vector<Buffer> inputs(m.cfg.layers.size());
    forward_stream(m, b, false, nullptr, &inputs);
    const int64_t n = b.batch.n_tok(), E = m.cfg.moe.n_routed_experts;
    std::vector<Buffer> dist(m.cfg.layers.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
        if (inputs[i].view().data == nullptr)
            continue;
        dist[i] = Buffer(DType::f32, {n, E});
        ops::linear(inputs[i].view(), m.layers[i].moe.gate.view(), dist[i].view());
        float* p = dist[i].ptr<float>();
        if (m.cfg.moe.scoring == Scoring::softmax) {
            ops::softmax_rows(p, n, E);
            continue;
        }
        ops::sigmoid_inplace(dist[i].view());
        for (int64_t t = 0; t < n; ++t) {
            double z = 0;
            for (int64_t e = 0; e < E; ++e)
                z += static_cast<double>(p[t * E + e]);
            for (int64_t e = 0; e < E; ++e)
                p[t * E + e] = static_cast<float>(static_cast<double>(p[t * E + e]) / z);
        }
    }
    return dist;
}

}  // namespace hymoe::model
