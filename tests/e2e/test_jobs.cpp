// The built binary on good decks: the quickstart's --check at 4 ranks, a plan job that writes
// out/log and out/plan.h5 (/meta, grid coordinates written collectively), --set on the command
// line, the shipped Kimi-Linear and DeepSeek-V3.2 configs, and the command-line errors.
#include <boost/test/unit_test.hpp>

#include <filesystem>

#include "hymoe/core/sha256.h"
#include "hymoe/io/h5.h"
#include "hymoe/parallel/grid.h"
#include "run_binary.h"

namespace fs = std::filesystem;
using hymoe::testing::read_text;
using hymoe::testing::run_hymoe;

namespace {

const std::string kPlanDeck = "tests/decks/plan/deck.yaml";
const std::string kPlanOut = "tests/decks/plan/out";

bool contains(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(jobs)

BOOST_AUTO_TEST_CASE(quickstart_check_at_4_ranks_writes_nothing) {
    fs::remove_all("jobs/quickstart/out");
    auto r = run_hymoe("jobs/quickstart/deck.yaml --check", 4);
    BOOST_TEST(r.code == 0, r.err);
    BOOST_TEST(contains(r.out, "check passed"));
    BOOST_TEST(contains(r.out, "grid: world 4 = tp 2 x dp 2 x pp 1"));
    BOOST_TEST(contains(r.out, "  ep         2      2  0 1"));  // ep folds over tp first
    BOOST_TEST(contains(r.out, "  edp        2      2  0 2"));
    BOOST_TEST(contains(r.out, "max_new_tokens: 16"));        // the resolved deck is echoed
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
    auto r = run_hymoe(kPlanDeck + " --set parallel.dp=1 --set parallel.tp=2 --set parallel.ep=1",
                       2);
    BOOST_TEST(r.code == 0, r.err);
    hymoe::io::H5Reader h5(kPlanOut + "/plan.h5");
    BOOST_TEST(contains(h5.text("/meta/deck_resolved"), "tp: 2"));
    BOOST_TEST(h5.ints("/meta/grid_tp_dp_pp_ep_etp_edp") == std::vector<int64_t>({2, 1, 1, 1, 1, 2}));
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

BOOST_AUTO_TEST_CASE(kinds_not_built_yet_refuse_to_run_but_validate) {
    auto r = run_hymoe("jobs/quickstart/deck.yaml", 4);
    BOOST_TEST(r.code == 2);
    BOOST_TEST(contains(r.err, "job.kind: infer jobs are not available in this build yet"));
    BOOST_TEST(!fs::exists("jobs/quickstart/out"));
}

BOOST_AUTO_TEST_SUITE_END()
