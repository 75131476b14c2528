// LoRA adapters in the PEFT format, so they move between hymoe and HF PEFT / vLLM:
//   DIR/adapter_model.safetensors  "base_model.model.<module>.lora_A.weight" [r, in] and
//                                  ".lora_B.weight" [out, r] per adapted module, fp32
//   DIR/adapter_config.json        peft_type LORA, task_type CAUSAL_LM, r, lora_alpha,
//                                  lora_dropout, target_modules, use_rslora, bias "none",
//                                  init_lora_weights, base_model_name_or_path
// The folder is written as DIR.partial and renamed over DIR when complete.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "hymoe/tensor/tensor.h"

namespace hymoe::io {

struct PeftConfig {
    int r = 0;
    double alpha = 0;
    double dropout = 0;
    bool rslora = false;
    std::vector<std::string> target_modules;
    std::string base_model;  // base_model_name_or_path
    // The factor every adapted product is scaled by: alpha / r, or alpha / √r with rsLoRA.
    double scale() const;
};

// The safetensors key of a module's factor: "base_model.model.<module>.lora_A.weight".
std::string peft_key(const std::string& module, char factor);

// tensors: (module path + ".lora_A" / ".lora_B", whole factor) pairs, keyed by peft_key.
void write_peft(const std::string& dir,
                const PeftConfig& config,
                const std::vector<std::pair<std::string, Tensor>>& tensors);

// adapter_config.json of DIR; a missing or bad file: Exit::bad_input naming it.
PeftConfig read_peft_config(const std::string& dir);

}  // namespace hymoe::io
