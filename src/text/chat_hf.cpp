// HF chat templates (text/chat.h): tokenizer_config.json's chat_template, bos_token and eos_token,
// rendered by the Jinja subset (text/jinja.h) with HF's variables: messages (role, content),
// add_generation_prompt, bos_token, eos_token, tools = none.
// The tokenize job's loss mask needs the assistant's text apart from the template's own text,
// which a rendered string does not say. It is found by rendering prefixes of the conversation:
//   R(k, g) = the template on messages[0..k) with add_generation_prompt = g
//   message k's pieces = R(k+1, no) minus R(k, no); for an assistant message they are cut at
//   R(k, yes): the generation prompt is the template's (not a target), the rest is the target
//   (the content and whatever the template closes the turn with, e.g. <|im_end|>).
// Each rendering must start with the one before it; a template that rewrites earlier turns
// when later ones come (some drop old reasoning) is refused with Exit::invalid naming the file.
// O(messages²) renderings: conversations are short.
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "hymoe/core/error.h"
#include "hymoe/text/chat.h"
#include "hymoe/text/jinja.h"

namespace hymoe::text {

namespace fs = std::filesystem;

namespace {

// bos_token / eos_token: a string, {"content": "..."} (AddedToken) or null.
std::string special_token(const nlohmann::json& j, const char* key, const std::string& file) {
    if (!j.contains(key) || j[key].is_null())
        return "";
    const nlohmann::json& v = j[key];
    if (v.is_string())
        return v.get<std::string>();
    if (v.is_object() && v.contains("content") && v["content"].is_string())
        return v["content"].get<std::string>();
    HYMOE_FAIL(
        Exit::invalid, file, ": ", key, " is neither a string nor an object with a content string");
}

}  // namespace

ChatTemplate load_hf_chat_template(const std::string& tokenizer_dir) {
    const std::string file = (fs::path(tokenizer_dir) / "tokenizer_config.json").string();
    std::ifstream in(file, std::ios::binary);
    if (!in)
        HYMOE_FAIL(Exit::invalid,
                   file,
                   ": cannot read it (tokenizer.chat: template reads the chat_template there)");
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.is_object())
        HYMOE_FAIL(Exit::invalid, file, ": not a JSON object");
    if (!j.contains("chat_template"))
        HYMOE_FAIL(Exit::invalid, file, ": has no chat_template");
    if (!j["chat_template"].is_string())
        HYMOE_FAIL(Exit::invalid,
                   file,
                   ": chat_template is not a string (named templates are not supported)");
    ChatTemplate t;
    t.source = file;
    t.jinja_bos = special_token(j, "bos_token", file);
    t.jinja_eos = special_token(j, "eos_token", file);
    t.jinja = jinja::parse(j["chat_template"].get<std::string>(), file + ": chat_template");
    return t;
}

std::string render_hf_chat(const ChatTemplate& t,
                           const std::vector<ChatMessage>& messages,
                           bool add_generation_prompt) {
    jinja::List list;
    for (const ChatMessage& m : messages)
        list.push_back(jinja::Value::of_dict({{"role", jinja::Value::string(m.role)},
                                              {"content", jinja::Value::string(m.content)}}));
    const jinja::Dict globals = {
        {"messages", jinja::Value::of_list(std::move(list))},
        {"add_generation_prompt", jinja::Value::boolean(add_generation_prompt)},
        {"bos_token", jinja::Value::string(t.jinja_bos)},
        {"eos_token", jinja::Value::string(t.jinja_eos)},
        {"tools", jinja::Value::none()}};
    return jinja::render(*t.jinja, globals);
}

std::vector<ChatPiece> hf_chat_pieces(const ChatTemplate& t,
                                      const std::vector<ChatMessage>& messages) {
    std::vector<ChatPiece> out;
    std::vector<ChatMessage> head;
    std::string prev = render_hf_chat(t, head, false);
    auto extends = [&](const std::string& longer, const std::string& shorter, size_t k) {
        if (!longer.starts_with(shorter))
            HYMOE_FAIL(Exit::invalid,
                       t.source,
                       ": chat_template: the conversation up to message ",
                       k + 1,
                       " does not render as a continuation of the one before it, so the "
                       "assistant's text cannot be cut out for the loss mask (use a preset)");
    };
    if (!prev.empty())
        out.push_back({prev, false});
    for (size_t k = 0; k < messages.size(); ++k) {
        std::string opened = prev;
        if (messages[k].role == "assistant") {
            opened = render_hf_chat(t, head, true);
            extends(opened, prev, k);
            if (opened.size() > prev.size())
                out.push_back({opened.substr(prev.size()), false});
        }
        head.push_back(messages[k]);
        std::string next = render_hf_chat(t, head, false);
        extends(next, opened, k);
        if (next.size() > opened.size())
            out.push_back({next.substr(opened.size()), messages[k].role == "assistant"});
        prev = std::move(next);
    }
    return out;
}

}  // namespace hymoe::text
