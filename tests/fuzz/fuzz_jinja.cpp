// Fuzz target: a chat template (text/jinja.h), as a tokenizer_config.json "chat_template" brings
// it. One that parses is rendered with the variables an HF chat template sees (messages of three
// roles, bos/eos tokens, add_generation_prompt); both steps may only return or throw hymoe::Error.
#include "fuzz.h"
#include "hymoe/text/jinja.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    namespace jinja = hymoe::text::jinja;
    const std::string source(reinterpret_cast<const char*>(data), size);
    return hymoe::fuzz::guarded([&] {
        const auto t = jinja::parse(source, "tokenizer_config.json: chat_template");
        auto message = [](const char* role, const char* content) {
            return jinja::Value::of_dict(
                {{"role", jinja::Value::string(role)}, {"content", jinja::Value::string(content)}});
        };
        const jinja::Dict globals = {
            {"messages",
             jinja::Value::of_list({message("system", "Be brief."),
                                    message("user", "hello {{ x }} \xE2\x82\xAC\xFF"),
                                    message("assistant", "hi")})},
            {"bos_token", jinja::Value::string("<s>")},
            {"eos_token", jinja::Value::string("</s>")},
            {"add_generation_prompt", jinja::Value::boolean(true)},
        };
        jinja::render(*t, globals);
    });
}
