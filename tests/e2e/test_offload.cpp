// E2E tests of inference.kv_cache.offload: file (runtime/kv_spill.h). The offload deck
// (tiny-deepseek, four DSA layers) run with the pages paged through a spill file gives results.h5
// equal to the in-memory run in every dataset, logprobs bit for bit, sampled and greedy, at one
// rank and at pp 2 (two ranks, two lanes a rank); the log and profile.h5 report the KV bytes held
// in memory (less than in the in-memory run) and per layer; the spill file is gone after the run; a
// folder where no spill file can be made is exit 2 naming the key.
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/io/h5.h"
#include "hymoe/runtime/memory.h"
#include "run_binary.h"

namespace fs = std::filesystem;
using namespace hymoe;

namespace {

const std::string kDeck = "tests/decks/offload/deck.yaml";
const std::string kDir = "tests/decks/offload/";

// Every /requests dataset of two results.h5 files equal: integers and strings exactly, the
// logprobs bit for bit.
void expect_identical(const std::string& got, const std::string& want) {
    io::H5Reader a(got), b(want);
    for (const char* name : {"id", "finish_reason", "adapter"})
        BOOST_TEST((a.strings(std::string("/requests/") + name) ==
                    b.strings(std::string("/requests/") + name)),
                   name);
    for (const char* name :
         {"index", "line", "prompt_len", "output_offsets", "output_tokens", "done"})
        BOOST_TEST(
            (a.ints(std::string("/requests/") + name) == b.ints(std::string("/requests/") + name)),
            name);
    const std::vector<float> lp = a.floats("/requests/output_logprobs");
    const std::vector<float> lp_ref = b.floats("/requests/output_logprobs");
    BOOST_REQUIRE_EQUAL(lp.size(), lp_ref.size());
    BOOST_TEST(std::memcmp(lp.data(), lp_ref.data(), lp.size() * sizeof(float)) == 0);
}

// The deck at `layout` (extra --set flags) on np ranks, with offload none and file, equal.
void none_equals_file(const std::string& name, const std::string& sets, int np) {
    const std::string none = "out/" + name + "-none", file = "out/" + name + "-file";
    auto a = testing::run_hymoe(kDeck + sets + " --set job.output=" + none, np);
    BOOST_REQUIRE_MESSAGE(a.code == 0, a.err);
    auto b = testing::run_hymoe(
        kDeck + sets + " --set job.output=" + file + " --set inference.kv_cache.offload=file", np);
    BOOST_REQUIRE_MESSAGE(b.code == 0, b.err);
    BOOST_TEST(b.out.find("kv offload: file in ") != std::string::npos, b.out);
    expect_identical(kDir + file + "/results.h5", kDir + none + "/results.h5");
    for (const auto& e : fs::directory_iterator(kDir + file))  // the spill files are gone
        BOOST_TEST(e.path().filename().string().find("hymoe-kv-") == std::string::npos);

    // profile.h5: the pages' bytes the same, those in memory fewer with the file tier
    const int cols = runtime::kMemoryColumns;
    const std::vector<float> m_none =
        io::H5Reader(kDir + none + "/profile.h5").floats("/memory/ranks");
    const std::vector<float> m_file =
        io::H5Reader(kDir + file + "/profile.h5").floats("/memory/ranks");
    BOOST_REQUIRE(m_none.size() == static_cast<size_t>(cols * std::max(np, 1)));
    BOOST_REQUIRE(m_file.size() == m_none.size());
    for (size_t r = 0; r < m_none.size() / cols; ++r) {
        const float* n = &m_none[r * cols];
        const float* f = &m_file[r * cols];
        BOOST_TEST(n[9] >= n[1]);  // in memory every page ever used stays allocated
        BOOST_TEST(f[1] == n[1]);
        BOOST_TEST(f[9] > 0.0f);
        BOOST_TEST(f[9] < n[9], "rank " << r << ": " << f[9] << " against " << n[9] << " bytes");
    }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(kv_offload)

BOOST_AUTO_TEST_CASE(file_equals_none_sampled_and_greedy_at_one_rank) {
    fs::remove_all(kDir + "out");
    none_equals_file("sampled", "", 0);
    none_equals_file("greedy", " --set inference.sampling.temperature=0", 0);
    // per-layer cache memory: every DSA layer its pages, no KDA state
    io::H5Reader h5(kDir + "out/sampled-file/profile.h5");
    const std::vector<int64_t> kv = h5.ints("/layers/kv_bytes");
    const std::vector<int64_t> kda = h5.ints("/layers/kda_state_bytes");
    BOOST_REQUIRE(kv.size() == 4u);
    for (size_t i = 0; i < 4; ++i) {
        BOOST_TEST(kv[i] > 0);
        BOOST_TEST(kv[i] % (8 * (32 + 8 + 16) * 4) == 0);  // whole pages of 8 rows of 56 floats
        BOOST_TEST(kda[i] == 0);
    }
    fs::remove_all(kDir + "out");
}

BOOST_AUTO_TEST_CASE(file_equals_none_at_two_pipeline_stages) {
    fs::remove_all(kDir + "out");
    none_equals_file("pp2", " --set parallel.pp=2", 2);
    fs::remove_all(kDir + "out");
}

BOOST_AUTO_TEST_CASE(a_folder_without_room_for_the_spill_file_is_exit_2_naming_the_key) {
    fs::remove_all(kDir + "out");
    auto r = testing::run_hymoe(kDeck +
                                " --set inference.kv_cache.offload=file"
                                " --set inference.kv_cache.offload_path=/proc");
    BOOST_TEST(r.code == 2);
    BOOST_TEST(r.err.find("inference.kv_cache.offload_path: cannot create a spill file in /proc") !=
                   std::string::npos,
               r.err);
    fs::remove_all(kDir + "out");
}

BOOST_AUTO_TEST_SUITE_END()
