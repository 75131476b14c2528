// job.device through the built binary (runtime/device_choice.h) with the GPUs hidden, on a
// deck of experts over ep = 2 rebalanced, on 2 ranks: `cuda` exits 2 with one sentence naming
// job.device's line in the deck, before anything is written; `auto` runs the job on the CPU and
// logs one line saying why. The reason is the first limit the build meets: no CUDA backend in a
// CPU build, no GPU on the ranks in a CUDA build.
#include <cstdlib>
#include <filesystem>
#include <string>

#include <boost/test/unit_test.hpp>

#include "run_binary.h"

namespace fs = std::filesystem;
using hymoe::testing::read_text;
using hymoe::testing::run_hymoe;

namespace {

const std::string kDeck = "tests/decks/device/deck.yaml";
const std::string kOut = "tests/decks/device/out";

// Why this build refuses the GPU here: after "cuda, but " (cuda) or "the CPU, because " (auto).
std::string reason(bool cuda) {
#ifdef HYMOE_CUDA
    return cuda ? "not every rank sees a GPU (use auto to fall back to the CPU)"
                : "not every rank sees a GPU";
#else
    (void)cuda;
    return "this hymoe was built without CUDA (make CUDA=1 builds it)";
#endif
}

bool contains(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

// The runs see no GPU, also on a machine that has one (where `cuda` would run the deck).
struct NoGpus {
    NoGpus() { ::setenv("CUDA_VISIBLE_DEVICES", "", 1); }
    ~NoGpus() { ::unsetenv("CUDA_VISIBLE_DEVICES"); }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(device, *boost::unit_test::fixture<NoGpus>())

BOOST_AUTO_TEST_CASE(cuda_that_cannot_be_had_exits_2_with_one_sentence) {
    fs::remove_all(kOut);
    auto r = run_hymoe(kDeck, 2);
    BOOST_TEST(r.code == 2);
    const auto lines = r.err_lines();
    BOOST_TEST(lines.size() == 1u, "stderr:\n" << r.err);
    if (!lines.empty())
        BOOST_TEST(lines[0] == kDeck + ":5:64: job.device: cuda, but " + reason(true));
    BOOST_TEST(!fs::exists(kOut));  // refused before the output folder
}

BOOST_AUTO_TEST_CASE(auto_falls_back_to_the_cpu_and_says_why) {
    fs::remove_all(kOut);
    auto r = run_hymoe(kDeck + " --set job.device=auto", 2);
    BOOST_TEST(r.code == 0, r.err);
    const std::string line = "job.device: auto runs on the CPU, because " + reason(false);
    BOOST_TEST(contains(r.out, line), r.out);
    BOOST_TEST(contains(read_text(kOut + "/log"), line));
    BOOST_TEST(contains(r.out, "done: 3 requests"), r.out);
    BOOST_TEST(fs::exists(kOut + "/results.h5"));
    fs::remove_all(kOut);
}

BOOST_AUTO_TEST_CASE(cpu_logs_nothing_about_the_device) {
    fs::remove_all(kOut);
    auto r = run_hymoe(kDeck + " --set job.device=cpu", 2);
    BOOST_TEST(r.code == 0, r.err);
    BOOST_TEST(!contains(r.out, "job.device"), r.out);
    fs::remove_all(kOut);
}

BOOST_AUTO_TEST_SUITE_END()
