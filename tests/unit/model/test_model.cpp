// The whole model on one rank, for the tiny presets of all three families: full-prompt prefill ==
// prefill in chunks == token-by-token decode (≤ 1e-4 on the logits), a packed batch == each
// sequence alone, and seeded init reproducible and keyed by tensor name.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include "hymoe/model/model.h"

namespace data = boost::unit_test::data;
using namespace hymoe::model;

namespace {

std::vector<int64_t> prompt(int64_t n, int64_t vocab, int64_t salt) {
    std::vector<int64_t> t(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
        t[i] = (i * 37 + salt * 11 + 5) % vocab;
    return t;
}

// Logits of every token of one sequence fed in pieces of the given lengths.
std::vector<float> run_pieces(const Model& m,
                              const std::vector<int64_t>& tokens,
                              const std::vector<int64_t>& pieces) {
    SequenceState st = make_sequence_state(m);
    std::vector<float> out;
    int64_t at = 0;
    for (int64_t len : pieces) {
        std::vector<int64_t> part(tokens.begin() + at, tokens.begin() + at + len);
        hymoe::Buffer logits;
        forward(m, part, single_sequence(len, at), {&st}, logits);
        out.insert(out.end(), logits.ptr<float>(), logits.ptr<float>() + logits.view().numel());
        at += len;
    }
    return out;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    BOOST_REQUIRE(a.size() == b.size());
    float m = 0;
    for (size_t i = 0; i < a.size(); ++i)
        m = std::max(m, std::abs(a[i] - b[i]));
    return m;
}

const std::vector<std::string> kPresets = {"tiny", "tiny-kimi", "tiny-deepseek"};

}  // namespace

BOOST_AUTO_TEST_SUITE(model_forward)

BOOST_DATA_TEST_CASE(prefill_equals_chunks_equals_decode, data::make(kPresets), preset) {
    Model m = make_model(preset_config(preset));
    init_model_random(m, 7);
    const int64_t n = 20;
    std::vector<int64_t> tokens = prompt(n, m.cfg.vocab_size, 1);
    std::vector<float> whole = run_pieces(m, tokens, {n});
    std::vector<float> chunks = run_pieces(m, tokens, {7, 9, 4});
    std::vector<float> decode = run_pieces(m, tokens, std::vector<int64_t>(n, 1));
    BOOST_TEST(max_abs_diff(whole, chunks) <= 1e-4f);
    BOOST_TEST(max_abs_diff(whole, decode) <= 1e-4f);
    BOOST_TEST(std::all_of(whole.begin(), whole.end(), [](float x) { return std::isfinite(x); }));
}

BOOST_DATA_TEST_CASE(packed_batch_equals_each_sequence_alone, data::make(kPresets), preset) {
    Model m = make_model(preset_config(preset));
    init_model_random(m, 11);
    std::vector<int64_t> a = prompt(9, m.cfg.vocab_size, 2), b = prompt(3, m.cfg.vocab_size, 3),
                         c = prompt(14, m.cfg.vocab_size, 4);
    std::vector<int64_t> packed = a;
    packed.insert(packed.end(), b.begin(), b.end());
    packed.insert(packed.end(), c.begin(), c.end());
    std::vector<SequenceState> st;
    for (int i = 0; i < 3; ++i)
        st.push_back(make_sequence_state(m));
    hymoe::Buffer logits;
    forward(m, packed, SeqBatch{{0, 9, 12, 26}, {0, 0, 0}, {}}, {&st[0], &st[1], &st[2]}, logits);
    std::vector<float> together(logits.ptr<float>(), logits.ptr<float>() + logits.view().numel());
    std::vector<float> alone = run_pieces(m, a, {9});
    for (const auto& seq : {b, c}) {
        std::vector<float> part = run_pieces(m, seq, {static_cast<int64_t>(seq.size())});
        alone.insert(alone.end(), part.begin(), part.end());
    }
    BOOST_TEST(max_abs_diff(together, alone) <= 1e-5f);
}

BOOST_AUTO_TEST_CASE(last_token_logits_match_the_full_rows) {
    Model m = make_model(preset_config("tiny"));
    init_model_random(m, 3);
    std::vector<int64_t> tokens = prompt(6, m.cfg.vocab_size, 5);
    std::vector<float> all = run_pieces(m, tokens, {6});
    SequenceState st = make_sequence_state(m);
    hymoe::Buffer last;
    forward(m, tokens, single_sequence(6), {&st}, last, {Logits::last});
    const int64_t V = m.cfg.vocab_size;
    BOOST_TEST(last.view().shape == hymoe::Shape({1, V}));
    std::vector<float> tail(all.end() - V, all.end());
    BOOST_TEST(max_abs_diff(tail, std::vector<float>(last.ptr<float>(), last.ptr<float>() + V)) <=
               1e-5f);  // GEMV vs GEMM summation order
}

BOOST_AUTO_TEST_CASE(random_init_is_seeded_and_keyed_by_name) {
    Model a = make_model(preset_config("tiny")), b = make_model(preset_config("tiny")),
          c = make_model(preset_config("tiny"));
    init_model_random(a, 5);
    init_model_random(b, 5);
    init_model_random(c, 6);
    TensorList la = model_tensors(a), lb = model_tensors(b), lc = model_tensors(c);
    bool same = true, differs = false;
    for (size_t i = 0; i < la.size(); ++i) {
        const float* x = la[i].dest->ptr<float>();
        const float* y = lb[i].dest->ptr<float>();
        const float* z = lc[i].dest->ptr<float>();
        const int64_t n = la[i].dest->view().numel();
        same = same && std::equal(x, x + n, y);
        differs = differs || !std::equal(x, x + n, z);
    }
    BOOST_TEST(same);
    BOOST_TEST(differs);
    // two tensors of the same shape draw different values (streams keyed by name)
    const hymoe::Buffer& q0 = a.layers[0].kda.q_proj;
    const hymoe::Buffer& k0 = a.layers[0].kda.k_proj;
    BOOST_TEST(!std::equal(q0.ptr<float>(), q0.ptr<float>() + 16, k0.ptr<float>()));
}

BOOST_AUTO_TEST_SUITE_END()
