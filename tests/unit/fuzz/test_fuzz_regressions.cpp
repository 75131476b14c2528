// The inputs the fuzzers (tests/fuzz/) found crashing, fed through the normal build: each is now
// one hymoe::Error with its exit code and a message naming the file (the inputs are committed
// under tests/fuzz/corpus/<target>/regress-*, so the fuzz tier replays them too). The results
// journal's finding is an e2e case (faults/a_damaged_results_journal_is_refused_with_3).
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include <boost/test/unit_test.hpp>

#include "hymoe/core/error.h"
#include "hymoe/io/checkpoint.h"
#include "hymoe/model/config.h"
#include "hymoe/text/tokenizer.h"

using namespace hymoe;
namespace fs = std::filesystem;

namespace {

std::string corpus(const std::string& target, const std::string& name) {
    std::ifstream in("tests/fuzz/corpus/" + target + "/" + name, std::ios::binary);
    BOOST_REQUIRE_MESSAGE(in, "tests/fuzz/corpus/" << target << "/" << name << " is missing");
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

// "<exit code> <message>" of the hymoe::Error f throws ("no error" if none).
std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return cat(static_cast<int>(e.code()), " ", e.what());
    }
    return "no error";
}

std::string write_tmp(const std::string& name, const std::string& text) {
    const fs::path p = fs::temp_directory_path() / ("hymoe-fuzz-regress-" + name);
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
}

}  // namespace

BOOST_AUTO_TEST_SUITE(fuzz_regressions)

// nlohmann's parser throws out_of_range (not parse_error) for a number past double's range; it
// escaped parse_model_config as an internal error.
BOOST_AUTO_TEST_CASE(config_number_overflow_is_invalid_json) {
    const std::string text = corpus("config", "regress-number-overflow");
    const std::string e = error_of([&] { model::parse_model_config(text, "config.json"); });
    BOOST_TEST(e.starts_with("2 config.json: not valid JSON (number overflow parsing"), e);
}

// n_shared_experts = 555555551 × moe_intermediate_size = 32 overflowed int (UBSan).
BOOST_AUTO_TEST_CASE(config_shared_expert_width_overflow_is_invalid) {
    const std::string text = corpus("config", "regress-shared-width-overflow");
    const std::string e = error_of([&] { model::parse_model_config(text, "config.json"); });
    BOOST_TEST(
        e.find("n_shared_experts × moe_intermediate_size is 17777777632, above 2147483647") !=
            std::string::npos,
        e);
    BOOST_TEST(e.starts_with("2 config.json"), e);
}

// A manifest entry with split_dim 5 for a 2-D tensor indexed its shape past the end (ASan) when
// the tensor was read; now the manifest is refused as it is opened, exit 4.
BOOST_AUTO_TEST_CASE(manifest_split_dim_outside_the_shape_is_refused) {
    const std::string text = corpus("manifest", "regress-split-dim");
    BOOST_TEST(error_of([&] { io::TensorStore("ckpt", text); }) ==
               "4 ckpt/manifest.json: tensor w: its shape [2, 3], split_dim 5 and pieces do not "
               "fit together");
}

// A Sequence pre-tokenizer without "pretokenizers" hit json's const operator[] on a missing key
// (an assertion: abort); other wrong shapes threw json exceptions past the parser.
BOOST_AUTO_TEST_CASE(tokenizer_json_of_the_wrong_shape_is_one_error) {
    const std::string text = corpus("tokenizer_json", "regress-missing-pattern");
    const std::string e = error_of([&] { text::parse_hf_tokenizer(text, "tok.json"); });
    BOOST_TEST(e.starts_with("2 tok.json: (file): not a tokenizer.json of the expected shape ("),
               e);
    BOOST_TEST(e.find("'pretokenizers' not found") != std::string::npos, e);
    const std::string wrong_type = R"({"model": {"type": "BPE", "vocab": {"a": 0}},
                                       "added_tokens": [{"id": 1}]})";
    BOOST_TEST(error_of([&] {
                   text::parse_hf_tokenizer(wrong_type, "tok.json");
               }).starts_with("2 tok.json: (file): not a tokenizer.json of the expected shape"));
    const std::string huge_id = R"({"model": {"type": "BPE", "vocab": {"a": 2147483647}}})";
    BOOST_TEST(error_of([&] { text::parse_hf_tokenizer(huge_id, "tok.json"); }) ==
               "2 tok.json: model.vocab: token id 2147483647 is not an integer from 0 to 16777215");
}

// A rank of 44444444 (stoll stopped at the 'W' after it) made a 44M-entry id table: over a
// second under ASan, 1.4 GB; a rank followed by junk was taken. Now a rank is the whole rest of
// the line and at most kMaxTokenId.
BOOST_AUTO_TEST_CASE(tiktoken_rank_is_strict_and_bounded) {
    const std::string path = write_tmp("huge.tiktoken", corpus("tiktoken", "regress-huge-rank"));
    BOOST_TEST(error_of([&] { text::load_tiktoken(path, "cl100k_base"); }) ==
               "2 " + path + ":10: expected '<base64 token> <rank>'");
    const std::string big = write_tmp("big.tiktoken", "YQ== 16777216\n");
    BOOST_TEST(error_of([&] { text::load_tiktoken(big, "cl100k_base"); }) ==
               "2 " + big + ":1: expected '<base64 token> <rank>'");
    const std::string junk = write_tmp("junk.tiktoken", "YQ== 1x\n");
    BOOST_TEST(error_of([&] { text::load_tiktoken(junk, "cl100k_base"); }) ==
               "2 " + junk + ":1: expected '<base64 token> <rank>'");
    fs::remove(path), fs::remove(big), fs::remove(junk);
}

BOOST_AUTO_TEST_SUITE_END()
