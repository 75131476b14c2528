// Deck parsing in process: defaults, resolved deck round trip, --set, and the exact error line
// (file:line:col: key.path: ...) for representative mistakes. The binary-level malformed-deck
// suite (exit code, nothing written) is tests/e2e/test_bad_decks.cpp.
#include <filesystem>
#include <fstream>
#include <string>

#include <boost/test/unit_test.hpp>

#include "hymoe/core/error.h"
#include "hymoe/deck/deck.h"

namespace fs = std::filesystem;
using hymoe::deck::Deck;
using hymoe::deck::parse_deck;

namespace {

// A scratch job folder with a dataset file the decks can point at.
struct JobFolder {
    fs::path dir;
    JobFolder() {
        dir = fs::temp_directory_path() / ("hymoe_deck_test_" + std::to_string(::getpid()));
        fs::create_directories(dir / "data");
        std::ofstream(dir / "data" / "prompts.jsonl") << "{\"id\": \"a\", \"tokens\": [1, 2]}\n";
        std::ofstream(dir / "data" / "domain.h5") << "x";
    }
    ~JobFolder() { fs::remove_all(dir); }
    std::string deck_path() const { return (dir / "deck.yaml").string(); }
};

const std::string kInfer =
    "job: {kind: infer, seed: 7}\n"
    "model: {preset: tiny, init: random}\n"
    "inference:\n"
    "  dataset: data/prompts.jsonl\n";

// The message of the error parse_deck throws (and that it is Exit::invalid).
std::string error_of(const std::string& text,
                     const std::string& path,
                     const std::vector<std::string>& sets = {}) {
    try {
        parse_deck(text, path, sets);
    } catch (const hymoe::Error& e) {
        BOOST_TEST((e.code() == hymoe::Exit::invalid));
        BOOST_TEST((e.scope() == hymoe::Scope::collective));
        return e.what();
    }
    return "no error";
}

}  // namespace

BOOST_AUTO_TEST_SUITE(deck)

BOOST_AUTO_TEST_CASE(defaults_are_filled_in) {
    JobFolder f;
    Deck d = parse_deck(kInfer, f.deck_path(), {});
    BOOST_TEST((d.job.kind == hymoe::deck::JobKind::infer));
    BOOST_TEST(d.job.seed == 7u);
    BOOST_TEST(d.job.name == f.dir.filename().string());
    BOOST_TEST(d.job.output == (f.dir / "out").string());
    BOOST_TEST((d.parallel.tp == 1 && d.parallel.dp == 1 && d.parallel.pp == 1));
    BOOST_TEST(d.model.preset == "tiny");
    BOOST_TEST(d.model.init_random);
    BOOST_TEST((d.model.dtype == hymoe::DType::bf16));
    BOOST_TEST(d.inference.dataset == (f.dir / "data" / "prompts.jsonl").string());
    BOOST_TEST(d.inference.max_new_tokens == 64);
    BOOST_TEST(d.inference.pages == 0);  // auto
    BOOST_TEST(!d.finetune.present);
    BOOST_TEST(d.hardware.gpu_memory_gb == 141.0);
    BOOST_TEST(d.resolved_yaml.find("tp: 1") != std::string::npos);
    BOOST_TEST(d.resolved_yaml.find("pages: auto") != std::string::npos);
}

// inference.kv_cache.dtype follows model.dtype unless given; a bad value names the key.
BOOST_AUTO_TEST_CASE(kv_cache_dtype_defaults_to_the_model_dtype) {
    JobFolder f;
    using hymoe::DType;
    BOOST_TEST((parse_deck(kInfer, f.deck_path(), {}).inference.kv_dtype == DType::bf16));
    BOOST_TEST(
        (parse_deck(kInfer, f.deck_path(), {"model.dtype=fp32"}).inference.kv_dtype == DType::f32));
    BOOST_TEST(
        (parse_deck(kInfer, f.deck_path(), {"inference.kv_cache.dtype=fp16"}).inference.kv_dtype ==
         DType::f16));
    BOOST_TEST(error_of(kInfer, f.deck_path(), {"inference.kv_cache.dtype=fp8"})
                   .find("inference.kv_cache.dtype: 'fp8' is not allowed") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(resolved_deck_parses_to_the_same_values) {
    JobFolder f;
    Deck d = parse_deck(kInfer + "parallel: {tp: 2, dp: 2, ep: 4}\n", f.deck_path(), {});
    Deck again = parse_deck(d.resolved_yaml, f.deck_path(), {});
    BOOST_TEST(again.resolved_yaml == d.resolved_yaml);
    BOOST_TEST(again.parallel.ep == 4);
}

BOOST_AUTO_TEST_CASE(set_overrides_and_names_itself_in_errors) {
    JobFolder f;
    Deck d = parse_deck(kInfer, f.deck_path(), {"parallel.tp=4", "inference.sampling.top_k=5"});
    BOOST_TEST(d.parallel.tp == 4);
    BOOST_TEST(d.inference.top_k == 5);
    BOOST_TEST(error_of(kInfer, f.deck_path(), {"parallel.tp=0"}) ==
               "--set parallel.tp=0: parallel.tp: 0 is out of range (allowed: 1 to 1048576)");
    BOOST_TEST(error_of(kInfer, f.deck_path(), {"parallel.tpp=2"})
                   .find("--set parallel.tpp=2: parallel.tpp: unknown key") == 0);
    BOOST_TEST(error_of(kInfer, f.deck_path(), {"novalue"}) ==
               "--set novalue: expected key.path=value");
}

BOOST_AUTO_TEST_CASE(error_lines_name_file_line_column_and_key) {
    JobFolder f;
    const std::string p = f.deck_path();
    BOOST_TEST(
        error_of(kInfer + "parallel: {tp: 2, tq: 3}\n", p) ==
        p + ":5:19: parallel.tq: unknown key (allowed: tp, pp, dp, ep, etp, rebalance_every)");
    BOOST_TEST(error_of(kInfer + "parallel:\n  tp: two\n", p) ==
               p + ":6:7: parallel.tp: 'two' is not an integer (allowed: 1 to 1048576)");
    BOOST_TEST(error_of(kInfer + "parallel:\n  tp: 2\n  tp: 4\n", p) ==
               p + ":7:3: parallel.tp: duplicate key (first given on line 6)");
    BOOST_TEST(
        error_of(kInfer + "finetune: {steps: 3}\n", p) ==
        p + ":5:11: finetune: not allowed when job.kind is infer (finetune belongs to kind: lora)");
    BOOST_TEST(error_of("job: {kind: train}\n", p) ==
               p + ":1:13: job.kind: 'train' is not allowed (allowed: infer, lora, convert, plan, "
                   "tokenize)");
    BOOST_TEST(error_of("", p) == p + ":1:1: (deck): the deck is empty (it needs at least job: " +
                                      "{kind: ...} and model:)");
}

BOOST_AUTO_TEST_CASE(lora_deck_reads_the_finetune_block) {
    JobFolder f;
    const std::string lora =
        "job: {kind: lora}\n"
        "model: {preset: tiny, init: random}\n"
        "finetune:\n"
        "  lora: {rank: 8, alpha: 16, target_modules: [q_proj, o_proj]}\n"
        "  optimizer: {lr: 2.0e-4, warmup_steps: 5}\n"
        "  data: {domain: data/domain.h5}\n"
        "  steps: 10\n";
    Deck d = parse_deck(lora, f.deck_path(), {});
    BOOST_TEST(d.finetune.present);
    BOOST_TEST(d.finetune.lora.rank == 8);
    BOOST_TEST(d.finetune.lora.target_modules == (std::vector<std::string>{"q_proj", "o_proj"}));
    BOOST_TEST(d.finetune.optimizer.lr == 2e-4);
    BOOST_TEST(d.finetune.domain_ratio == 1.0);
    BOOST_TEST(d.finetune.steps == 10);
    BOOST_TEST(d.locate("finetune.steps") == f.deck_path() + ":7:10: finetune.steps");
}

BOOST_AUTO_TEST_SUITE_END()
