// The built binary on good decks: the quickstart's --check at 4 ranks, a plan job that writes
// out/log and out/plan.h5 (/meta, grid coordinates written collectively), --set on the command
// line, the shipped Kimi-Linear and DeepSeek-V3.2 configs, and the command-line errors.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>

#include <boost/test/unit_test.hpp>

#include "hymoe/core/sha256.h"
#include "hymoe/io/h5.h"
#include "hymoe/model/model.h"
#include "hymoe/parallel/grid.h"
#include "run_binary.h"

namespace fs = std::filesystem;
using hymoe::testing::read_text;
using hymoe::testing::run_hymoe;

namespace {

const std::string kPlanDeck = "tests/decks/plan/deck.yaml";
const std::string kPlanOut = "tests/decks/plan/out";
const std::string kFourRanks = "--set parallel.tp=2 --set parallel.dp=2 --set parallel.ep=2";

bool contains(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(jobs)

BOOST_AUTO_TEST_CASE(quickstart_check_at_4_ranks_writes_nothing) {
    fs::remove_all("jobs/quickstart/out");
    auto r = run_hymoe("jobs/quickstart/deck.yaml --check " + kFourRanks, 4);
    BOOST_TEST(r.code == 0, r.err);
    BOOST_TEST(contains(r.out, "check passed"));
    BOOST_TEST(contains(r.out, "grid: world 4 = tp 2 x dp 2 x pp 1"));
    BOOST_TEST(contains(r.out, "  ep         2      2  0 1"));  // ep folds over tp first
    BOOST_TEST(contains(r.out, "  edp        2      2  0 2"));
    BOOST_TEST(contains(r.out, "max_new_tokens: 16"));  // the resolved deck is echoed
    BOOST_TEST(!fs::exists("jobs/quickstart/out"));
}

BOOST_AUTO_TEST_CASE(plan_job_writes_log_and_plan_h5) {
    fs::remove_all(kPlanOut);
    auto r = run_hymoe(kPlanDeck, 2);
    BOOST_TEST(r.code == 0, r.err);
    BOOST_REQUIRE(fs::exists(kPlanOut + "/plan.h5"));
    BOOST_TEST(!fs::exists(kPlanOut + "/plan.h5.partial"));
    BOOST_TEST(contains(read_text(kPlanOut + "/log"), "grid: world 2 = tp 1 x dp 2 x pp 1"));
    hymoe::io::H5Reader h5(kPlanOut + "/plan.h5");
    std::string deck_text = read_text(kPlanDeck);
    BOOST_TEST(h5.text("/meta/deck") == deck_text);
    BOOST_TEST(h5.text("/meta/deck_sha256") == hymoe::sha256_hex(deck_text));
    BOOST_TEST(contains(h5.text("/meta/deck_resolved"), "ep: 2"));
    BOOST_TEST(contains(h5.text("/meta/model"), "hymoe"));
    BOOST_TEST(h5.text("/meta/build/backend").rfind("cpu", 0) == 0);
    BOOST_TEST(h5.shape("/grid/coords") == hymoe::Shape({2, 6}));
    std::vector<int64_t> c = h5.ints("/grid/coords");
    hymoe::parallel::Layout l{1, 2, 1, 2, 1};
    for (int rank = 0; rank < 2; ++rank) {
        hymoe::parallel::Coords x = hymoe::parallel::coords_of(l, rank);
        std::vector<int64_t> expect = {x.tp, x.dp, x.pp, x.ep, x.etp, x.edp};
        BOOST_TEST(std::vector<int64_t>(c.begin() + 6 * rank, c.begin() + 6 * rank + 6) == expect);
    }
    fs::remove_all(kPlanOut);
}

BOOST_AUTO_TEST_CASE(set_on_the_command_line_changes_the_layout) {
    fs::remove_all(kPlanOut);
    auto r =
        run_hymoe(kPlanDeck + " --set parallel.dp=1 --set parallel.tp=2 --set parallel.ep=1", 2);
    BOOST_TEST(r.code == 0, r.err);
    hymoe::io::H5Reader h5(kPlanOut + "/plan.h5");
    BOOST_TEST(contains(h5.text("/meta/deck_resolved"), "tp: 2"));
    BOOST_TEST(h5.ints("/meta/grid_tp_dp_pp_ep_etp_edp") ==
               std::vector<int64_t>({2, 1, 1, 1, 1, 2}));
    fs::remove_all(kPlanOut);
}

BOOST_AUTO_TEST_CASE(shipped_hf_configs_pass_check_at_their_layouts) {
    auto r = run_hymoe("tests/decks/kimi/deck.yaml --check", 2);
    BOOST_TEST(r.code == 0, r.err);
    BOOST_TEST(contains(r.out, "kimi_linear"));
    auto d = run_hymoe("tests/decks/deepseek/deck.yaml --check", 4);
    BOOST_TEST(d.code == 0, d.err);
    BOOST_TEST(contains(d.out, "deepseek_v32"));
}

BOOST_AUTO_TEST_CASE(a_failure_after_validation_leaves_no_file_under_the_real_name) {
    fs::remove_all(kPlanOut);
    fs::create_directories(kPlanOut + "/plan.h5.partial");  // HDF5 cannot create the file
    auto r = run_hymoe(kPlanDeck, 2);
    BOOST_TEST(r.code != 0);
    BOOST_TEST(contains(r.err, "creating tests/decks/plan/out/plan.h5.partial"), r.err);
    BOOST_TEST(contains(r.err, "[rank "));  // an error one rank saw: named and aborted
    BOOST_TEST(!fs::exists(kPlanOut + "/plan.h5"));
    fs::remove_all(kPlanOut);
}

BOOST_AUTO_TEST_CASE(command_line_errors_exit_2_with_one_line) {
    auto missing = run_hymoe("tests/decks/none.yaml");
    BOOST_TEST(missing.code == 2);
    BOOST_TEST(missing.err ==
               "tests/decks/none.yaml: cannot read the deck (No such file or directory)\n");
    auto option = run_hymoe(kPlanDeck + " --chek");
    BOOST_TEST(option.code == 2);
    BOOST_TEST(option.err_lines().size() == 1u);
    BOOST_TEST(contains(option.err, "unknown option '--chek'"));
    auto none = run_hymoe("");
    BOOST_TEST(none.code == 2);
    BOOST_TEST(contains(none.err, "no deck given; usage: mpirun -np N hymoe DECK.yaml"));
    auto help = run_hymoe("--help");
    BOOST_TEST(help.code == 0);
    BOOST_TEST(contains(help.out, "usage:"));
}

BOOST_AUTO_TEST_CASE(quickstart_runs_and_writes_results) {
    fs::remove_all("jobs/quickstart/out");
    auto r = run_hymoe("jobs/quickstart/deck.yaml", 1);
    BOOST_TEST(r.code == 0, r.err);
    hymoe::io::H5Reader h5("jobs/quickstart/out/results.h5");
    BOOST_TEST(h5.strings("/requests/id").size() == 320u);
    const std::string log = read_text("jobs/quickstart/out/log");
    BOOST_TEST(contains(log, "done: 320 requests"));
    // profile.layers: true — the per-layer table in the log and profile.h5
    BOOST_TEST(contains(log, "per-layer wall time"));
    hymoe::io::H5Reader profile("jobs/quickstart/out/profile.h5");
    BOOST_TEST(
        profile.strings("/layers/mixer") == (std::vector<std::string>{"kda", "kda", "kda", "dsa"}),
        boost::test_tools::per_element());
    std::vector<float> mixer = profile.floats("/layers/mixer_seconds");
    std::vector<float> ffn = profile.floats("/layers/ffn_seconds");
    BOOST_TEST(mixer.size() == 4u);
    BOOST_TEST(std::all_of(mixer.begin(), mixer.end(), [](float s) { return s > 0; }));
    BOOST_TEST(std::all_of(ffn.begin(), ffn.end(), [](float s) { return s > 0; }));
    std::vector<float> gemm = profile.floats("/layers/gemm_seconds");  // a part of mixer + ffn
    BOOST_TEST(gemm.size() == 4u);
    for (size_t i = 0; i < gemm.size() && i < mixer.size(); ++i)
        BOOST_TEST((gemm[i] > 0 && gemm[i] <= mixer[i] + ffn[i]));
    BOOST_TEST(profile.floats("/attention/indexer_seconds").at(0) > 0.0f);
    fs::remove_all("jobs/quickstart/out");
}

// The quickstart on 4 ranks (tp 2 × dp 2, experts over ep 2): one results.h5 with every request
// of the file in file order, and a profile with the expert load of every MoE layer.
BOOST_AUTO_TEST_CASE(quickstart_runs_on_four_ranks_into_one_results_file) {
    fs::remove_all("jobs/quickstart/out");
    auto r = run_hymoe("jobs/quickstart/deck.yaml " + kFourRanks, 4);
    BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
    hymoe::io::H5Reader results("jobs/quickstart/out/results.h5");
    const std::vector<int64_t> index = results.ints("/requests/index");
    BOOST_TEST(index.size() == 320u);
    BOOST_TEST(std::is_sorted(index.begin(), index.end()));
    BOOST_TEST(!fs::exists("jobs/quickstart/out/results.parts"));
    hymoe::io::H5Reader profile("jobs/quickstart/out/profile.h5");
    const std::vector<int64_t> per_expert = profile.ints("/experts/tokens_per_expert");
    const std::vector<int64_t> per_rank = profile.ints("/experts/tokens_per_rank");
    // every assignment is computed by one rank's hosted expert (etp 1): the two tables agree
    BOOST_TEST(std::accumulate(per_expert.begin(), per_expert.end(), int64_t{0}) ==
               std::accumulate(per_rank.begin(), per_rank.end(), int64_t{0}));
    BOOST_TEST(std::accumulate(per_expert.begin(), per_expert.end(), int64_t{0}) > 0);
    fs::remove_all("jobs/quickstart/out");
}

// parallel.rebalance_every on the quickstart at dp 4 × ep 4: the tiny model's group-limited
// router sends every token to one group of 4 experts, so the contiguous placement loads one or
// two ranks. Rebalancing moves experts between steps: the generated tokens stay those of one
// rank, the logprobs agree to 1e-5, and the profile's imbalance (max/mean of the assignments each
// rank computed) drops in every MoE layer.
BOOST_AUTO_TEST_CASE(expert_rebalancing_keeps_results_and_evens_the_load) {
    const std::string base = "jobs/quickstart/deck.yaml --set job.output=";
    const std::string ep4 = " --set parallel.dp=4 --set parallel.ep=4";
    BOOST_REQUIRE(run_hymoe(base + "out/one").code == 0);
    BOOST_REQUIRE(run_hymoe(base + "out/fixed" + ep4, 4).code == 0);
    auto r = run_hymoe(base + "out/moved" + ep4 + " --set parallel.rebalance_every=10", 4);
    BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
    hymoe::io::H5Reader one("jobs/quickstart/out/one/results.h5");
    hymoe::io::H5Reader moved("jobs/quickstart/out/moved/results.h5");
    BOOST_TEST(one.ints("/requests/output_tokens") == moved.ints("/requests/output_tokens"));
    const std::vector<float> a = one.floats("/requests/output_logprobs");
    const std::vector<float> b = moved.floats("/requests/output_logprobs");
    BOOST_REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i)
        BOOST_TEST(std::fabs(a[i] - b[i]) <= 1e-5f * std::max(1.0f, std::fabs(a[i])));
    const std::vector<float> before =
        hymoe::io::H5Reader("jobs/quickstart/out/fixed/profile.h5").floats("/experts/imbalance");
    const std::vector<float> after =
        hymoe::io::H5Reader("jobs/quickstart/out/moved/profile.h5").floats("/experts/imbalance");
    BOOST_REQUIRE(before.size() == 4u && after.size() == 4u);
    for (size_t i = 1; i < 4; ++i)  // layer 0 is dense
        BOOST_TEST(after[i] < before[i], "layer " << i << ": " << before[i] << " -> " << after[i]);
    const std::string log = read_text("jobs/quickstart/out/moved/log");
    BOOST_TEST(contains(log, "experts rebalanced"));
    fs::remove_all("jobs/quickstart/out");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(scoring)

// The binary's results.h5 equals the same model run in process (same preset, same seed).
BOOST_AUTO_TEST_CASE(results_match_an_in_process_forward) {
    const std::string out = "tests/decks/score/out";
    fs::remove_all(out);
    auto r = run_hymoe("tests/decks/score/deck.yaml");
    BOOST_TEST(r.code == 0, r.err);
    BOOST_REQUIRE(fs::exists(out + "/results.h5"));
    hymoe::io::H5Reader h5(out + "/results.h5");
    std::vector<std::string> ids = h5.strings("/requests/id");
    BOOST_TEST(ids == (std::vector<std::string>{"q1", "q2", "q3"}),
               boost::test_tools::per_element());
    std::vector<int64_t> len = h5.ints("/requests/prompt_len");
    std::vector<int64_t> offsets = h5.ints("/requests/logprob_offsets");
    std::vector<float> lp = h5.floats("/requests/prompt_logprobs");
    std::vector<int64_t> greedy = h5.ints("/requests/greedy_token");
    BOOST_TEST(len == (std::vector<int64_t>{4, 3, 6}), boost::test_tools::per_element());
    BOOST_TEST(offsets == (std::vector<int64_t>{0, 3, 5, 10}), boost::test_tools::per_element());

    hymoe::model::Model m = hymoe::model::make_model(hymoe::model::preset_config("tiny"));
    hymoe::model::init_model_random(m, 99);
    const std::vector<std::vector<int64_t>> prompts = {
        {1, 5, 9, 12}, {3, 3, 7}, {200, 17, 42, 99, 128, 5}};
    const int64_t V = m.cfg.vocab_size;
    for (size_t s = 0; s < prompts.size(); ++s) {
        const auto& p = prompts[s];
        hymoe::model::SequenceState st = hymoe::model::make_sequence_state(m);
        hymoe::Buffer logits;
        hymoe::model::forward(
            m, p, hymoe::model::single_sequence(static_cast<int64_t>(p.size())), {&st}, logits);
        for (size_t t = 0; t + 1 < p.size(); ++t) {
            const float* row = logits.ptr<float>() + t * V;
            double mx = *std::max_element(row, row + V), sum = 0;
            for (int64_t j = 0; j < V; ++j)
                sum += std::exp(static_cast<double>(row[j]) - mx);
            double expect = static_cast<double>(row[p[t + 1]]) - mx - std::log(sum);
            BOOST_TEST(lp[offsets[s] + t] == expect, boost::test_tools::tolerance(1e-4));
            BOOST_TEST(lp[offsets[s] + t] < 0.0f);
        }
        const float* last = logits.ptr<float>() + (p.size() - 1) * V;
        BOOST_TEST(greedy[s] == std::max_element(last, last + V) - last);
    }
    BOOST_TEST(contains(read_text(out + "/log"), "scored 3 requests"));
    fs::remove_all(out);
}

BOOST_AUTO_TEST_CASE(a_bad_request_line_exits_3_naming_file_and_line) {
    fs::create_directories("tests/decks/score/tmp");
    std::ofstream("tests/decks/score/tmp/bad.jsonl") << "{\"id\": \"a\", \"tokens\": [1, 2]}\n"
                                                     << "{\"id\": \"b\", \"tokens\": [1, -2]}\n";
    auto fail = run_hymoe("tests/decks/score/deck.yaml --set inference.dataset=tmp/bad.jsonl");
    BOOST_TEST(fail.code == 3);
    BOOST_TEST(fail.err ==
               "tests/decks/score/tmp/bad.jsonl:2: \"tokens\" holds -2, not a token id\n");
    auto skip = run_hymoe(
        "tests/decks/score/deck.yaml --set inference.dataset=tmp/bad.jsonl "
        "--set inference.on_bad_request=skip");
    BOOST_TEST(skip.code == 0, skip.err);
    BOOST_TEST(contains(skip.out, "scored 1 requests (2 tokens, 1 skipped)"));
    fs::remove_all("tests/decks/score/tmp");
    fs::remove_all("tests/decks/score/out");
}

BOOST_AUTO_TEST_SUITE_END()
