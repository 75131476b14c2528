// analysis/ on real outputs: the quickstart at 1 rank and at 4 (tp 2 × dp 2 × ep 2), then
// analysis/report.py on each out/ folder and analysis/compare.py on the pair; the lora-quickstart
// at two learning rates through both; a synthetic lora results.h5
// (tests/analysis/make_lora_results.py, the trainer's schema) through both scripts, and one with
// datasets left out; and tests/analysis/check_analysis.py's hand cases. Every plot the
// data allows must exist as a non-empty PNG that index.html shows; missing data must give a note
// on the page, never a failure. The scripts run with HYMOE_PYTHON (default /usr/bin/python3).
#include <cstdlib>
#include <filesystem>
#include <string>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "run_binary.h"

namespace fs = std::filesystem;
using hymoe::testing::read_text;
using hymoe::testing::run_hymoe;

namespace {

struct Script {
    int code = -1;
    std::string out;  // stdout and stderr together
};

// Runs a Python script of the repository with its arguments, as the README says to.
Script python(const std::string& args) {
    const char* py = std::getenv("HYMOE_PYTHON");
    const fs::path log = fs::temp_directory_path() / ("hymoe_py_" + std::to_string(::getpid()));
    const std::string cmd =
        std::string(py ? py : "/usr/bin/python3") + " " + args + " >" + log.string() + " 2>&1";
    const int status = std::system(cmd.c_str());
    Script s{WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), read_text(log)};
    fs::remove(log);
    return s;
}

bool contains(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

// Each NAME.png of dir is a PNG file of more than a header's size and index.html shows it.
void check_plots(const std::string& dir, const std::vector<std::string>& names) {
    const std::string page = read_text(dir + "/index.html");
    BOOST_TEST(contains(page, "</html>"), dir);
    for (const std::string& n : names) {
        const std::string png = dir + "/" + n + ".png";
        BOOST_TEST_CONTEXT(png) {
            BOOST_TEST(fs::exists(png));
            BOOST_TEST(read_text(png).rfind("\x89PNG\r\n\x1a\n", 0) == 0u);
            BOOST_TEST((fs::exists(png) && fs::file_size(png) > 2000u));  // axes, not a blank
            BOOST_TEST(contains(page, "src='" + n + ".png'"));
        }
    }
}

const std::string kQuick = "jobs/quickstart/deck.yaml --set job.output=out/analysis/";
const std::vector<std::string> kInferPlots = {
    "layers", "rank_layers", "roofline", "expert_load", "moe_comm", "memory", "requests"};
const std::vector<std::string> kLoraPlots = {
    "loss", "accuracy", "optimizer", "throughput", "train_expert_load", "drift"};

// This process's scratch folder, removed at the end of each test case.
fs::path scratch() {
    return fs::temp_directory_path() / ("hymoe_analysis_" + std::to_string(::getpid()));
}

fs::path temp_dir(const std::string& name) {
    fs::create_directories(scratch() / name);
    return scratch() / name;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(analysis)

BOOST_AUTO_TEST_CASE(hand_cases_of_the_scripts) {
    Script s = python("tests/analysis/check_analysis.py");
    BOOST_TEST(s.code == 0, s.out);
    BOOST_TEST(contains(s.out, "check_analysis: 6 passed, 0 failed"), s.out);
}

BOOST_AUTO_TEST_CASE(quickstart_report_and_compare_one_and_four_ranks) {
    fs::remove_all("jobs/quickstart/out/analysis");
    auto one = run_hymoe(kQuick + "np1", 1);
    BOOST_REQUIRE_MESSAGE(one.code == 0, one.err);
    auto four =
        run_hymoe(kQuick + "np4 --set parallel.tp=2 --set parallel.dp=2 --set parallel.ep=2", 4);
    BOOST_REQUIRE_MESSAGE(four.code == 0, four.err);
    for (const std::string run : {"np1", "np4"}) {
        const std::string out = "jobs/quickstart/out/analysis/" + run;
        Script s = python("analysis/report.py " + out);
        BOOST_TEST(s.code == 0, s.out);
        check_plots(out + "/report", kInferPlots);
        // the quickstart ends in under 5 s: no progress lines, said on the page
        BOOST_TEST(contains(read_text(out + "/report/index.html"), "has no progress lines"));
    }
    // --html puts the page elsewhere; the plots stay in OUT_DIR/report
    const fs::path page = temp_dir("page") / "q.html";
    BOOST_TEST(python("analysis/report.py jobs/quickstart/out/analysis/np1 --html " + page.string())
                   .code == 0);
    BOOST_TEST(contains(read_text(page.string()), "layers.png"));

    const std::string cmp = "jobs/quickstart/out/analysis/compare";
    Script c = python(
        "analysis/compare.py jobs/quickstart/out/analysis/np1 "
        "jobs/quickstart/out/analysis/np4 --out " +
        cmp);
    BOOST_TEST(c.code == 0, c.out);
    check_plots(cmp, {"agreement", "logprobs", "layers"});
    // the layouts generate the same tokens (test_jobs.cpp, test_parallel.cpp)
    BOOST_TEST(contains(c.out, "requests: 320 in both (0 only in A, 0 only in B)"), c.out);
    BOOST_TEST(contains(c.out, "identical: 320 of 320"), c.out);
    BOOST_TEST(contains(c.out, "match (rate 1.0000)"), c.out);
    BOOST_TEST(contains(c.out, "logprobs over matching prefixes ("), c.out);
    fs::remove_all("jobs/quickstart/out");
    fs::remove_all(scratch());
}

BOOST_AUTO_TEST_CASE(synthetic_lora_report_and_compare) {
    const fs::path a = temp_dir("lora-a"), b = temp_dir("lora-b");
    BOOST_REQUIRE(python("tests/analysis/make_lora_results.py " + a.string()).code == 0);
    BOOST_REQUIRE(
        python("tests/analysis/make_lora_results.py " + b.string() + " --seed 2 --steps 80").code ==
        0);
    Script s = python("analysis/report.py " + a.string());
    BOOST_TEST(s.code == 0, s.out);
    check_plots(a.string() + "/report", kLoraPlots);
    Script c = python("analysis/compare.py " + a.string() + " " + b.string());
    BOOST_TEST(c.code == 0, c.out);
    check_plots(a.string() + "/compare", {"loss"});
    BOOST_TEST(contains(c.out, "final train loss: A "), c.out);
    fs::remove_all(scratch());
}

// The real lora-quickstart (shortened to 20 steps) and a run at another learning rate: every
// lora plot from the trainer's own results.h5, and compare.py's loss curves of the pair.
BOOST_AUTO_TEST_CASE(lora_quickstart_report_and_compare) {
    const fs::path a = temp_dir("lq-a"), b = temp_dir("lq-b");
    const std::string deck =
        "jobs/lora-quickstart/deck.yaml --set finetune.steps=20 "
        "--set finetune.eval.every=10 --set job.output=";
    BOOST_REQUIRE_EQUAL(run_hymoe(deck + a.string(), 1).code, 0);
    BOOST_REQUIRE_EQUAL(run_hymoe(deck + b.string() + " --set finetune.optimizer.lr=1e-3", 1).code,
                        0);
    Script s = python("analysis/report.py " + a.string());
    BOOST_TEST(s.code == 0, s.out);
    check_plots(a.string() + "/report", kLoraPlots);
    Script c = python("analysis/compare.py " + a.string() + " " + b.string());
    BOOST_TEST(c.code == 0, c.out);
    check_plots(a.string() + "/compare", {"loss"});
    fs::remove_all(scratch());
}

// Data a plot needs and the run lacks: the plot is skipped with a note naming it, the rest drawn.
BOOST_AUTO_TEST_CASE(missing_data_gives_notes_not_failures) {
    const fs::path lora = temp_dir("lora-partial");
    BOOST_REQUIRE(python("tests/analysis/make_lora_results.py " + lora.string() +
                         " --drop /eval --drop /drift/kl --drop /experts")
                      .code == 0);
    Script s = python("analysis/report.py " + lora.string());
    BOOST_TEST(s.code == 0, s.out);
    const std::string page = read_text(lora.string() + "/report/index.html");
    BOOST_TEST(contains(page, "results.h5 has no /eval/step"));
    BOOST_TEST(contains(page, "skipped: results.h5 has no /experts/layers"));
    BOOST_TEST(contains(page, "results.h5 has no /drift/kl"));
    check_plots(lora.string() + "/report", {"loss", "optimizer", "throughput", "drift"});
    BOOST_TEST(!fs::exists(lora.string() + "/report/train_expert_load.png"));

    // an infer results.h5 alone (profile.layers off): the profile's plots are skipped
    const fs::path infer = temp_dir("infer-results-only");
    auto r =
        run_hymoe("tests/decks/parallel/hymoe.yaml --set profile.experts=false --set job.output=" +
                      infer.string(),
                  1);
    BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
    BOOST_REQUIRE(!fs::exists(infer / "profile.h5"));
    s = python("analysis/report.py " + infer.string());
    BOOST_TEST(s.code == 0, s.out);
    BOOST_TEST(contains(read_text(infer.string() + "/report/index.html"),
                        "skipped: profile.h5 is absent"));
    check_plots(infer.string() + "/report", {"requests"});

    // no HDF5 output at all: exit 2 with one line
    s = python("analysis/report.py " + temp_dir("empty").string());
    BOOST_TEST(s.code == 2);
    BOOST_TEST(contains(s.out, "no results.h5, profile.h5 or plan.h5"), s.out);
    fs::remove_all(scratch());
}

BOOST_AUTO_TEST_SUITE_END()
