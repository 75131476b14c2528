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
#include <memory>
#include <string>
#include <vector>

namespace hymoe::text {

namespace jinja {
struct Template;  // text/jinja.h
}

struct ChatRole {
    std::string prefix, suffix;
};

struct ChatTemplate {
    std::string bos;
    std::map<std::string, ChatRole> roles;  // system, user, assistant
    std::string generation_prefix;
    // tokenizer.chat: template: the model's own Jinja chat_template (text/chat_hf.cpp); when set,
    // it renders the conversation and the fields above are unused.
    std::shared_ptr<const jinja::Template> jinja;
    std::string jinja_bos, jinja_eos;  // tokenizer_config.json bos_token / eos_token ("" none)
    std::string source;                // that tokenizer_config.json, for errors
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
// does not have. A Jinja template renders the conversation cut after each message, without and
// (before an assistant message) with the generation prompt; each rendering must extend the one
// before it (Exit::invalid naming the file otherwise), and the text an assistant message adds
// after the generation prompt is its target piece (chat_hf.cpp).
std::vector<ChatPiece> chat_pieces(const ChatTemplate& t, const std::vector<ChatMessage>& messages);
// The prompt: every piece, then the generation prefix.
std::string render_chat(const ChatTemplate& t, const std::vector<ChatMessage>& messages);

// tokenizer.chat: template: the chat_template, bos_token and eos_token of an HF
// tokenizer_config.json (tokenizer_dir/tokenizer_config.json); Exit::invalid naming the file
// for a missing or non-string chat_template, or a template outside the Jinja subset.
ChatTemplate load_hf_chat_template(const std::string& tokenizer_dir);
// The Jinja template rendered (add_generation_prompt as given; tools none).
std::string render_hf_chat(const ChatTemplate& t,
                           const std::vector<ChatMessage>& messages,
                           bool add_generation_prompt);
std::vector<ChatPiece> hf_chat_pieces(const ChatTemplate& t,
                                      const std::vector<ChatMessage>& messages);

}  // namespace hymoe::text
