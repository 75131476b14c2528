// The lora job as users watch it: step lines every finetune.log_every steps whose loss and grad
// norm are the means of results.h5's steps in the interval (lr and tokens/s from the same rows);
// results.h5 rewritten while the job runs (a kill -9 leaves a readable file, status "running",
// whose steps are a multiple of log_every and a bit-identical prefix of the uninterrupted run's,
// and the rerun ends bit-identical); the best evaluation's checkpoint named by checkpoints/best
// and kept past checkpoint.keep, its adapter in adapters/best equal to a run stopped at that
// step; early stopping exactly where the evaluations say, exit 0 with the final checkpoint and
// adapter, a rerun doing nothing more, and a run stopped by job.max_hours resuming to the same end.
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <thread>

#include <boost/test/unit_test.hpp>

#include "hymoe/io/h5.h"
#include "run_binary.h"

namespace fs = std::filesystem;
using namespace hymoe;

namespace {

const std::string kSmall = "tests/decks/lora/small.yaml", kWatch = "tests/decks/lora/watch.yaml";

std::string scratch(const std::string& name) {
    const fs::path p = fs::temp_directory_path() / ("hymoe-lora-live-" + name);
    fs::remove_all(p);
    return p.string();
}

testing::RunResult run(const std::string& deck, const std::string& out, const std::string& extra) {
    return testing::run_hymoe(deck + " --set job.output=" + out + " " + extra, 1);
}

// The step folder a checkpoints/ pointer file (latest, best) names.
std::string pointer(const std::string& out, const std::string& name) {
    const std::string text = testing::read_text(out + "/checkpoints/" + name);
    return text.substr(0, text.find('\n'));
}

struct StepLine {
    int64_t step = 0, first = 0;
    double loss = 0, lr = 0, grad_norm = 0, tokens_per_s = 0;
};

// Every step line of a log.
std::vector<StepLine> step_lines(const std::string& log, int64_t steps) {
    static const std::regex line("step ([0-9]+)/" + std::to_string(steps) +
                                 ": loss ([0-9.]+)(?: \\(mean of steps ([0-9]+)-[0-9]+\\))?, lr "
                                 "([0-9.e+-]+), grad norm ([0-9.]+), ([0-9.]+) tokens/s.*, ETA "
                                 "[0-9]+ s");
    std::vector<StepLine> v;
    for (std::sregex_iterator it(log.begin(), log.end(), line), end; it != end; ++it) {
        const std::smatch& m = *it;
        StepLine s;
        s.step = std::stoll(m[1]);
        s.loss = std::stod(m[2]);
        s.first = m[3].matched ? std::stoll(m[3]) : s.step;
        s.lr = std::stod(m[4]);
        s.grad_norm = std::stod(m[5]);
        s.tokens_per_s = std::stod(m[6]);
        v.push_back(s);
    }
    return v;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(lora_live)

// log_every: 5 over 12 steps prints steps 5, 10 and 12 (the last, a short interval), each the
// mean of its steps as results.h5 holds them (printed to 4 decimals); then a run killed mid-way
// with log_every: 3 left a results.h5 that a reader could open while it ran.
BOOST_AUTO_TEST_CASE(step_lines_every_n_steps_and_results_while_running) {
    const std::string ref = scratch("every5");
    const std::string twelve = "--set finetune.steps=12 --set finetune.checkpoint.every=3 ";
    const testing::RunResult r = run(kSmall, ref, twelve + "--set finetune.log_every=5");
    BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
    const io::H5Reader h(ref + "/results.h5");
    const std::vector<float> loss = h.floats("/train/loss");
    auto doubles = [&](const char* name) {
        const std::vector<float> f = h.floats(name);
        return std::vector<double>(f.begin(), f.end());
    };
    const std::vector<double> mean_of = doubles("/train/loss"), norm = doubles("/train/grad_norm"),
                              lr = doubles("/train/lr"), tokens = doubles("/train/tokens"),
                              seconds = doubles("/train/seconds");
    BOOST_REQUIRE_EQUAL(loss.size(), 12u);
    BOOST_TEST(h.text("/train/status") == "done");
    const std::vector<StepLine> lines = step_lines(testing::read_text(ref + "/log"), 12);
    BOOST_REQUIRE_EQUAL(lines.size(), 3u);
    const int64_t want[3][2] = {{1, 5}, {6, 10}, {11, 12}};
    for (size_t i = 0; i < 3; ++i) {
        const StepLine& s = lines[i];
        BOOST_TEST(s.first == want[i][0]);
        BOOST_TEST(s.step == want[i][1]);
        double l = 0, g = 0, t = 0, sec = 0;
        for (int64_t k = s.first - 1; k < s.step; ++k)
            l += mean_of[k], g += norm[k], t += tokens[k], sec += seconds[k];
        const auto n = static_cast<double>(s.step - s.first + 1);
        BOOST_TEST(std::abs(s.loss - l / n) <= 6e-5, "step " << s.step);
        BOOST_TEST(std::abs(s.grad_norm - g / n) <= 6e-5, "step " << s.step);
        BOOST_TEST(std::abs(s.lr - lr[s.step - 1]) <= 1e-3 * lr[s.step - 1]);
        BOOST_TEST(std::abs(s.tokens_per_s - t / sec) <= 1e-3 * (t / sec) + 0.05);
    }

    // kill -9 once results.h5 holds 6 steps; the file is complete under its name at every moment
    const std::string killed = scratch("killed");
    const char* bin = std::getenv("HYMOE_BIN");
    const std::string exe = bin ? bin : "build/hymoe", pidfile = killed + ".pid";
    fs::remove(pidfile);
    std::system(("(" + exe + " " + kSmall + " --set job.output=" + killed + " " + twelve +
                 "--set finetune.log_every=3 >/dev/null 2>&1 & echo $! >" + pidfile + ".tmp; mv " +
                 pidfile + ".tmp " + pidfile + "; wait) &")
                    .c_str());
    for (int i = 0; i < 2000 && !fs::exists(pidfile); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const pid_t pid = std::stoi(testing::read_text(pidfile));
    size_t seen = 0;
    for (int i = 0; i < 3000 && seen < 6; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        if (fs::exists(killed + "/results.h5"))
            seen = io::H5Reader(killed + "/results.h5").floats("/train/loss").size();
    }
    ::kill(pid, SIGKILL);
    for (int i = 0; i < 2000 && ::kill(pid, 0) == 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    BOOST_REQUIRE_GE(seen, 6u);
    const io::H5Reader live(killed + "/results.h5");
    const std::vector<float> part = live.floats("/train/loss");
    BOOST_TEST(live.text("/train/status") == "running");
    BOOST_TEST(part.size() % 3 == 0u);
    BOOST_TEST(part.size() < 12u);
    BOOST_TEST(part == std::vector<float>(loss.begin(), loss.begin() + part.size()));
    const testing::RunResult again = run(kSmall, killed, twelve + "--set finetune.log_every=3");
    BOOST_REQUIRE_EQUAL(again.code, 0);
    BOOST_TEST(io::H5Reader(killed + "/results.h5").floats("/train/loss") == loss);  // bit for bit
}

// tests/decks/lora/watch.yaml: evaluation every 2 steps on the general set, early stopping with
// patience 3 and min_delta 0.001, checkpoints every 2 steps with keep: 1.
BOOST_AUTO_TEST_CASE(best_checkpoint_and_early_stopping) {
    const std::string out = scratch("watch");
    const testing::RunResult r = run(kWatch, out, "");
    BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
    const io::H5Reader h(out + "/results.h5");
    const std::vector<int64_t> eval_step = h.ints("/eval/step");
    const std::vector<float> metric = h.floats("/eval/general_loss");
    const std::vector<float> loss = h.floats("/train/loss");
    // the stop and the best worked out from the evaluations (step 0 is the base model)
    int64_t stop = -1, best = -1, stale = 0;
    double low = 0;
    for (size_t i = 1; i < eval_step.size() && stop < 0; ++i) {
        const double v = metric[i];
        stale = best < 0 || v < low - 0.001 ? 0 : stale + 1;
        if (best < 0 || v < low)
            low = v, best = eval_step[i];
        if (stale >= 3)
            stop = eval_step[i];
    }
    BOOST_TEST_MESSAGE("early stop at step " << stop << ", best " << best);
    BOOST_REQUIRE(stop > 0 && stop < 40);  // the deck is made to stop early
    BOOST_TEST(eval_step.back() == stop);
    BOOST_TEST(loss.size() == static_cast<size_t>(stop));
    BOOST_TEST(h.text("/train/status") == "early_stopped");
    BOOST_TEST(h.text("/eval/metric") == "general_loss");
    BOOST_TEST(h.ints("/eval/best_step") == std::vector<int64_t>{best});
    BOOST_TEST(r.out.find("early stopping after step " + std::to_string(stop) +
                          ": general_loss has not improved by more than 0.001 for 3 "
                          "evaluations") != std::string::npos,
               r.out);
    BOOST_TEST(pointer(out, "latest") == "step_" + std::to_string(stop));
    BOOST_TEST(pointer(out, "best") == "step_" + std::to_string(best));
    BOOST_TEST(fs::exists(out + "/checkpoints/step_" + std::to_string(best) + "/manifest.json"));
    BOOST_TEST(best < stop);  // so keep: 1 would have pruned it
    BOOST_TEST(fs::exists(out + "/adapters/final/adapter_model.safetensors"));
    // adapters/best is the adapter after step `best`: a run of that many steps ends with it (the
    // deck's lr is constant after warm-up, so it does not depend on finetune.steps)
    const std::string upto = scratch("upto-best");
    BOOST_REQUIRE_EQUAL(run(kWatch, upto, "--set finetune.steps=" + std::to_string(best)).code, 0);
    BOOST_TEST((testing::read_text(out + "/adapters/best/adapter_model.safetensors") ==
                testing::read_text(upto + "/adapters/final/adapter_model.safetensors")));
    // a rerun of the stopped job trains no further
    const testing::RunResult again = run(kWatch, out, "");
    BOOST_REQUIRE_EQUAL(again.code, 0);
    BOOST_TEST(again.out.find("early stopping after step " + std::to_string(stop)) !=
               std::string::npos);
    BOOST_TEST(io::H5Reader(out + "/results.h5").floats("/train/loss") == loss);
    // stopped after step 1 (exit 75), then resumed: the same stop, best and losses
    const std::string cut = scratch("watch-cut");
    BOOST_REQUIRE_EQUAL(run(kWatch, cut, "--set job.max_hours=1e-9").code, 75);
    BOOST_TEST(io::H5Reader(cut + "/results.h5").text("/train/status") == "stopped");
    BOOST_REQUIRE_EQUAL(run(kWatch, cut, "").code, 0);
    const io::H5Reader c(cut + "/results.h5");
    BOOST_TEST(c.floats("/train/loss") == loss);  // bit for bit
    BOOST_TEST(c.ints("/eval/best_step") == std::vector<int64_t>{best});
    BOOST_TEST(pointer(cut, "best") == "step_" + std::to_string(best));
    BOOST_TEST((testing::read_text(cut + "/adapters/best/adapter_model.safetensors") ==
                testing::read_text(out + "/adapters/best/adapter_model.safetensors")));
}

BOOST_AUTO_TEST_SUITE_END()
