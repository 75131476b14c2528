// A model checkpoint as the weights of a job (runtime/model_checkpoint.h): the manifest's model
// config compared with the job's, then each rank's slices read through io::TensorStore.
#include "hymoe/runtime/model_checkpoint.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "hymoe/core/error.h"

namespace hymoe::runtime {

namespace fs = std::filesystem;
using nlohmann::json;

bool is_model_checkpoint(const std::string& dir) {
    std::ifstream f(fs::path(dir) / "manifest.json");
    const json m = json::parse(f, nullptr, false);  // a missing or broken file: discarded
    return m.is_object() && m.value("format", "").starts_with("hymoe-");
}

model::ReadTensor open_model_checkpoint(const std::string& dir, const model::ModelConfig& cfg) {
    const std::string text = io::read_manifest(dir);
    json manifest;
    try {
        manifest = json::parse(text);
    } catch (const json::exception& e) {
        HYMOE_FAIL(Exit::checkpoint, dir, "/manifest.json is not valid JSON (", e.what(), ")");
    }
    if (manifest.value("format", "") != "hymoe-model")
        HYMOE_FAIL(Exit::checkpoint,
                   "model.weights: ",
                   dir,
                   " holds a '",
                   manifest.value("format", "?"),
                   "' manifest, not a model checkpoint (made by a convert job)");
    const json mine = json::parse(model::to_json(cfg));
    const json theirs = manifest.value("model_config", json::object());
    if (manifest.value("model_type", "") != cfg.model_type)
        HYMOE_FAIL(Exit::checkpoint,
                   "model.weights: checkpoint ",
                   dir,
                   " holds a '",
                   manifest.value("model_type", "?"),
                   "' model, but this job's model is '",
                   cfg.model_type,
                   "'");
    const json patch = json::diff(theirs, mine);
    if (!patch.empty()) {
        const std::string key = patch[0].value("path", "/");
        const json::json_pointer at(key);
        HYMOE_FAIL(Exit::checkpoint,
                   "model.weights: checkpoint ",
                   dir,
                   " was converted from a different model config (",
                   key.substr(1),
                   " is ",
                   theirs.contains(at) ? theirs.at(at).dump() : "absent",
                   " there, ",
                   mine.contains(at) ? mine.at(at).dump() : "absent",
                   " in this job's)");
    }
    auto store = std::make_shared<io::TensorStore>(dir, text);
    return [store](const std::string& name, const model::TensorPart& part, Tensor& dest) {
        store->read(name, part.dim, part.begin, part.full, dest);
    };
}

io::CkptEntry checkpoint_entry(const model::TensorSpec& t, const model::ModelShard& shard) {
    const model::TensorPart part = model::part_of(t, shard);
    return {t.name, t.dest->view(), part.dim, part.begin, part.full, true, ""};
}

}  // namespace hymoe::runtime
