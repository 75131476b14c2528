// The edges a new user meets first (issue 27), each with the issue's own situation: token ids past
// the model's vocabulary (tokenize refuses the row, a lora dataset is refused by file and row,
// --check refuses the tokenizer), --ranks (and so slurm/submit) refusing an impossible layout
// before anything is queued, reruns of a finished infer deck (already complete and nothing
// touched; another deck's results refused unless job.overwrite), and Ctrl-C to a local 2-rank
// run through slurm/run-local (saved, exit 75); per-request sampling settings; results.jsonl.
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <nlohmann/json.hpp>

#include "hymoe/io/h5.h"
#include "run_binary.h"

namespace fs = std::filesystem;
using hymoe::testing::read_text;
using hymoe::testing::run_hymoe;

namespace {

const std::string kTokenize = "tests/decks/tokenize/deck.yaml";
const std::string kOut = "tests/decks/tokenize/out";

bool contains(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

std::string bin() {
    const char* b = std::getenv("HYMOE_BIN");
    return fs::absolute(b ? b : "build/hymoe").string();
}

// A file's bytes and modification time, to show that a rerun did not touch it.
struct Stamp {
    std::string bytes;
    fs::file_time_type mtime;
    bool operator==(const Stamp&) const = default;
};
Stamp stamp(const std::string& path) {
    return {read_text(path), fs::last_write_time(path)};
}

// results.jsonl holds results.h5's rows, a line per request with an output per sample, with the
// same values.
void check_jsonl(const std::string& out) {
    hymoe::io::H5Reader h5(out + "/results.h5");
    const auto ids = h5.strings("/requests/id"), finish = h5.strings("/requests/finish_reason");
    const auto tokens = h5.ints("/requests/output_tokens");
    const auto offsets = h5.ints("/requests/output_offsets");
    const auto logprobs = h5.floats("/requests/output_logprobs");
    const auto sample = h5.ints("/requests/sample");
    std::ifstream in(out + "/results.jsonl");
    size_t i = 0;
    for (std::string line; std::getline(in, line);) {
        const nlohmann::json j = nlohmann::json::parse(line);
        for (const auto& o : j["outputs"]) {
            BOOST_REQUIRE(i < ids.size());
            BOOST_TEST(j["id"].get<std::string>() == ids[i]);
            BOOST_TEST(o["index"].get<int64_t>() == sample[i]);
            BOOST_TEST(o["finish_reason"].get<std::string>() == finish[i]);
            BOOST_TEST(
                o["token_ids"].get<std::vector<int64_t>>() ==
                std::vector<int64_t>(tokens.begin() + offsets[i], tokens.begin() + offsets[i + 1]));
            BOOST_TEST(o["logprobs"].get<std::vector<float>>() ==
                       std::vector<float>(logprobs.begin() + offsets[i],
                                          logprobs.begin() + offsets[i + 1]));
            ++i;
        }
    }
    BOOST_TEST(i == ids.size());
    BOOST_TEST(!fs::exists(out + "/results.jsonl.partial"));
}

}  // namespace

BOOST_AUTO_TEST_SUITE(edges)

// The case: the tokenizer's ids reach 274 and the tiny model has 256. tokenize names the
// dataset row and the tokenizer (exit 3), and --check refuses the tokenizer up front (exit 2).
BOOST_AUTO_TEST_CASE(tokenize_refuses_token_ids_past_the_vocabulary) {
    fs::remove_all(kOut);
    auto r = run_hymoe(kTokenize + " --set model.preset=tiny");
    BOOST_TEST(r.code == 3, r.err);
    BOOST_TEST(r.err_lines().size() == 1u, r.err);
    BOOST_TEST(contains(r.err, "data.jsonl:1: the tokenizer '"), r.err);
    BOOST_TEST(contains(r.err, "' gives token id "), r.err);
    BOOST_TEST(contains(r.err, ", outside the model's vocabulary [0, 256) (model.preset: tiny)"),
               r.err);
    BOOST_TEST(!fs::exists(kOut + "/tokens.h5"));

    auto check = run_hymoe(kTokenize + " --set model.preset=tiny --check");
    BOOST_TEST(check.code == 2, check.err);
    BOOST_TEST(check.err_lines().size() == 1u, check.err);
    BOOST_TEST(contains(check.err, "deck.yaml:7:"), check.err);
    BOOST_TEST(contains(check.err, ": tokenizer.path: the tokenizer '"), check.err);
    BOOST_TEST(contains(check.err, "more than the model's vocabulary of 256 (model.preset: tiny)"),
               check.err);
    // the deck's own model (the mid preset) holds every id
    BOOST_TEST(run_hymoe(kTokenize + " --check").code == 0);
    fs::remove_all(kOut);
}

// The tokenize output of the mid preset (ids up to 274) fed to the tiny model's lora job: exit 3
// naming the dataset, the document and its source line, before the model is built; --check and
// --ranks find it too.
BOOST_AUTO_TEST_CASE(lora_refuses_a_dataset_with_an_out_of_vocabulary_id) {
    fs::remove_all(kOut);
    BOOST_REQUIRE(run_hymoe(kTokenize).code == 0);
    const std::string data = fs::absolute(kOut + "/tokens.h5").string();
    const std::string deck = "jobs/lora-quickstart/deck.yaml --set finetune.data.domain=" + data +
                             " --set job.output=" + fs::absolute(kOut + "/lora").string();
    for (const std::string mode : {"", " --check", " --ranks"}) {
        auto r = run_hymoe(deck + mode);
        BOOST_TEST(r.code == 3, mode << ": " << r.err);
        BOOST_TEST(r.err_lines().size() == 1u, r.err);
        BOOST_TEST(contains(r.err, data + ": document 0 (source line 1) holds token id "), r.err);
        BOOST_TEST(
            contains(r.err, ", outside the model's vocabulary [0, 256) (model.preset: tiny)"),
            r.err);
    }
    BOOST_TEST(!fs::exists(kOut + "/lora/checkpoints"));
    fs::remove_all(kOut);
}

// The command: slurm/submit ... -- --set parallel.dp=2 --set parallel.ep=3. --ranks runs
// the layout rules, so submit exits 2 with hymoe's sentence and never calls sbatch (a stand-in
// sbatch on PATH records any call).
BOOST_AUTO_TEST_CASE(submit_refuses_an_impossible_layout_before_queueing) {
    const std::string dir = fs::absolute("tests/decks/tokenize/out/submit").string();
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::ofstream(dir + "/sbatch") << "#!/bin/sh\necho called >" << dir << "/sbatch_called\n";
    fs::permissions(dir + "/sbatch", fs::perms::owner_all);
    const std::string err = dir + "/err";
    const int status = std::system(("PATH=" + dir + ":$PATH HYMOE_BIN=" + bin() +
                                    " slurm/submit jobs/quickstart -- --set parallel.dp=2 "
                                    "--set parallel.ep=3 >/dev/null 2>" +
                                    err)
                                       .c_str());
    BOOST_TEST(WEXITSTATUS(status) == 2);
    BOOST_TEST(contains(read_text(err), "parallel.ep: etp·ep = 1·3 = 3 does not divide tp·dp = 2"),
               read_text(err));
    BOOST_TEST(!fs::exists(dir + "/sbatch_called"));
    // the same rules through --ranks itself; a good layout still prints its rank count
    auto r = run_hymoe("jobs/quickstart/deck.yaml --ranks --set parallel.dp=2 --set parallel.ep=3");
    BOOST_TEST(r.code == 2);
    BOOST_TEST(r.err_lines().size() == 1u, r.err);
    auto ok =
        run_hymoe("jobs/quickstart/deck.yaml --ranks --set parallel.dp=2 --set parallel.ep=2");
    BOOST_TEST(ok.code == 0, ok.err);
    BOOST_TEST(ok.out == "2\n");
    auto tp = run_hymoe("jobs/quickstart/deck.yaml --ranks --set parallel.tp=3");
    BOOST_TEST(tp.code == 2);
    BOOST_TEST(contains(tp.err, "parallel.tp: 3 does not divide"), tp.err);
    fs::remove_all(dir);
}

// A finished infer deck run again: "already complete", exit 0, results.h5 and the log untouched
// (bytes and mtime). A changed deck is refused in one line naming job.output; job.overwrite:
// true reruns it and replaces results.h5; after that the changed deck is complete (the key
// job.overwrite itself does not make another deck).
BOOST_AUTO_TEST_CASE(rerunning_a_finished_infer_deck) {
    const std::string out = fs::absolute("tests/decks/tokenize/out/rerun").string();
    fs::remove_all(out);
    fs::create_directories(out);
    std::ofstream(out + "/requests.jsonl") << "{\"id\": \"a\", \"tokens\": [5, 6, 7]}\n"
                                              "{\"id\": \"b\", \"tokens\": [9, 8]}\n";
    const std::string deck = "tests/decks/infer/deck.yaml --set job.output=" + out +
                             " --set inference.dataset=" + out + "/requests.jsonl";
    auto first = run_hymoe(deck);
    BOOST_REQUIRE_MESSAGE(first.code == 0, first.err);
    const Stamp results = stamp(out + "/results.h5"), log = stamp(out + "/log");
    check_jsonl(out);

    auto again = run_hymoe(deck);
    BOOST_TEST(again.code == 0, again.err);
    BOOST_TEST(contains(again.out, "/results.h5: already complete (2 requests of this deck)"),
               again.out);
    BOOST_TEST((stamp(out + "/results.h5") == results));
    BOOST_TEST((stamp(out + "/log") == log));

    const std::string changed = deck + " --set inference.max_new_tokens=4";
    auto refused = run_hymoe(changed);
    BOOST_TEST(refused.code == 2);
    BOOST_TEST(refused.err_lines().size() == 1u, refused.err);
    BOOST_TEST(contains(refused.err,
                        "job.output: " + out +
                            "/results.h5 holds the 2 results of "
                            "another deck"),
               refused.err);
    BOOST_TEST(contains(refused.err, "set job.overwrite: true"), refused.err);
    BOOST_TEST((stamp(out + "/results.h5") == results));

    auto replaced = run_hymoe(changed + " --set job.overwrite=true");
    BOOST_TEST(replaced.code == 0, replaced.err);
    const auto offsets = hymoe::io::H5Reader(out + "/results.h5").ints("/requests/output_offsets");
    BOOST_TEST(offsets.back() <= 8);  // two requests of at most 4 tokens
    auto done = run_hymoe(changed);
    BOOST_TEST(done.code == 0, done.err);
    BOOST_TEST(contains(done.out, "already complete"), done.out);
    fs::remove_all(out);
}

// Per-request sampling settings (vLLM's SamplingParams names) against the sampler's definition,
// in a deck that samples (temperature 0.7, top_k 50, top_p 0.95): temperature 0 and top_k 1
// give the greedy tokens; two equal requests with one seed draw alike at different places in the
// file (the in-process infer/per_request_sampling_follows_the_sampler checks the draws
// themselves); max_tokens caps the output; an out-of-range value is a bad request naming file,
// line and key.
BOOST_AUTO_TEST_CASE(per_request_sampling_settings_follow_the_sampler) {
    const std::string out = fs::absolute("tests/decks/tokenize/out/sampling").string();
    fs::remove_all(out);
    fs::create_directories(out);
    auto write = [&](const std::string& name, const std::string& lines) {
        std::ofstream(out + "/" + name) << lines;
        return " --set inference.dataset=" + out + "/" + name + " --set job.output=" + out + "/" +
               name + ".out";
    };
    auto tokens = [&](const std::string& name) {
        hymoe::io::H5Reader h5(out + "/" + name + ".out/results.h5");
        const auto t = h5.ints("/requests/output_tokens");
        const auto off = h5.ints("/requests/output_offsets");
        std::vector<std::vector<int64_t>> v;
        for (size_t i = 0; i + 1 < off.size(); ++i)
            v.emplace_back(t.begin() + off[i], t.begin() + off[i + 1]);
        return v;
    };
    const std::string deck = "tests/decks/infer/deck.yaml";
    const std::string mixed = write("mixed.jsonl",
                                    "{\"id\": \"g\", \"tokens\": [5, 6, 7], \"temperature\": 0}\n"
                                    "{\"id\": \"s1\", \"tokens\": [9, 8, 7], \"seed\": 42, "
                                    "\"temperature\": 1.0, \"top_k\": 20}\n"
                                    "{\"id\": \"s2\", \"tokens\": [9, 8, 7], \"seed\": 42, "
                                    "\"temperature\": 1.0, \"top_k\": 20}\n"
                                    "{\"id\": \"k1\", \"tokens\": [5, 6, 7], \"top_k\": 1, "
                                    "\"temperature\": 1.5}\n"
                                    "{\"id\": \"m\", \"tokens\": [5, 6, 7], \"max_tokens\": 3}\n");
    BOOST_REQUIRE(run_hymoe(deck + mixed).code == 0);
    const std::string greedy = write("greedy.jsonl", "{\"tokens\": [5, 6, 7]}\n");
    BOOST_REQUIRE(run_hymoe(deck + greedy + " --set inference.sampling.temperature=0").code == 0);
    const auto got = tokens("mixed.jsonl"), want_greedy = tokens("greedy.jsonl");
    BOOST_REQUIRE(got.size() == 5u);
    BOOST_TEST(got[0] == want_greedy[0]);
    BOOST_TEST(got[3] == want_greedy[0]);
    BOOST_TEST(got[1] == got[2]);
    BOOST_TEST(got[1] != want_greedy[0]);  // it did sample (another prompt, but 16 tokens)
    BOOST_TEST(got[4].size() <= 3u);
    BOOST_TEST(!got[4].empty());

    const std::string bad = write("bad.jsonl", "{\"tokens\": [1, 2], \"top_p\": 0}\n");
    auto r = run_hymoe(deck + bad);
    BOOST_TEST(r.code == 3);
    BOOST_TEST(contains(r.err, "bad.jsonl:1: \"top_p\" must be a number in (0, 1]"), r.err);
    fs::remove_all(out);
}

// The penalties through the binary, against their definition: at greedy, every output token is
// the argmax of the raw logprobs (inference.logprobs: the 20 most likely, a shift of the logits)
// less frequency_penalty × its count so far and presence_penalty if it was output before; the
// same keys as deck defaults (inference.sampling) give the same tokens; a repetition penalty of
// 100 leaves every token of the prompt and the output so far behind an unseen one; the plain
// greedy run repeats tokens (so the penalties did act); a bad value is a bad request (exit 3,
// file and line) and a bad deck default exit 2 naming the deck line.
BOOST_AUTO_TEST_CASE(penalties_follow_their_definition_through_the_binary) {
    const std::string out = fs::absolute("tests/decks/tokenize/out/penalties").string();
    fs::remove_all(out);
    fs::create_directories(out);
    auto write = [&](const std::string& name, const std::string& lines) {
        std::ofstream(out + "/" + name) << lines;
        return " --set inference.dataset=" + out + "/" + name + " --set job.output=" + out + "/" +
               name + ".out --set inference.logprobs=20";
    };
    struct Rows {
        std::vector<std::vector<int64_t>> tokens, top;
        std::vector<std::vector<float>> top_lp;
    };
    auto rows = [&](const std::string& name) {
        hymoe::io::H5Reader h5(out + "/" + name + ".out/results.h5");
        const auto t = h5.ints("/requests/output_tokens");
        const auto off = h5.ints("/requests/output_offsets");
        const auto top = h5.ints("/requests/top_tokens");
        const auto lp = h5.floats("/requests/top_logprobs");
        Rows r;
        for (size_t i = 0; i + 1 < off.size(); ++i) {
            r.tokens.emplace_back(t.begin() + off[i], t.begin() + off[i + 1]);
            r.top.emplace_back(top.begin() + off[i] * 20, top.begin() + off[i + 1] * 20);
            r.top_lp.emplace_back(lp.begin() + off[i] * 20, lp.begin() + off[i + 1] * 20);
        }
        return r;
    };
    const std::string deck = "tests/decks/infer/deck.yaml";
    const std::string prompt = "\"tokens\": [5, 6, 7, 5, 9]";
    const std::string own = write("own.jsonl",
                                  "{" + prompt +
                                      ", \"temperature\": 0, \"frequency_penalty\": 1.5, "
                                      "\"presence_penalty\": 0.5}\n"
                                      "{" +
                                      prompt +
                                      ", \"temperature\": 0, \"repetition_penalty\": 100}\n"
                                      "{" +
                                      prompt + ", \"temperature\": 0}\n");
    BOOST_REQUIRE(run_hymoe(deck + own).code == 0);
    const std::string by_deck = write("deck.jsonl", "{" + prompt + "}\n");
    BOOST_REQUIRE(run_hymoe(deck + by_deck +
                            " --set inference.sampling.temperature=0"
                            " --set inference.sampling.frequency_penalty=1.5"
                            " --set inference.sampling.presence_penalty=0.5")
                      .code == 0);
    const Rows got = rows("own.jsonl"), deck_rows = rows("deck.jsonl");
    BOOST_REQUIRE(got.tokens.size() == 3u);
    BOOST_TEST(got.tokens[0] == deck_rows.tokens[0], boost::test_tools::per_element());
    const auto& freq = got.tokens[0];
    BOOST_REQUIRE(freq.size() ==
                  16u);  // so at most 15 penalised tokens: the argmax is in the top 20
    std::map<int64_t, int> count;
    for (size_t k = 0; k < freq.size(); ++k) {
        int64_t best = -1;
        double best_x = -1e30;
        for (int j = 0; j < 20; ++j) {
            const int64_t t = got.top[0][k * 20 + j];
            const double x = static_cast<double>(got.top_lp[0][k * 20 + j]) - 1.5 * count[t] -
                             (count[t] ? 0.5 : 0);
            if (x > best_x)
                best = t, best_x = x;
        }
        BOOST_TEST(freq[k] == best, "token " << k);
        ++count[freq[k]];
    }
    std::set<int64_t> seen = {5, 6, 7, 9};
    for (int64_t t : got.tokens[1])
        BOOST_TEST(seen.insert(t).second, "token " << t << " repeated");
    std::set<int64_t> plain(got.tokens[2].begin(), got.tokens[2].end());
    BOOST_TEST(plain.size() < got.tokens[2].size());  // plain greedy repeats itself
    BOOST_TEST(got.tokens[0] != got.tokens[2]);

    const std::string bad =
        write("bad.jsonl", "{\"tokens\": [1, 2]}\n{\"tokens\": [1, 2], \"min_p\": 1.5}\n");
    auto r = run_hymoe(deck + bad);
    BOOST_TEST(r.code == 3);
    BOOST_TEST(contains(r.err, "bad.jsonl:2: \"min_p\" must be a number in [0, 1]"), r.err);
    r = run_hymoe(deck + write("bad2.jsonl", "{\"tokens\": [1], \"repetition_penalty\": 0}\n"));
    BOOST_TEST(r.code == 3);
    BOOST_TEST(contains(r.err, "bad2.jsonl:1: \"repetition_penalty\" must be a number in (0, 100]"),
               r.err);
    r = run_hymoe(deck + by_deck + " --set inference.sampling.presence_penalty=3");
    BOOST_TEST(r.code == 2);
    BOOST_TEST(contains(r.err, "inference.sampling.presence_penalty"), r.err);
    fs::remove_all(out);
}

// n samples through the binary (deck sampling at temperature 0.7): results.h5 has a row per
// (request, sample) in order with /requests/sample, results.jsonl one line per request with its
// outputs; sample 0 is the request run with n 1, the samples differ. Resume: a bad request after
// two requests of 5 samples stops the job (exit 3) once 9 of their 10 rows finished, 8 of them
// journalled (a segment every 8 rows at max_seqs 2), so one request is journalled in part; the
// rerun on the fixed file runs only the missing samples and equals an uninterrupted run.
BOOST_AUTO_TEST_CASE(n_samples_per_request_and_their_resume) {
    const std::string out = fs::absolute("tests/decks/tokenize/out/samples").string();
    fs::remove_all(out);
    fs::create_directories(out);
    auto run = [&](const std::string& name, const std::string& lines) {
        std::ofstream(out + "/" + name) << lines;
        return run_hymoe("tests/decks/infer/deck.yaml --set inference.dataset=" + out + "/" + name +
                         " --set job.output=" + out + "/out --set inference.max_new_tokens=6");
    };
    const std::string r0 = "{\"id\": \"a\", \"tokens\": [5, 6, 7], \"n\": 5}\n";
    const std::string r1 = "{\"id\": \"b\", \"tokens\": [9, 8], \"n\": 5}\n";
    const std::string r2 = "{\"id\": \"c\", \"tokens\": [4]}\n";
    auto r = run("full.jsonl", r0 + r1 + r2);
    BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
    BOOST_TEST(contains(r.out, "done: 3 requests as 11 samples (3 run, 0 resumed, 0 skipped)"),
               r.out);
    fs::rename(out + "/out", out + "/full");
    hymoe::io::H5Reader full(out + "/full/results.h5");
    BOOST_TEST(
        full.ints("/requests/index") == (std::vector<int64_t>{0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 2}),
        boost::test_tools::per_element());
    BOOST_TEST(
        full.ints("/requests/sample") == (std::vector<int64_t>{0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0}),
        boost::test_tools::per_element());
    const auto tokens = full.ints("/requests/output_tokens");
    const auto off = full.ints("/requests/output_offsets");
    auto row = [&](size_t i) {
        return std::vector<int64_t>(tokens.begin() + off[i], tokens.begin() + off[i + 1]);
    };
    std::set<std::vector<int64_t>> distinct;
    for (size_t i = 0; i < 5; ++i)
        distinct.insert(row(i));
    BOOST_TEST(distinct.size() > 1u);  // the samples draw differently
    std::ifstream jsonl(out + "/full/results.jsonl");
    std::vector<nlohmann::json> lines;
    for (std::string line; std::getline(jsonl, line);)
        lines.push_back(nlohmann::json::parse(line));
    BOOST_REQUIRE(lines.size() == 3u);
    BOOST_TEST(lines[0]["outputs"].size() == 5u);
    BOOST_TEST(lines[2]["outputs"].size() == 1u);
    BOOST_TEST(lines[1]["outputs"][3]["index"] == 3);
    BOOST_TEST(lines[1]["outputs"][3]["token_ids"].get<std::vector<int64_t>>() == row(8));

    r = run("one.jsonl", "{\"id\": \"a\", \"tokens\": [5, 6, 7]}\n");
    BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
    BOOST_TEST(hymoe::io::H5Reader(out + "/out/results.h5").ints("/requests/output_tokens") ==
               row(0));
    fs::remove_all(out + "/out");

    r = run("cut.jsonl", r0 + r1 + "{\"id\": \"c\", \"tokens\": [4], \"top_p\": 2}\n");
    BOOST_REQUIRE(r.code == 3);
    std::set<std::pair<int64_t, int64_t>> journal;
    for (const auto& e : fs::directory_iterator(out + "/out/results.parts")) {
        hymoe::io::H5Reader seg(e.path().string());
        const auto index = seg.ints("/index"), sample = seg.ints("/sample");
        for (size_t i = 0; i < index.size(); ++i)
            journal.emplace(index[i], sample[i]);
    }
    BOOST_TEST(journal.size() == 8u);
    r = run("cut.jsonl", r0 + r1 + r2);
    BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
    BOOST_TEST(contains(r.out, "resuming: 2 requests (8 samples) already finished"), r.out);
    BOOST_TEST(contains(r.out, "done: 3 requests as 11 samples (2 run, 1 resumed, 0 skipped)"),
               r.out);
    hymoe::io::H5Reader resumed(out + "/out/results.h5");
    BOOST_TEST(resumed.ints("/requests/sample") == full.ints("/requests/sample"),
               boost::test_tools::per_element());
    BOOST_TEST(resumed.ints("/requests/output_tokens") == tokens, boost::test_tools::per_element());
    BOOST_TEST(resumed.ints("/requests/output_offsets") == off, boost::test_tools::per_element());

    fs::remove_all(out + "/out");
    r = run("bad.jsonl", "{\"tokens\": [1], \"n\": 0}\n");
    BOOST_TEST(r.code == 3);
    BOOST_TEST(contains(r.err, "bad.jsonl:1: \"n\" must be an integer from 1 to 4096"), r.err);
    fs::remove_all(out);
}

// Ctrl-C to a 2-rank infer job: bare mpirun (OpenMPI 4.1) turns SIGINT into an abort that exits 1
// whatever the ranks return, so slurm/run-local runs mpirun in its own process group and turns
// the SIGINT into SIGUSR1, which mpirun forwards: the ranks flush, the exit code is 75 with one
// "stopped by" line, and the rerun resumes to all 320 requests, its closing finish counts and
// progress lines covering the whole job (both replicas, the resumed requests).
BOOST_AUTO_TEST_CASE(sigint_to_run_local_saves_and_exits_75) {
    const std::string out = fs::absolute("tests/decks/tokenize/out/sigint").string();
    fs::remove_all(out);
    fs::create_directories(out);
    const std::string deck =
        "tests/decks/infer/deck.yaml --set parallel.dp=2 --set job.output=" + out;
    const std::string env = "HYMOE_BIN=" + bin() + " HYMOE_MPIRUN_ARGS=-q ";
    const std::string log = out + "/stdout";
    // started with SIGINT at its default, as from a terminal (std::system's shell would ignore it)
    const pid_t pid = fork();
    if (pid == 0) {
        std::signal(SIGINT, SIG_DFL);
        const std::string cmd = env + "exec slurm/run-local " + deck + " >" + log + " 2>&1";
        execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
        _exit(127);
    }
    const std::string first_segment = out + "/results.parts/seg-000000.h5";
    for (int i = 0; i < 4000 && !fs::exists(first_segment); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    BOOST_REQUIRE(fs::exists(first_segment));
    ::kill(pid, SIGINT);
    int status = 0;
    waitpid(pid, &status, 0);
    const std::string said = read_text(log);
    BOOST_REQUIRE_MESSAGE(!fs::exists(out + "/results.h5"), "the job ended before the signal");
    BOOST_TEST((WIFEXITED(status) && WEXITSTATUS(status) == 75), said);
    BOOST_TEST(contains(said, "run-local: got SIGINT: asking hymoe to stop cleanly"), said);
    BOOST_TEST(contains(said, "stopped by SIGUSR1"), said);

    auto rerun = run_hymoe(deck, 2);
    BOOST_REQUIRE_MESSAGE(rerun.code == 0, rerun.err);
    BOOST_TEST(contains(rerun.out, "resuming: "), rerun.out);
    BOOST_TEST(hymoe::io::H5Reader(out + "/results.h5").strings("/requests/id").size() == 320u);
    // the closing counts cover the whole job, the resumed requests included
    std::smatch m;
    BOOST_REQUIRE(std::regex_search(
        rerun.out,
        m,
        std::regex("done: 320 requests .*finished by stop (\\d+), by length (\\d+)")));
    BOOST_TEST(std::stoi(m[1]) + std::stoi(m[2]) == 320);
    // progress lines (every 5 s: only if the rerun ran that long) sum both replicas and have an
    // ETA from the first one on
    const std::regex line("progress: [^\\n]*");
    for (std::sregex_iterator it(rerun.out.begin(), rerun.out.end(), line);
         it != std::sregex_iterator();
         ++it) {
        BOOST_TEST(contains(it->str(), " resumed) (all 2 replicas), ETA "), it->str());
        BOOST_TEST(!contains(it->str(), "ETA ?"), it->str());
    }
    fs::remove_all(out);
}

BOOST_AUTO_TEST_SUITE_END()
