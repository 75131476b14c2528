// PEFT adapter folders (io/peft.h): the config JSON and the safetensors file, written atomically.
#include "hymoe/io/peft.h"

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "hymoe/core/error.h"
#include "hymoe/io/durable.h"
#include "hymoe/io/safetensors.h"

namespace hymoe::io {

namespace fs = std::filesystem;

double PeftConfig::scale() const {
    return alpha / (rslora ? std::sqrt(static_cast<double>(r)) : static_cast<double>(r));
}

std::string peft_key(const std::string& module, char factor) {
    return "base_model.model." + module + ".lora_" + factor + ".weight";
}

void write_peft(const std::string& dir,
                const PeftConfig& config,
                const std::vector<std::pair<std::string, Tensor>>& tensors) {
    const std::string partial = dir + ".partial";
    fs::remove_all(partial);
    fs::create_directories(partial);
    write_safetensors(
        partial + "/adapter_model.safetensors", tensors, {{"format", "pt"}}, DType::f32);
    nlohmann::ordered_json j;
    j["peft_type"] = "LORA";
    j["task_type"] = "CAUSAL_LM";
    j["r"] = config.r;
    j["lora_alpha"] = config.alpha;
    j["lora_dropout"] = config.dropout;
    j["target_modules"] = config.target_modules;
    j["use_rslora"] = config.rslora;
    j["bias"] = "none";
    j["init_lora_weights"] = true;
    j["base_model_name_or_path"] = config.base_model;
    std::ofstream(partial + "/adapter_config.json") << j.dump(2) << "\n";
    publish_dir(partial, dir);
}

PeftConfig read_peft_config(const std::string& dir) {
    const std::string path = dir + "/adapter_config.json";
    std::ifstream in(path);
    if (!in)
        HYMOE_FAIL(Exit::bad_input,
                   path,
                   ": cannot be read (a PEFT adapter folder holds "
                   "adapter_config.json and adapter_model.safetensors)");
    try {
        const nlohmann::json j = nlohmann::json::parse(in);
        if (j.value("peft_type", "") != "LORA")
            HYMOE_FAIL(Exit::bad_input, path, ": peft_type is not LORA");
        PeftConfig c;
        c.r = j.at("r").get<int>();
        c.alpha = j.at("lora_alpha").get<double>();
        c.dropout = j.value("lora_dropout", 0.0);
        c.rslora = j.value("use_rslora", false);
        if (j.contains("target_modules") && j["target_modules"].is_array())
            c.target_modules = j["target_modules"].get<std::vector<std::string>>();
        c.base_model = j.value("base_model_name_or_path", "");
        if (c.r <= 0)
            HYMOE_FAIL(Exit::bad_input, path, ": r must be positive");
        return c;
    } catch (const nlohmann::json::exception& e) {
        HYMOE_FAIL(Exit::bad_input, path, ": ", e.what());
    }
}

}  // namespace hymoe::io
