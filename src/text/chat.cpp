// Chat templates: the presets and the rendering of a conversation (text/chat.h).
#include "hymoe/text/chat.h"

#include "hymoe/core/error.h"

namespace hymoe::text {

const std::vector<std::string> kChatPresets = {"kimi", "deepseek"};

ChatTemplate chat_preset(const std::string& name) {
    ChatTemplate t;
    if (name == "kimi") {
        t.roles["system"] = {"<|im_system|>system<|im_middle|>", "<|im_end|>"};
        t.roles["user"] = {"<|im_user|>user<|im_middle|>", "<|im_end|>"};
        t.roles["assistant"] = {"<|im_assistant|>assistant<|im_middle|>", "<|im_end|>"};
        t.generation_prefix = "<|im_assistant|>assistant<|im_middle|>";
    } else if (name == "deepseek") {
        t.bos = "<｜begin▁of▁sentence｜>";
        t.roles["system"] = {"", ""};
        t.roles["user"] = {"<｜User｜>", ""};
        t.roles["assistant"] = {"<｜Assistant｜></think>", "<｜end▁of▁sentence｜>"};
        t.generation_prefix = "<｜Assistant｜></think>";
    } else {
        HYMOE_FAIL(Exit::invalid, "unknown chat preset '", name, "' (kimi, deepseek)");
    }
    return t;
}

std::vector<ChatPiece> chat_pieces(const ChatTemplate& t,
                                   const std::vector<ChatMessage>& messages) {
    if (t.jinja)
        return hf_chat_pieces(t, messages);
    std::vector<ChatPiece> out;
    if (!t.bos.empty())
        out.push_back({t.bos, false});
    for (const ChatMessage& m : messages) {
        auto it = t.roles.find(m.role);
        if (it == t.roles.end())
            HYMOE_FAIL(Exit::bad_input, "message role '", m.role, "' is not in the chat template");
        const bool target = m.role == "assistant";
        out.push_back({it->second.prefix, false});
        out.push_back({m.content + it->second.suffix, target});
    }
    return out;
}

std::string render_chat(const ChatTemplate& t, const std::vector<ChatMessage>& messages) {
    if (t.jinja)
        return render_hf_chat(t, messages, true);
    std::string s;
    for (const ChatPiece& p : chat_pieces(t, messages))
        s += p.text;
    return s + t.generation_prefix;
}

}  // namespace hymoe::text
