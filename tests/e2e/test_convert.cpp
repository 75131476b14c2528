// The convert job and model checkpoints, with the real binary: a tiny Kimi-Linear-type HF folder
// (random weights, bf16 safetensors) converted at one rank, at tp2·ep2 and at tp2·pp2·ep2, each
// checkpoint loaded at each of those layouts gives every rank the tensors it gets from the
// safetensors directly (bit for bit); infer jobs from a checkpoint give the tokens and logprobs of
// the same job from the safetensors; the manifest records the layout, bf16 and the source hashes.
// Fault drills: a flipped byte, a truncated file and a different model config exit 4 naming the
// tensor (or the config key); converting into another job's output folder exits 2; and a
// checkpoint writer killed with SIGKILL mid-write leaves the previous checkpoint loadable.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <hdf5.h>
#include <nlohmann/json.hpp>

#include "hymoe/core/error.h"
#include "hymoe/core/sha256.h"
#include "hymoe/io/checkpoint.h"
#include "hymoe/io/h5.h"
#include "hymoe/io/safetensors.h"
#include "hymoe/runtime/model_checkpoint.h"
#include "run_binary.h"

namespace fs = std::filesystem;
using namespace hymoe;
using nlohmann::json;

namespace {

const std::string kDir = "build/e2e/convert";

const parallel::Layout kOne{1, 1, 1, 1, 1}, kTp2Ep2{2, 1, 1, 2, 1}, kTp2Pp2Ep2{2, 1, 2, 2, 1};

std::string cfg_path() {
    return kDir + "/hf/config.json";
}

// The HF folder (config.json, model.safetensors in bf16) and the decks, made once per run.
struct Folder {
    Folder() {
        fs::remove_all(kDir);
        fs::create_directories(kDir + "/hf");
        fs::copy_file("tests/models/tiny-kimi/config.json", cfg_path());
        model::Model m = model::make_model(model::load_model_config(cfg_path()));
        model::init_model_random(m, 31);
        std::vector<std::pair<std::string, Tensor>> tensors;
        for (const model::TensorSpec& t : model::model_tensors(m))
            tensors.emplace_back(t.name, t.dest->view());
        io::write_safetensors(kDir + "/hf/model.safetensors", tensors, {}, DType::bf16);
        std::ofstream(kDir + "/prompts.jsonl") << R"({"id": "a", "tokens": [1, 5, 9, 12, 40]})"
                                               << "\n"
                                               << R"({"id": "b", "tokens": [200, 17, 42]})"
                                               << "\n";
        std::ofstream(kDir + "/convert.yaml") << "job: {kind: convert, name: conv, output: ckpt}\n"
                                                 "model: {config: hf/config.json, weights: hf}\n";
        std::ofstream(kDir + "/infer.yaml")
            << "job: {kind: infer, name: inf, output: out}\n"
               "model: {config: hf/config.json, weights: hf}\n"
               "inference: {dataset: prompts.jsonl, prompt_logprobs: true, max_new_tokens: 6}\n";
    }
};

std::string layout_sets(const parallel::Layout& l) {
    return cat(
        " --set parallel.tp=", l.tp, " --set parallel.pp=", l.pp, " --set parallel.ep=", l.ep);
}

// Convert into kDir/<out> at layout l (l.world() ranks).
testing::RunResult convert(const std::string& out, const parallel::Layout& l) {
    return testing::run_hymoe(kDir + "/convert.yaml --set job.output=" + out + layout_sets(l),
                              l.world() > 1 ? l.world() : 0);
}

// The checkpoints every case below uses, converted once.
const std::vector<std::pair<std::string, parallel::Layout>> kCkpts = {
    {"ckpt1", kOne}, {"ckpt2", kTp2Ep2}, {"ckpt4", kTp2Pp2Ep2}};

struct Converted : Folder {
    bool ok = true;
    Converted() {
        for (const auto& [name, l] : kCkpts) {
            auto r = convert(name, l);
            if (r.code != 0)
                BOOST_TEST_MESSAGE(r.err), ok = false;
        }
    }
};

using Tensors = std::map<std::string, std::vector<float>>;

// Every tensor rank `rank` holds under layout l, filled by read.
Tensors load_rank(const parallel::Layout& l, int rank, const model::ReadTensor& read) {
    const model::ModelConfig cfg = model::load_model_config(cfg_path());
    model::Model m = model::make_model(cfg);
    m.shard = model::make_shard(cfg, l, parallel::coords_of(l, rank));
    m.local = model::local_config(cfg, m.shard);
    model::load_model_weights(m, read);
    Tensors out;
    for (const model::TensorSpec& t : model::model_tensors(m))
        out[t.name].assign(t.dest->ptr<float>(), t.dest->ptr<float>() + t.dest->view().numel());
    return out;
}

// The safetensors folder read as infer_setup.cpp reads it.
model::ReadTensor safetensors_reader(const io::SafetensorsFolder& folder) {
    return [&folder](const std::string& name, const model::TensorPart& part, Tensor& dest) {
        if (part.dim < 0)
            folder.read(name, dest);
        else
            folder.read_slice(name, part.dim, part.begin, dest);
    };
}

std::string sha256_file(const std::string& path) {
    Sha256 h;
    h.update(testing::read_text(path));
    return h.hex_digest();
}

// Flip one byte of dataset `name` (contiguous) in an HDF5 file.
void flip_byte(const std::string& file, const std::string& name) {
    hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, name.c_str(), H5P_DEFAULT);
    const haddr_t at = H5Dget_offset(d);
    H5Dclose(d);
    H5Fclose(f);
    BOOST_REQUIRE(at != HADDR_UNDEF);
    std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(static_cast<std::streamoff>(at + 3));
    char c = 0;
    io.get(c);
    io.seekp(static_cast<std::streamoff>(at + 3));
    io.put(static_cast<char>(c ^ 0x04));
}

}  // namespace

BOOST_AUTO_TEST_SUITE(convert_job)

BOOST_FIXTURE_TEST_CASE(checkpoints_load_at_any_layout_as_the_safetensors_do, Converted) {
    BOOST_REQUIRE(ok);
    const io::SafetensorsFolder folder(kDir + "/hf");
    for (const auto& [name, saved] : kCkpts) {
        const std::string dir = kDir + "/" + name;
        BOOST_TEST(runtime::is_model_checkpoint(dir));
        const model::ReadTensor read =
            runtime::open_model_checkpoint(dir, model::load_model_config(cfg_path()));
        for (const parallel::Layout& l : {kOne, kTp2Ep2, kTp2Pp2Ep2})
            for (int rank = 0; rank < l.world(); ++rank) {
                const Tensors want = load_rank(l, rank, safetensors_reader(folder));
                const Tensors got = load_rank(l, rank, read);
                BOOST_TEST((got == want),
                           name << " loaded at tp" << l.tp << " pp" << l.pp << " ep" << l.ep
                                << " rank " << rank);
            }
        // the manifest: the layout, the source's hash; the tensors kept in bf16
        const json m = json::parse(testing::read_text(dir + "/manifest.json"));
        BOOST_TEST(m["layout"]["tp"] == saved.tp);
        BOOST_TEST(m["layout"]["pp"] == saved.pp);
        BOOST_TEST(m["layout"]["ep"] == saved.ep);
        bool found = false;
        for (const json& s : m["source"])
            if (fs::path(s["path"].get<std::string>()).filename() == "model.safetensors")
                found = s["sha256"] == sha256_file(kDir + "/hf/model.safetensors");
        BOOST_TEST(found);
        io::H5Reader h5(dir + "/stage0.h5");
        BOOST_TEST(h5.attr("/model.embed_tokens.weight", "dtype") == "bf16");
        BOOST_TEST(m["tensors"]["model.embed_tokens.weight"]["pieces"].size() == size_t(saved.tp));
    }
    BOOST_TEST(fs::exists(kDir + "/ckpt2/stage0-ep1.h5"));
    BOOST_TEST(fs::exists(kDir + "/ckpt4/stage1-ep0.h5"));
}

BOOST_FIXTURE_TEST_CASE(infer_from_a_checkpoint_gives_the_safetensors_results, Converted) {
    BOOST_REQUIRE(ok);
    auto infer = [](const std::string& out, const std::string& weights, const parallel::Layout& l) {
        auto r = testing::run_hymoe(kDir + "/infer.yaml --set job.output=" + out +
                                        " --set model.weights=" + weights + layout_sets(l),
                                    l.world() > 1 ? l.world() : 0);
        BOOST_TEST(r.code == 0, r.err);
        io::H5Reader h5(kDir + "/" + out + "/results.h5");
        return std::make_pair(h5.ints("/requests/output_tokens"),
                              h5.floats("/requests/prompt_logprobs"));
    };
    const auto hf1 = infer("out_hf1", "hf", kOne);
    BOOST_TEST(hf1.first.size() > 0u);
    BOOST_TEST((infer("out_c2", "ckpt2", kOne) == hf1));  // converted at tp2·ep2, run at 1 rank
    const auto hf2 = infer("out_hf2", "hf", kTp2Ep2);
    BOOST_TEST((infer("out_c1", "ckpt1", kTp2Ep2) == hf2));  // converted at 1 rank, run at tp2·ep2
    BOOST_TEST((infer("out_c4", "ckpt4", kTp2Ep2) == hf2));
}

BOOST_FIXTURE_TEST_CASE(damaged_or_mismatched_checkpoints_exit_4, Converted) {
    BOOST_REQUIRE(ok);
    auto infer = [](const std::string& weights, const std::string& extra = "") {
        return testing::run_hymoe(
            kDir + "/infer.yaml --set job.output=out_bad --set model.weights=" + weights + extra);
    };
    const std::string norm = "model.layers.1.input_layernorm.weight";
    fs::copy(kDir + "/ckpt2", kDir + "/flip");
    flip_byte(kDir + "/flip/stage0.h5", "/" + norm);
    auto r = infer("flip");
    BOOST_TEST(r.code == 4, r.err);
    BOOST_TEST(r.err.find(norm) != std::string::npos, r.err);
    BOOST_TEST(r.err.find("stage0.h5") != std::string::npos, r.err);

    fs::copy(kDir + "/ckpt2", kDir + "/cut");
    fs::resize_file(kDir + "/cut/stage0-ep1.h5", fs::file_size(kDir + "/cut/stage0-ep1.h5") / 2);
    r = infer("cut");
    BOOST_TEST(r.code == 4, r.err);
    BOOST_TEST(r.err.find("stage0-ep1.h5") != std::string::npos, r.err);
    BOOST_TEST(r.err.find(".experts.") != std::string::npos, r.err);  // the tensor is named

    json other = json::parse(testing::read_text(cfg_path()));
    other["rms_norm_eps"] = 1e-3;
    std::ofstream(kDir + "/hf/other.json") << other.dump();
    r = infer("ckpt2", " --set model.config=hf/other.json");
    BOOST_TEST(r.code == 4, r.err);
    BOOST_TEST(r.err.find("different model config") != std::string::npos, r.err);
    BOOST_TEST(r.err.find("rms_norm_eps") != std::string::npos, r.err);
    r = infer("ckpt2", " --set model.config=../../../tests/models/tiny-deepseek/config.json");
    BOOST_TEST(r.code == 4, r.err);
}

// The layout as README "Checkpoints" documents it, checked independently with h5py and hashlib:
// every dataset's shape and dtype attribute, every piece's sha256 over its own row-major bytes,
// each tensor's sha256 of its pieces' digests, and bf16 bits that decode to the norms' ones.
BOOST_FIXTURE_TEST_CASE(h5py_reads_a_checkpoint_and_checks_its_hashes, Folder) {
    BOOST_REQUIRE(convert("ckpt", kTp2Pp2Ep2).code == 0);
    const std::string script =
        "import h5py, hashlib, json, sys, numpy as np\n"
        "d = sys.argv[1]; m = json.load(open(d + '/manifest.json'))\n"
        "assert m['format'] == 'hymoe-model' and m['layout']['pp'] == 2\n"
        "n = 0\n"
        "for name, t in m['tensors'].items():\n"
        "    x = h5py.File(d + '/' + t['file'], 'r')[name]\n"
        "    assert list(x.shape) == t['shape'] and x.attrs['dtype'].decode() == t['dtype'], name\n"
        "    a, s, digests = x[()], t['split_dim'], ''\n"
        "    for p in t['pieces']:\n"
        "        part = a if s < 0 else np.take(a, range(p['begin'], p['begin'] + p['rows']), s)\n"
        "        h = hashlib.sha256(np.ascontiguousarray(part).tobytes()).hexdigest()\n"
        "        assert h == p['sha256'], name\n"
        "        digests += h\n"
        "    assert hashlib.sha256(digests.encode()).hexdigest() == t['sha256'], name\n"
        "    if name.endswith('layernorm.weight'):\n"
        "        assert ((a.astype(np.uint32) << 16).view(np.float32) == 1).all(), name\n"
        "    n += 1\n"
        "print('checked', n)\n";
    std::ofstream(kDir + "/check.py") << script;
    const int rc = std::system(
        ("/usr/bin/python3 " + kDir + "/check.py " + kDir + "/ckpt >" + kDir + "/check.txt 2>&1")
            .c_str());
    BOOST_TEST(rc == 0, testing::read_text(kDir + "/check.txt"));
    model::Model whole = model::make_model(model::load_model_config(cfg_path()));
    const std::string checked = cat("checked ", model::model_tensors(whole).size(), "\n");
    BOOST_TEST(testing::read_text(kDir + "/check.txt") == checked);
}

BOOST_FIXTURE_TEST_CASE(convert_refuses_another_jobs_output, Folder) {
    auto r = testing::run_hymoe(kDir + "/infer.yaml");  // the infer job's out/ holds results.h5
    BOOST_REQUIRE_MESSAGE(r.code == 0, r.err);
    r = convert("out", kOne);
    BOOST_TEST(r.code == 2, r.err);
    BOOST_TEST(r.err.find("another job's output") != std::string::npos, r.err);
    BOOST_TEST(!fs::exists(kDir + "/out/manifest.json"));
    BOOST_REQUIRE(convert("mine", kOne).code == 0);
    r = testing::run_hymoe(kDir + "/convert.yaml --set job.output=mine --set job.name=other");
    BOOST_TEST(r.code == 2, r.err);
    BOOST_TEST(r.err.find("convert job 'conv'") != std::string::npos, r.err);
    BOOST_TEST(convert("mine", kTp2Ep2).code == 0);  // its own earlier output: converted again
    BOOST_TEST(json::parse(testing::read_text(kDir + "/mine/manifest.json"))["layout"]["tp"] == 2);
}

BOOST_AUTO_TEST_CASE(a_writer_killed_mid_checkpoint_leaves_the_previous_one_loadable) {
    const char* bin = std::getenv("HYMOE_BIN");
    const std::string test_mpi =
        (fs::canonical(bin ? bin : "build/hymoe").parent_path() / "test_mpi").string();
    BOOST_REQUIRE_MESSAGE(fs::exists(test_mpi), test_mpi << " is not built (make all)");
    const std::string root = kDir + "-kill";
    fs::remove_all(root);
    fs::create_directories(root);
    std::fflush(stdout);  // or the child's copy of the buffer is printed twice
    const pid_t pid = fork();
    if (pid == 0) {
        setenv("HYMOE_CKPT_DRILL", root.c_str(), 1);
        freopen("/dev/null", "w", stdout);
        execl(test_mpi.c_str(), test_mpi.c_str(), "--run_test=checkpoint/writer_loop", nullptr);
        _exit(127);
    }
    // wait until a step after the first is being written, then kill the writer in the middle
    bool mid_write = false;
    for (int i = 0; i < 6000 && !mid_write; ++i) {
        for (int step = 2; step < 50 && !mid_write; ++step)
            mid_write = fs::exists(root + "/step_" + std::to_string(step) + ".partial");
        if (!mid_write)
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    BOOST_TEST(mid_write);
    BOOST_TEST((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL));

    const std::string dir = io::latest_checkpoint(root);
    BOOST_REQUIRE(!dir.empty());
    const std::string text = io::read_manifest(dir);
    const int64_t step = json::parse(json::parse(text)["state_json"].get<std::string>())["step"];
    BOOST_TEST(dir == root + "/step_" + std::to_string(step));
    io::TensorStore store(dir, text);
    Buffer w(DType::f32, store.shape("w"));
    store.read("w", -1, 0, 0, w.view());  // verifies its checksum
    bool all_step = true;
    for (int64_t i = 0; i < w.view().numel(); ++i)
        all_step = all_step && w.ptr<float>()[i] == static_cast<float>(step);
    BOOST_TEST(all_step);
    fs::remove_all(root);
}

BOOST_AUTO_TEST_SUITE_END()
