// The convert job (runtime/model_checkpoint.h): every rank reads its slices of the HF safetensors
// folder (stored dtype kept: bf16 stays bf16), the checkpoint files are written collectively, the
// source files are hashed (spread over the ranks), and rank 0 writes manifest.json last: a folder
// without it is not a checkpoint.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "hymoe/core/error.h"
#include "hymoe/core/log.h"
#include "hymoe/core/sha256.h"
#include "hymoe/core/timer.h"
#include "hymoe/io/safetensors.h"
#include "hymoe/parallel/mpi_env.h"
#include "hymoe/runtime/model_checkpoint.h"
#include "hymoe/runtime/output_lock.h"

namespace hymoe::runtime {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The name of a convert job's manifest, or "" when dir/manifest.json is not one.
std::string convert_job_of(const fs::path& dir) {
    std::ifstream f(dir / "manifest.json");
    const json m = json::parse(f, nullptr, false);
    return m.is_object() && m.value("format", "") == "hymoe-model" ? m.value("job", "") : "";
}

// The files a convert may find in its own earlier output.
bool convert_output(const std::string& name) {
    return name == "log" || name == kOutputLockName || name == "manifest.json" ||
           name == "manifest.json.partial" ||
           (name.starts_with("stage") && (name.ends_with(".h5") || name.ends_with(".h5.partial")));
}

// What makes dir another job's output ("" if nothing does).
std::string foreign_output(const fs::path& dir, const std::string& job_name) {
    std::error_code ec;
    if (!fs::exists(dir, ec))
        return "";
    if (!fs::is_directory(dir, ec))
        return "it is not a folder";
    if (fs::exists(dir / "manifest.json")) {
        const std::string owner = convert_job_of(dir);
        if (owner != job_name)
            return owner.empty() ? "it holds a manifest.json that is not a model checkpoint's"
                                 : "it holds the checkpoint of convert job '" + owner + "'";
    }
    for (const fs::directory_entry& e : fs::directory_iterator(dir, ec))
        if (!convert_output(e.path().filename().string()))
            return "it holds " + e.path().filename().string();
    return "";
}

// The HDF5 file of a tensor: its stage's, or its stage's and ep rank's for a routed expert.
std::string file_of(const std::string& name, const model::ModelShard& shard) {
    const std::string stage = "stage" + std::to_string(shard.stage);
    const bool routed = name.find(".experts.") != std::string::npos;
    return routed ? stage + "-ep" + std::to_string(shard.ep_rank) + ".h5" : stage + ".h5";
}

// FP8 weights are kept dequantized in bf16, as DeepSeek's fp8_cast_bf16.py writes them.
DType kept_dtype(io::StDType t) {
    if (t == io::StDType::bf16 || t == io::StDType::f8_e4m3)
        return DType::bf16;
    return t == io::StDType::f16 ? DType::f16 : DType::f32;
}

std::string sha256_file(const fs::path& path) {
    std::ifstream f(path, std::ios::binary);
    std::vector<char> block(size_t{16} << 20);
    Sha256 h;
    while (f) {
        f.read(block.data(), static_cast<std::streamsize>(block.size()));
        h.update(block.data(), static_cast<size_t>(f.gcount()));
    }
    return h.hex_digest();
}

// {name, bytes, sha256} of the deck's config file and of every .json and .safetensors file of
// the source folder, each hashed by one rank (file i by rank i mod world).
json hash_sources(const Job& job, const comm::Comm& world) {
    std::vector<fs::path> files;
    const fs::path config = job.deck.model.config, src = job.deck.model.weights;
    if (!config.empty())
        files.push_back(config);
    if (fs::is_directory(src)) {
        std::vector<fs::path> in_folder;
        for (const fs::directory_entry& e : fs::directory_iterator(src)) {
            const fs::path ext = e.path().extension();
            if (e.is_regular_file() && (ext == ".json" || ext == ".safetensors") &&
                (config.empty() || !fs::equivalent(e.path(), config)))
                in_folder.push_back(e.path());
        }
        std::sort(in_folder.begin(), in_folder.end());
        files.insert(files.end(), in_folder.begin(), in_folder.end());
    } else {
        files.push_back(src);
    }
    json mine = json::object();
    for (size_t i = 0; i < files.size(); ++i)
        if (static_cast<int>(i % static_cast<size_t>(world.size())) == world.rank())
            mine[std::to_string(i)] = sha256_file(files[i]);
    json hashes = json::object();
    for (const std::string& text : io::all_gather_strings(mine.dump(), world))
        hashes.update(json::parse(text));
    json out = json::array();
    for (size_t i = 0; i < files.size(); ++i)
        out.push_back({{"path", files[i].string()},
                       {"bytes", fs::file_size(files[i])},
                       {"sha256", hashes.at(std::to_string(i))}});
    return out;
}

}  // namespace

void check_convert_output(const Job& job) {
    std::string problem;
    if (parallel::world_rank() == 0)
        problem = foreign_output(job.deck.job.output, job.deck.job.name);
    problem = parallel::broadcast_bytes(problem, 0);
    if (!problem.empty())
        HYMOE_FAIL(Exit::invalid,
                   job.deck.locate("job.output"),
                   ": a convert job writes only into an empty folder or its own earlier output, "
                   "but '",
                   job.deck.job.output,
                   "' is another job's output (",
                   problem,
                   ")");
}

int run_convert(const Job& job, const parallel::Grid& grid) {
    const double t0 = wall_seconds();
    const std::string out = job.deck.job.output;
    const comm::Comm& world = grid.comms.world;
    if (grid.rank == 0)  // the old manifest goes first: until the new one lands, no checkpoint
        fs::remove(out + "/manifest.json");
    comm::barrier(world);

    model::Model m = model::make_model(job.model, grid);
    io::SafetensorsFolder folder(job.deck.model.weights);
    if (job.model.quant.fp8)
        folder.set_fp8({job.model.quant.block_rows, job.model.quant.block_cols},
                       job.deck.model.config);
    std::vector<Buffer> held;
    std::vector<io::CkptEntry> entries;
    const model::TensorList list = model::model_tensors(m);
    held.reserve(list.size());
    int64_t bytes = 0;
    for (const model::TensorSpec& spec : list) {
        const io::SafetensorsInfo& info = folder.info(spec.name);
        const model::TensorPart part = model::part_of(spec, m.shard);
        io::CkptEntry e{
            spec.name, {}, part.dim, part.begin, part.full, true, file_of(spec.name, m.shard)};
        Shape whole = spec.shape;
        if (spec.split_dim >= 0)
            whole[spec.split_dim] = e.full;
        if (info.shape != whole)
            HYMOE_FAIL_ONE(Exit::bad_input,
                           job.deck.model.weights,
                           ": ",
                           spec.name,
                           " is ",
                           shape_string(info.shape),
                           " but the model config gives it ",
                           shape_string(whole));
        held.emplace_back(kept_dtype(info.dtype), spec.shape);
        e.local = held.back().view();
        if (spec.split_dim < 0)
            folder.read(spec.name, e.local);
        else
            folder.read_slice(spec.name, spec.split_dim, e.begin, e.local);
        bytes += static_cast<int64_t>(e.local.bytes());
        entries.push_back(std::move(e));
    }
    const double t_read = wall_seconds();
    const std::string tensors = io::write_tensors(world, out, entries, true);
    const double t_write = wall_seconds();
    const json sources = hash_sources(job, world);
    const int64_t total = comm::all_reduce_value(bytes, world);

    if (grid.rank == 0) {
        const json t = json::parse(tensors);
        std::vector<std::string> files;
        for (const auto& [name, meta] : t.items())
            files.push_back(meta.at("file"));
        std::sort(files.begin(), files.end());
        files.erase(std::unique(files.begin(), files.end()), files.end());
        const parallel::Layout& l = job.layout;
        const json manifest = {
            {"format", "hymoe-model"},
            {"version", 1},
            {"job", job.deck.job.name},
            {"created", log::utc_timestamp()},
            {"model_type", job.model.model_type},
            {"model_config", json::parse(model::to_json(job.model))},
            {"layout", {{"tp", l.tp}, {"pp", l.pp}, {"dp", l.dp}, {"ep", l.ep}, {"etp", l.etp}}},
            {"source", sources},
            {"files", files},
            {"tensors", t}};
        io::write_manifest(out, manifest.dump(1));
    }
    comm::barrier(world);
    char line[200];
    std::snprintf(line,
                  sizeof line,
                  "%zu tensors on rank 0, %.3f GiB read by all ranks; read %.2f s, written %.2f s, "
                  "sources hashed %.2f s",
                  list.size(),
                  static_cast<double>(total) / (1 << 30),
                  t_read - t0,
                  t_write - t_read,
                  wall_seconds() - t_write);
    log::info(std::string("convert: ") + line);
    log::info("wrote the checkpoint " + out + " (manifest.json)");
    return 0;
}

}  // namespace hymoe::runtime
