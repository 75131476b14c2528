// The whole-model training pass (model/train.h) on the three tiny presets with adapters on every
// target (attention q/k/v/o, dense and shared-expert FFNs, routed experts): the adapters'
// gradients equal central finite differences of the summed loss (≤ 1e-3 relative, B nonzero so
// every path carries gradient; an entry whose ±ε straddles a discrete switch, a token's expert or
// DSA top-k choice, is recognised by the jump and left out); recompute gives the same gradients; a
// packed batch gives the sum of its sequences alone; and a fresh adapter (B = 0) leaves the base
// model's loss unchanged; and the same pass with the adapters as factor views on a Ctx (the GPU
// trainer's path) gives the host slots' loss and gradients.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include "hymoe/core/rng.h"
#include "hymoe/model/lora_factors.h"
#include "hymoe/model/lora_model.h"
#include "hymoe/model/train.h"
#include "train_setup.h"

namespace data = boost::unit_test::data;
using namespace hymoe;
using namespace hymoe::model;
using namespace hymoe::train_test;

namespace {

TrainBatch doc(const TrainBatch& b, int64_t s) {
    TrainBatch one;
    const int64_t begin = b.batch.offsets[s], n = b.batch.length(s);
    one.tokens.assign(b.tokens.begin() + begin, b.tokens.begin() + begin + n);
    one.targets.assign(b.targets.begin() + begin, b.targets.begin() + begin + n);
    one.batch = single_sequence(n);
    return one;
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
    BOOST_REQUIRE_EQUAL(a.size(), b.size());
    double diff = 0, scale = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        diff = std::max(diff, static_cast<double>(std::abs(a[i] - b[i])));
        scale = std::max(scale, static_cast<double>(std::abs(b[i])));
    }
    return diff / scale;
}

// Σ −log softmax(logits)[target] over b's target rows, the logits from the inference forward of
// the two-document batch (with b.media spliced in).
double forward_cross_entropy(const Model& m, const TrainBatch& b) {
    Buffer logits;
    SequenceState st0 = make_sequence_state(m), st1 = make_sequence_state(m);
    ForwardOptions o;
    o.media = &b.media;
    forward(m, b.tokens, b.batch, {&st0, &st1}, logits, o);
    double ce = 0;
    const int64_t V = m.cfg.vocab_size;
    for (size_t t = 0; t < b.tokens.size(); ++t) {
        if (b.targets[t] < 0)
            continue;
        const float* z = logits.ptr<float>() + static_cast<int64_t>(t) * V;
        const double zmax = *std::max_element(z, z + V);
        double sum = 0;
        for (int64_t v = 0; v < V; ++v)
            sum += std::exp(static_cast<double>(z[v]) - zmax);
        ce += std::log(sum) + zmax - static_cast<double>(z[b.targets[t]]);
    }
    return ce;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(train_pass)

BOOST_DATA_TEST_CASE(lora_gradients_match_finite_differences, data::make(kPresets), preset) {
    Setup s;
    make(s, preset, 0.1f);
    const TrainBatch b = two_docs(s.m.cfg.vocab_size);
    zero(s.lm);
    train_forward_backward(s.m, b, {});
    // every factor of every module: a few entries each, against central differences. Where the
    // loss is smooth over ±ε, |L(+ε) + L(−ε) − 2 L(0)| = ε²|L''| stays below 1e-5 (measured ≤
    // 8e-6); a routing or top-k switch inside ±ε adds its jump (measured ≥ 2.4e-3), so such an
    // entry, whose central difference measures the jump and not the gradient, is left out.
    std::vector<float> analytic, numeric;
    const float eps = 1e-2f;
    const double loss0 = evaluate_loss(s.m, b).loss;
    int64_t probe = 0, switched = 0;
    for (const TensorSpec& t : s.lm.tensors(0)) {
        const TensorList gl = s.lm.tensors(0, true);
        const TensorSpec* g = nullptr;
        for (const TensorSpec& x : gl)
            if (x.name == t.name)
                g = &x;
        BOOST_REQUIRE(g);
        const int64_t n = shape_numel(t.shape);
        for (int k = 0; k < 2; ++k, ++probe) {
            const int64_t i = (probe * 7919 + k * 104729) % n;
            float& w = t.dest->ptr<float>()[i];
            const float w0 = w;
            w = w0 + eps;
            const double up = evaluate_loss(s.m, b).loss;
            w = w0 - eps;
            const double down = evaluate_loss(s.m, b).loss;
            w = w0;
            if (std::abs(up + down - 2 * loss0) > 1e-4) {
                ++switched;
                continue;
            }
            numeric.push_back(static_cast<float>((up - down) / (2 * static_cast<double>(eps))));
            analytic.push_back(g->dest->ptr<float>()[i]);
        }
    }
    const double err = max_rel(analytic, numeric);
    BOOST_TEST_MESSAGE(preset << ": " << analytic.size() << " entries (" << switched
                              << " left out at a switch), max relative error " << err);
    BOOST_TEST(err <= 1e-3);
    BOOST_TEST(switched * 3 <= probe);  // at least two in three entries checked
}

BOOST_DATA_TEST_CASE(recompute_and_packing_agree, data::make(kPresets), preset) {
    Setup s;
    make(s, preset, 0.0f);
    const TrainBatch b = two_docs(s.m.cfg.vocab_size);
    zero(s.lm);
    const LossSums kept = train_forward_backward(s.m, b, {});
    const std::vector<float> g_kept = grads(s.lm);
    zero(s.lm);
    TrainOptions recompute;
    recompute.recompute = true;
    const LossSums again = train_forward_backward(s.m, b, recompute);
    BOOST_TEST(again.loss == kept.loss);
    BOOST_TEST(max_rel(grads(s.lm), g_kept) == 0.0);
    zero(s.lm);
    LossSums alone;
    alone.add(train_forward_backward(s.m, doc(b, 0), {}));
    alone.add(train_forward_backward(s.m, doc(b, 1), {}));
    BOOST_TEST(alone.targets == kept.targets);
    BOOST_TEST(std::abs(alone.loss - kept.loss) <= 1e-4 * std::abs(kept.loss));
    BOOST_TEST(max_rel(grads(s.lm), g_kept) <= 1e-4);
}

BOOST_DATA_TEST_CASE(fresh_adapter_leaves_the_base_loss, data::make(kPresets), preset) {
    Model m = make_model(preset_config(preset));
    init_model_random(m, 11);
    const TrainBatch b = two_docs(m.cfg.vocab_size);
    const double base = evaluate_loss(m, b).loss;
    LoraModel lm = attach_lora(m, {"q_proj", "v_proj", "o_proj"}, false);
    add_lora_adapter(lm, m.shard, 8, 2.0f, 1, true);
    BOOST_TEST(evaluate_loss(m, b).loss == base);
    // and the loss equals the forward's logits: −log softmax at the targets
    const double ce = forward_cross_entropy(m, b);
    BOOST_TEST(std::abs(ce - base) <= 1e-4 * base);
}

// Image tokens spliced over placeholder rows: the training loss equals the cross-entropy of the
// inference forward given the same MediaSplice.
BOOST_AUTO_TEST_CASE(media_rows_splice_as_in_the_forward) {
    Model m = make_model(preset_config("tiny"));
    init_model_random(m, 11);
    TrainBatch b = two_docs(m.cfg.vocab_size);
    const int64_t d = m.cfg.hidden_size;
    b.media.rows = {2, 3, 12};
    b.media.embeds = Buffer(DType::f32, {3, d});
    Philox(3, 0, 0).fill_normal(b.media.embeds.ptr<float>(), static_cast<size_t>(3 * d), 0, 1);
    for (int64_t r : b.media.rows)
        b.tokens[r] = m.cfg.vision.media_token_id;
    const double loss = evaluate_loss(m, b).loss;
    const double ce = forward_cross_entropy(m, b);
    BOOST_TEST(std::abs(ce - loss) <= 1e-4 * loss);
    b.media = MediaSplice{};
    BOOST_TEST(std::abs(evaluate_loss(m, b).loss - loss) > 1e-3);  // the splice mattered
}

// The pass on weight views with the adapters as factor views on a Ctx (model/lora_factors.h: the
// GPU trainer's path, here on a CPU context) gives the host slots' loss and gradients, each
// projection's adapter applied to its rows by one op instead of lora.h's run-wise loop, with the
// same dropout masks.
BOOST_DATA_TEST_CASE(factor_views_match_host_slots, data::make(kPresets), preset) {
    Setup s;
    make(s, preset, 0.1f);  // with dropout: the factor views draw the host slots' masks
    const TrainBatch b = two_docs(s.m.cfg.vocab_size);
    zero(s.lm);
    const LossSums host = train_forward_backward(s.m, b, {});
    const std::vector<float> want = grads(s.lm);
    zero(s.lm);
    const backend::Ctx ctx = backend::cpu_ctx();
    LoraFactors factors(ctx, s.m, s.lm);
    ModelViews views = factors.attach(model_views(s.m, named_views(s.m)));
    add_routing_host_side(views, s.m);
    const LossSums dev = train_forward_backward(TrainOn{s.m, ctx, views}, {&b, 1}, {});
    factors.download_grads();
    BOOST_TEST(std::abs(dev.loss - host.loss) <= 1e-6 * std::abs(host.loss));
    BOOST_TEST(dev.targets == host.targets);
    BOOST_TEST(max_rel(grads(s.lm), want) <= 1e-5);
}

BOOST_AUTO_TEST_SUITE_END()
