// Chat formatting by role prefixes and suffixes (deck tokenizer.chat). A conversation renders as
//   bos + Σ (roles[m.role].prefix + m.content + roles[m.role].suffix) + generation_prefix
// where generation_prefix opens the assistant's turn the model is to write. Special tokens in the
// template are written as text and become their ids when the result is encoded.
// Presets (the models' documented formats, without default system prompts or tool calls):
//   kimi:     <|im_system|>system<|im_middle|>…<|im_end|>, <|im_user|>user<|im_middle|>…<|im_end|>,
//             <|im_assistant|>assistant<|im_middle|>…<|im_end|>; no bos
//   deepseek: <｜begin▁of▁sentence｜> bos, system text bare, <｜User｜>…, <｜Assistant｜></think>…
//             <｜end▁of▁sentence｜> (V3.1/V3.2 non-thinking mode)
#pragma once

#include <map>
#include <string>
#include <vector>

namespace hymoe::text {

struct ChatRole {
    std::string prefix, suffix;
};

struct ChatTemplate {
    std::string bos;
    std::map<std::string, ChatRole> roles;  // system, user, assistant
    std::string generation_prefix;
};

struct ChatMessage {
    std::string role, content;
};

// One stretch of the rendered text; target: the model is trained to write it (assistant content
// and suffix), for the tokenize job's loss mask.
struct ChatPiece {
    std::string text;
    bool target = false;
};

// "kimi" or "deepseek"; Exit::invalid for another name.
ChatTemplate chat_preset(const std::string& name);
extern const std::vector<std::string> kChatPresets;

// The pieces of a conversation (no generation prefix); Exit::bad_input for a role the template
// does not have.
std::vector<ChatPiece> chat_pieces(const ChatTemplate& t, const std::vector<ChatMessage>& messages);
// The prompt: every piece, then the generation prefix.
std::string render_chat(const ChatTemplate& t, const std::vector<ChatMessage>& messages);

}  // namespace hymoe::text
