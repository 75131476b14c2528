// The one inference forward on a CPU context through a ModelOn (model/model_on.h): the last rows
// reduced on the pass's device to their top tokens (TopLogits, what a GPU step sends the host)
// give the sampler's tokens, logits and logprobs of the whole rows, for the three tiny families;
// a call that asks for top tokens of every row is refused.
#include <cstdint>
#include <string>
#include <vector>

#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include "hymoe/core/error.h"
#include "hymoe/model/model_on.h"
#include "hymoe/runtime/sampler.h"

namespace data = boost::unit_test::data;
using namespace hymoe;
using namespace hymoe::model;

namespace {

const std::vector<std::string> kPresets = {"tiny", "tiny-kimi", "tiny-deepseek"};

// Two sequences of 5 and 3 tokens.
SeqBatch two_sequences() {
    SeqBatch b;
    b.offsets = {0, 5, 8};
    b.pos0 = {0, 0};
    return b;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(forward_on)

BOOST_DATA_TEST_CASE(top_logits_equal_the_rows, data::make(kPresets), preset) {
    Model m = make_model(preset_config(preset));
    init_model_random(m, 11);
    const ModelViews views = host_views(m);
    const ModelOn on{m, m.ctx, views};
    const std::vector<int64_t> tokens = {5, 9, 17, 3, 40, 7, 7, 100};
    const SeqBatch batch = two_sequences();
    const int64_t V = m.cfg.vocab_size;

    SequenceState full_st[2] = {make_sequence_state(m), make_sequence_state(m)};
    Buffer logits;
    forward(on, tokens, batch, {&full_st[0], &full_st[1]}, logits, {Logits::last});
    BOOST_REQUIRE(logits.view().shape == (Shape{2, V}));

    SequenceState top_st[2] = {make_sequence_state(m), make_sequence_state(m)};
    TopLogits top;
    top.n = 6;
    Buffer none;
    forward(on, tokens, batch, {&top_st[0], &top_st[1]}, none, {Logits::last}, &top);
    BOOST_TEST(none.view().data == nullptr);
    BOOST_REQUIRE(top.tokens.size() == 12u);
    for (int64_t r = 0; r < 2; ++r) {
        const float* row = logits.ptr<float>() + r * V;
        std::vector<int64_t> want(6);
        std::vector<float> logprobs(6);
        runtime::top_logprobs(row, V, 6, want.data(), logprobs.data());
        for (int64_t j = 0; j < 6; ++j) {
            const auto k = static_cast<size_t>(r * 6 + j);
            BOOST_TEST(top.tokens[k] == want[static_cast<size_t>(j)]);
            BOOST_TEST(top.logits[k] == row[top.tokens[k]]);
            const double lp = static_cast<double>(top.logits[k]) -
                              static_cast<double>(top.logits[static_cast<size_t>(r * 6)]) -
                              top.log_sum[static_cast<size_t>(r)];
            BOOST_TEST(lp == runtime::token_logprob(row, V, top.tokens[k]));
        }
    }
    BOOST_TEST(top_st[0].n_tokens == 5);
    BOOST_TEST(top_st[1].n_tokens == 3);
}

BOOST_AUTO_TEST_CASE(top_logits_need_last_rows) {
    Model m = make_model(preset_config("tiny"));
    init_model_random(m, 11);
    const ModelViews views = host_views(m);
    SequenceState st = make_sequence_state(m);
    TopLogits top;
    top.n = 2;
    Buffer logits;
    BOOST_CHECK_THROW(forward(ModelOn{m, m.ctx, views},
                              {1, 2},
                              single_sequence(2),
                              {&st},
                              logits,
                              {Logits::all},
                              &top),
                      Error);
    BOOST_TEST(st.n_tokens == 0);  // refused before anything ran
}

BOOST_AUTO_TEST_SUITE_END()
