// Chat template vs tokenizer (deck/chat_check.h).
#include "hymoe/deck/chat_check.h"

#include <utility>
#include <vector>

#include "hymoe/core/error.h"
#include "hymoe/text/chat.h"

namespace hymoe::deck {

void check_chat_template(const Deck& deck, const text::Tokenizer& tok) {
    const TokenizerSection& t = deck.tokenizer;
    const text::ChatTemplate& c = t.chat_template;
    if (c.jinja) {
        // A sample conversation through the template and the tokenizer: a special token the
        // tokenizer lacks, or a construct outside the Jinja subset on this path, fails here.
        const std::vector<text::ChatMessage> sample = {
            {"user", "u"}, {"assistant", "a"}, {"user", "v"}};
        try {
            tok.encode(text::render_chat(c, sample));
        } catch (const Error& e) {
            HYMOE_FAIL(Exit::invalid,
                       deck.locate("tokenizer.chat"),
                       ": the chat_template on a user, assistant, user conversation: ",
                       e.what(),
                       " (tokenizer ",
                       t.path,
                       ")");
        }
        return;
    }
    const text::ChatTemplate preset =
        t.chat == "none" ? text::ChatTemplate{} : text::chat_preset(t.chat);
    auto preset_role = [&](const std::string& role) {
        auto it = preset.roles.find(role);
        return it == preset.roles.end() ? text::ChatRole{} : it->second;
    };
    // (key, the template's text, the preset's text)
    std::vector<std::pair<std::string, std::pair<std::string, std::string>>> fields = {
        {"bos", {c.bos, preset.bos}},
        {"generation_prefix", {c.generation_prefix, preset.generation_prefix}}};
    for (const auto& [role, r] : c.roles) {
        fields.push_back({"roles." + role + ".prefix", {r.prefix, preset_role(role).prefix}});
        fields.push_back({"roles." + role + ".suffix", {r.suffix, preset_role(role).suffix}});
    }
    for (const auto& [key, texts] : fields) {
        try {
            tok.encode(texts.first);
        } catch (const Error& e) {
            const bool from_preset = t.chat != "none" && texts.first == texts.second;
            HYMOE_FAIL(
                Exit::invalid,
                deck.locate(from_preset ? "tokenizer.chat" : "tokenizer." + key),
                ": ",
                from_preset ? "the " + t.chat + " preset's tokenizer." + key + " has an " : "",
                e.what(),
                " (not a token of the tokenizer ",
                t.path,
                ")");
        }
    }
}

}  // namespace hymoe::deck
