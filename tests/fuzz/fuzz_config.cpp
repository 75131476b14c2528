// Fuzz target: a model config.json (HF kimi_linear / deepseek_v32, or hymoe's own type) ->
// a validated ModelConfig or one hymoe::Error (model/config.h); a config that passes is also
// described and counted, as `plan` does.
#include "fuzz.h"
#include "hymoe/model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    return hymoe::fuzz::guarded([&] {
        const hymoe::model::ModelConfig cfg = hymoe::model::parse_model_config(text, "config.json");
        hymoe::model::describe(cfg);
        hymoe::model::count_params(cfg);
        hymoe::model::to_json(cfg);
    });
}
