// The faults a batch job meets, through the built binary: two jobs on one output folder (the
// second refuses at once, naming the holder; a stale lock of a killed job is taken over and the
// log says so), an output folder on a full filesystem (a small tmpfs: a clean error naming the
// file, exit 1 or 3, no file under a complete-looking name, and the rerun with space resumes to
// the uninterrupted run's results), and kill -9 in the middle of each kind of write (results
// segment, profile.h5, checkpoint, converted model, tokenized dataset; HYMOE_TEST_KILL_AT of
// core/kill_point.h picks the write): the rerun resumes or refuses, and never reads a torn file;
// a damaged journal (the fuzzers' finding) is refused with exit 3.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sys/mount.h>
#include <thread>

#include <boost/test/unit_test.hpp>
#include <hdf5.h>
#include <nlohmann/json.hpp>

#include "hymoe/core/error.h"
#include "hymoe/io/h5.h"
#include "hymoe/io/safetensors.h"
#include "hymoe/model/model.h"
#include "hymoe/model/weights.h"
#include "run_binary.h"

namespace fs = std::filesystem;
using namespace hymoe;

namespace {

const std::string kInfer = "tests/decks/infer/deck.yaml";  // 320 requests, ~40 segments
const std::string kLora = "tests/decks/lora/small.yaml";
const std::string kTokenize = "tests/decks/tokenize/deck.yaml";
const std::string kRoot = "build/e2e/faults";

std::string scratch(const std::string& name) {
    const fs::path p = fs::absolute(kRoot) / name;
    fs::remove_all(p);
    fs::create_directories(p.parent_path());
    return p.string();
}

bool contains(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

// Runs the binary with HYMOE_TEST_KILL_AT=at (none when empty).
testing::RunResult run_killed_at(const std::string& at, const std::string& args) {
    if (!at.empty())
        setenv("HYMOE_TEST_KILL_AT", at.c_str(), 1);
    testing::RunResult r = testing::run_hymoe(args);
    unsetenv("HYMOE_TEST_KILL_AT");
    return r;
}

// Every /requests column of a results.h5 but the logprobs, as text.
std::map<std::string, std::string> requests_of(const std::string& path) {
    io::H5Reader h5(path);
    std::map<std::string, std::string> out;
    for (const char* name : {"id", "finish_reason"})
        for (const std::string& v : h5.strings(std::string("/requests/") + name))
            out[name] += v + "\n";
    for (const char* name : {"index", "line", "output_offsets", "output_tokens", "done"})
        for (int64_t v : h5.ints(std::string("/requests/") + name))
            out[name] += std::to_string(v) + " ";
    return out;
}

// The same requests and tokens; logprobs within 1e-5 (the resumed requests ran in other
// batches: test_infer.cpp's kBlasTol).
void expect_same_results(const std::string& got, const std::string& want) {
    const auto a = requests_of(got), b = requests_of(want);
    for (const auto& [name, text] : b)
        BOOST_TEST(a.at(name) == text, name);
    const std::vector<float> lp = io::H5Reader(got).floats("/requests/output_logprobs");
    const std::vector<float> lp_ref = io::H5Reader(want).floats("/requests/output_logprobs");
    BOOST_REQUIRE_EQUAL(lp.size(), lp_ref.size());
    float worst = 0;
    for (size_t i = 0; i < lp.size(); ++i)
        worst = std::max(worst, std::abs(lp[i] - lp_ref[i]));
    BOOST_TEST(worst <= 1e-5f);
}

// Every file under dir that has a complete-looking HDF5 name (*.h5, not *.partial) opens.
void expect_no_torn_h5(const std::string& dir) {
    for (const auto& e : fs::recursive_directory_iterator(dir))
        if (e.is_regular_file() && e.path().extension() == ".h5")
            BOOST_CHECK_NO_THROW(io::H5Reader(e.path().string()).exists("/"));
}

// The uninterrupted infer run every infer case compares with, made once.
const std::string& infer_reference() {
    static const std::string out = [] {
        const std::string dir = scratch("infer-ref");
        const testing::RunResult r = testing::run_hymoe(kInfer + " --set job.output=" + dir);
        BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
        return dir;
    }();
    return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(faults)

// A job holds its output folder: a second job there exits 2 at once with one line naming the
// holder's host and pid; after the holder is killed with kill -9 its lock file stays, and the
// next job takes it over, says so in the log, and removes the file when it ends.
BOOST_AUTO_TEST_CASE(two_jobs_on_one_output_folder) {
    const std::string out = scratch("lock"), lock = out + "/.hymoe.lock", pidfile = out + ".pid";
    const char* bin = std::getenv("HYMOE_BIN");
    const std::string exe = bin ? bin : "build/hymoe";
    std::system((exe + " " + kInfer + " --set job.output=" + out + " >/dev/null 2>&1 & echo $! >" +
                 pidfile + ".tmp; mv " + pidfile + ".tmp " + pidfile)
                    .c_str());
    for (int i = 0; i < 400 && !fs::exists(pidfile); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const std::string pid = testing::read_text(pidfile);
    const std::string holder = "pid " + pid.substr(0, pid.find('\n'));
    for (int i = 0; i < 2000 && !contains(testing::read_text(lock), holder); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    BOOST_REQUIRE_MESSAGE(contains(testing::read_text(lock), holder), testing::read_text(lock));
    BOOST_TEST(testing::read_text(lock).starts_with("host "));

    const testing::RunResult second = testing::run_hymoe(kInfer + " --set job.output=" + out);
    const bool first_still_running = !fs::exists(out + "/results.h5");
    ::kill(std::stoi(pid), SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    BOOST_REQUIRE_MESSAGE(first_still_running, "the first job ended before the second started");
    BOOST_TEST(second.code == 2, second.err);
    BOOST_TEST(second.err_lines().size() == 1u, second.err);
    BOOST_TEST(contains(second.err, "job.output: another job (host "), second.err);
    BOOST_TEST(contains(second.err, holder + ") is writing to this folder"), second.err);
    BOOST_TEST(contains(testing::read_text(lock), holder));  // the holder's file is untouched

    const testing::RunResult third = testing::run_hymoe(kInfer + " --set job.output=" + out);
    BOOST_REQUIRE_MESSAGE(third.code == 0, third.err);
    const std::string log = testing::read_text(out + "/log");
    BOOST_TEST(contains(log, "taking over the stale lock"), log);
    BOOST_TEST(contains(log, holder + ")"), log);
    BOOST_TEST(!fs::exists(lock));  // removed at the end
    expect_same_results(out + "/results.h5", infer_reference() + "/results.h5");
    fs::remove(pidfile);
}

// The output folder on a 192 KiB tmpfs: the job stops with exit 1 or 3 and one error naming the
// file it could not write; no results.h5 and no other file under a complete-looking name is
// torn; with room again (the tmpfs grown) the rerun resumes and equals the uninterrupted run.
BOOST_AUTO_TEST_CASE(an_output_folder_on_a_full_filesystem) {
    const std::string out = scratch("full");
    fs::create_directories(out);
    if (::mount("tmpfs", out.c_str(), "tmpfs", 0, "size=192k") != 0) {
        BOOST_TEST_MESSAGE("skipped: cannot mount a tmpfs here (" << std::strerror(errno) << ")");
        return;
    }
    struct Unmount {
        std::string dir;
        ~Unmount() { ::umount2(dir.c_str(), MNT_DETACH); }
    } unmount{out};
    const testing::RunResult full = testing::run_hymoe(kInfer + " --set job.output=" + out);
    BOOST_TEST((full.code == 1 || full.code == 3), full.code << ": " << full.err);
    // one error line (then MPI_Abort's banner: the writer's error is a one-rank error)
    const std::vector<std::string> lines = full.err_lines();
    BOOST_REQUIRE(!lines.empty());
    BOOST_TEST(contains(lines[0], "[rank 0] HDF5: "), full.err);
    BOOST_TEST(contains(lines[0], out + "/"), full.err);  // names the file
    BOOST_TEST(contains(lines[0], "no space left on device"), full.err);
    BOOST_TEST(!fs::exists(out + "/results.h5"));
    expect_no_torn_h5(out);
    BOOST_REQUIRE(fs::exists(out + "/results.parts"));  // some segments made it

    BOOST_REQUIRE_EQUAL(::mount("tmpfs", out.c_str(), "tmpfs", MS_REMOUNT, "size=16m"), 0);
    const testing::RunResult rerun = testing::run_hymoe(kInfer + " --set job.output=" + out);
    BOOST_REQUIRE_MESSAGE(rerun.code == 0, rerun.err);
    BOOST_TEST(contains(rerun.out, "resuming: "), rerun.out);
    expect_same_results(out + "/results.h5", infer_reference() + "/results.h5");
}

// kill -9 with the second results segment written but not closed: the torn file is a .partial,
// the rerun deletes it, resumes from the first segment and equals the uninterrupted run.
BOOST_AUTO_TEST_CASE(kill_9_mid_results_segment) {
    const std::string out = scratch("kill-segment");
    const testing::RunResult killed =
        run_killed_at("results.parts/seg-000001.h5", kInfer + " --set job.output=" + out);
    BOOST_TEST(killed.code == 128 + SIGKILL);
    BOOST_TEST(fs::exists(out + "/results.parts/seg-000000.h5"));
    BOOST_TEST(fs::exists(out + "/results.parts/seg-000001.h5.partial"));
    BOOST_TEST(!fs::exists(out + "/results.parts/seg-000001.h5"));
    expect_no_torn_h5(out);
    const testing::RunResult rerun = testing::run_hymoe(kInfer + " --set job.output=" + out);
    BOOST_REQUIRE_MESSAGE(rerun.code == 0, rerun.err);
    BOOST_TEST(contains(rerun.out, "resuming: "), rerun.out);
    BOOST_TEST(!fs::exists(out + "/results.parts"));
    expect_same_results(out + "/results.h5", infer_reference() + "/results.h5");
}

// The fuzz finding of the journal reader (tests/fuzz/fuzz_journal.cpp): a segment whose columns
// disagree (here /line cut to one entry, with the HDF5 C API) was read past its end on resume;
// now the rerun stops with exit 3 naming the file and the column.
BOOST_AUTO_TEST_CASE(a_damaged_results_journal_is_refused_with_3) {
    const std::string out = scratch("damaged"), seg = out + "/results.parts/seg-000000.h5";
    BOOST_TEST(
        run_killed_at("results.parts/seg-000001.h5", kInfer + " --set job.output=" + out).code ==
        128 + SIGKILL);
    const hid_t f = H5Fopen(seg.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    BOOST_REQUIRE(f >= 0);
    const int64_t n = static_cast<int64_t>(io::H5Reader(seg).ints("/index").size());
    H5Ldelete(f, "/line", H5P_DEFAULT);
    const hsize_t one = 1;
    const int64_t line = 1;
    const hid_t space = H5Screate_simple(1, &one, nullptr);
    const hid_t d =
        H5Dcreate2(f, "/line", H5T_NATIVE_INT64, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, &line);
    H5Dclose(d), H5Sclose(space), H5Fclose(f);
    const testing::RunResult rerun = testing::run_hymoe(kInfer + " --set job.output=" + out);
    BOOST_TEST(rerun.code == 3, rerun.err);
    BOOST_REQUIRE(!rerun.err_lines().empty());
    BOOST_TEST(
        contains(rerun.err_lines()[0], cat(seg, ": /line holds 1 entries for ", n, " requests")),
        rerun.err);
    BOOST_TEST(!fs::exists(out + "/results.h5"));
}

// kill -9 while profile.h5 is written (after results.h5): no profile.h5 under its real name; the
// rerun writes both again, equal to the uninterrupted run.
BOOST_AUTO_TEST_CASE(kill_9_mid_profile) {
    const std::string out = scratch("kill-profile");
    const std::string args = kInfer + " --set profile.layers=true --set job.output=" + out;
    BOOST_TEST(run_killed_at("profile.h5", args).code == 128 + SIGKILL);
    BOOST_TEST(!fs::exists(out + "/profile.h5"));
    BOOST_TEST(fs::exists(out + "/profile.h5.partial"));
    expect_no_torn_h5(out);
    const testing::RunResult rerun = testing::run_hymoe(args);
    BOOST_REQUIRE_MESSAGE(rerun.code == 0, rerun.err);
    BOOST_TEST(io::H5Reader(out + "/profile.h5").exists("/meta"));
    expect_same_results(out + "/results.h5", infer_reference() + "/results.h5");
}

// kill -9 in a lora run with the step_4 checkpoint's tensors written but not closed, then with
// its manifest written but not renamed: the streamed results.h5 is whole, and each rerun resumes
// from the newest complete checkpoint and ends bit-identical to the uninterrupted run.
BOOST_AUTO_TEST_CASE(kill_9_mid_checkpoint) {
    const std::string every2 = " --set finetune.checkpoint.every=2 --set job.output=";
    const std::string ref = scratch("lora-ref");
    BOOST_REQUIRE_EQUAL(testing::run_hymoe(kLora + every2 + ref).code, 0);
    const std::vector<float> want = io::H5Reader(ref + "/results.h5").floats("/train/loss");
    for (const std::string at : {"step_4.partial/tensors.h5", "step_4.partial/manifest.json"}) {
        BOOST_TEST_CONTEXT("killed at " << at) {
            const std::string out = scratch("kill-ckpt");
            BOOST_TEST(run_killed_at(at, kLora + every2 + out).code == 128 + SIGKILL);
            BOOST_TEST(fs::exists(out + "/checkpoints/step_2/manifest.json"));
            BOOST_TEST(!fs::exists(out + "/checkpoints/step_4"));
            // results.h5 is rewritten at every checkpoint (finetune.log_every): whole, and the
            // uninterrupted run's losses so far
            const std::vector<float> live = io::H5Reader(out + "/results.h5").floats("/train/loss");
            BOOST_TEST(live.size() <= want.size());
            BOOST_TEST(std::equal(live.begin(), live.end(), want.begin()));
            // the newest complete checkpoint: step_2, or step_3 when its evaluation was the best
            // so far (checkpoint.best writes one there)
            int newest = 0;
            for (const auto& e : fs::directory_iterator(out + "/checkpoints"))
                if (e.path().filename().string().rfind("step_", 0) == 0 &&
                    fs::exists(e.path() / "manifest.json"))
                    newest = std::max(newest, std::stoi(e.path().filename().string().substr(5)));
            BOOST_TEST((newest == 2 || newest == 3));
            const testing::RunResult rerun = testing::run_hymoe(kLora + every2 + out);
            BOOST_REQUIRE_MESSAGE(rerun.code == 0, rerun.err);
            BOOST_TEST(contains(rerun.out, "resuming from"), rerun.out);
            BOOST_TEST(contains(rerun.out, "step_" + std::to_string(newest) + " after"), rerun.out);
            BOOST_TEST(io::H5Reader(out + "/results.h5").floats("/train/loss") == want);
        }
    }
}

// kill -9 in a convert with a stage file written but not closed: the folder has no manifest, so
// an infer job on it refuses with exit 3 naming it instead of reading the torn file; the rerun
// of the convert finishes and its manifest equals an uninterrupted convert's.
BOOST_AUTO_TEST_CASE(kill_9_mid_converted_model) {
    const std::string dir = scratch("convert");
    fs::create_directories(dir + "/hf");
    fs::copy_file("tests/models/tiny-kimi/config.json", dir + "/hf/config.json");
    model::Model m = model::make_model(model::load_model_config(dir + "/hf/config.json"));
    model::init_model_random(m, 31);
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const model::TensorSpec& t : model::model_tensors(m))
        tensors.emplace_back(t.name, t.dest->view());
    io::write_safetensors(dir + "/hf/model.safetensors", tensors, {}, DType::bf16);
    std::ofstream(dir + "/prompts.jsonl") << R"({"id": "a", "tokens": [1, 5, 9, 12, 40]})"
                                          << "\n";
    std::ofstream(dir + "/convert.yaml") << "job: {kind: convert, name: conv, output: ckpt}\n"
                                            "model: {config: hf/config.json, weights: hf}\n";
    std::ofstream(dir + "/infer.yaml") << "job: {kind: infer, name: inf, output: out}\n"
                                          "model: {config: hf/config.json, weights: ckpt}\n"
                                          "inference: {dataset: prompts.jsonl}\n";
    BOOST_REQUIRE_EQUAL(testing::run_hymoe(dir + "/convert.yaml --set job.output=ref").code, 0);

    BOOST_TEST(run_killed_at("ckpt/stage0.h5", dir + "/convert.yaml").code == 128 + SIGKILL);
    BOOST_TEST(!fs::exists(dir + "/ckpt/manifest.json"));
    BOOST_TEST(!fs::exists(dir + "/ckpt/stage0.h5"));
    const testing::RunResult refused = testing::run_hymoe(dir + "/infer.yaml");
    BOOST_TEST(refused.code == 3);
    BOOST_REQUIRE(!refused.err_lines().empty());
    BOOST_TEST(contains(refused.err_lines()[0], dir + "/ckpt: holds neither"), refused.err);
    const testing::RunResult rerun = testing::run_hymoe(dir + "/convert.yaml");
    BOOST_REQUIRE_MESSAGE(rerun.code == 0, rerun.err);
    const auto tensors_of = [](const std::string& manifest) {
        return nlohmann::json::parse(testing::read_text(manifest)).at("tensors").dump();
    };
    BOOST_TEST(tensors_of(dir + "/ckpt/manifest.json") == tensors_of(dir + "/ref/manifest.json"));
    BOOST_TEST(testing::run_hymoe(dir + "/infer.yaml").code == 0);
}

// kill -9 while tokens.h5 is merged from its chunks: no tokens.h5 under its real name; the rerun
// resumes from the chunks and its file equals an uninterrupted run's.
BOOST_AUTO_TEST_CASE(kill_9_mid_tokenized_dataset) {
    const std::string ref = scratch("tok-ref"), out = scratch("tok-kill");
    BOOST_REQUIRE_EQUAL(testing::run_hymoe(kTokenize + " --set job.output=" + ref).code, 0);
    BOOST_TEST(run_killed_at("tok-kill/tokens.h5", kTokenize + " --set job.output=" + out).code ==
               128 + SIGKILL);
    BOOST_TEST(!fs::exists(out + "/tokens.h5"));
    expect_no_torn_h5(out);
    const testing::RunResult rerun = testing::run_hymoe(kTokenize + " --set job.output=" + out);
    BOOST_REQUIRE_MESSAGE(rerun.code == 0, rerun.err);
    BOOST_TEST(contains(testing::read_text(out + "/log"), "chunks resumed"));
    for (const char* name : {"/tokens", "/offsets", "/line"})
        BOOST_TEST(io::H5Reader(out + "/tokens.h5").ints(name) ==
                       io::H5Reader(ref + "/tokens.h5").ints(name),
                   name);
}

BOOST_AUTO_TEST_SUITE_END()
