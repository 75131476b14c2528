// The JSONL request reader and the choice of reader by file type (see io/requests.h).
#include "hymoe/io/requests.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "hymoe/core/error.h"
#include "hymoe/io/h5.h"
#include "hymoe/text/utf8.h"

namespace hymoe::io {

std::unique_ptr<RequestReader> open_h5_requests(const std::string& path);  // requests_h5.cpp

namespace {

class JsonlReader : public RequestReader {
public:
    explicit JsonlReader(const std::string& path) : path_(path), in_(path) {
        if (!in_)
            HYMOE_FAIL(Exit::bad_input, path, ": cannot open the request file");
    }
    bool next(Request& r) override;

private:
    std::string path_;
    std::ifstream in_;
    int64_t line_ = 0;
};

}  // namespace

int64_t count_requests(const std::string& path) {
    if (path.ends_with(".h5") || path.ends_with(".hdf5"))
        return shape_numel(H5Reader(path).shape("/offsets")) - 1;
    std::ifstream in(path);
    int64_t n = 0;
    for (std::string line; std::getline(in, line);)
        n += line.find_first_not_of(" \t\r") != std::string::npos;
    return n;
}

std::unique_ptr<RequestReader> open_requests(const std::string& path) {
    if (path.ends_with(".h5") || path.ends_with(".hdf5"))
        return open_h5_requests(path);
    return std::make_unique<JsonlReader>(path);
}

namespace {

// The request's own sampling settings (vLLM's SamplingParams names and ranges); bad(what) throws.
template <typename Bad>
void read_sampling(const nlohmann::json& j, Request& r, const Bad& bad) {
    auto number = [&](const char* key, double lo, double hi, bool lo_open) {
        const auto& v = j[key];
        const double x = v.is_number() ? v.get<double>() : lo - 1;
        if (!v.is_number() || x < lo || (lo_open && x == lo) || x > hi)
            bad(cat("\"", key, "\" must be a number in ", lo_open ? "(" : "[", lo, ", ", hi, "]"));
        return x;
    };
    if (j.contains("temperature"))
        r.temperature = number("temperature", 0, 1e4, false);
    if (j.contains("top_p"))
        r.top_p = number("top_p", 0, 1, true);
    if (j.contains("min_p"))
        r.min_p = number("min_p", 0, 1, false);
    if (j.contains("presence_penalty"))
        r.presence_penalty = number("presence_penalty", -2, 2, false);
    if (j.contains("frequency_penalty"))
        r.frequency_penalty = number("frequency_penalty", -2, 2, false);
    if (j.contains("repetition_penalty"))
        r.repetition_penalty = number("repetition_penalty", 0, 100, true);
    if (j.contains("top_k")) {
        const auto& k = j["top_k"];
        if (!k.is_number_integer() || k.get<int64_t>() < -1 || k.get<int64_t>() > (1 << 30))
            bad("\"top_k\" must be an integer: -1 or 0 (no top-k filter) or the tokens to keep");
        r.top_k = static_cast<int>(std::max<int64_t>(k.get<int64_t>(), 0));
    }
    if (j.contains("seed")) {
        const auto& s = j["seed"];
        if (!s.is_number_integer() || s.get<int64_t>() < 0)
            bad("\"seed\" must be a non-negative integer");
        r.seed = s.get<int64_t>();
    }
}

// "stop" (a string or a list of them, each non-empty) and "stop_token_ids" (a list of ids).
template <typename Bad>
void read_stops(const nlohmann::json& j, Request& r, const Bad& bad) {
    r.has_stop = j.contains("stop");
    r.has_stop_token_ids = j.contains("stop_token_ids");
    if (j.contains("stop")) {
        const auto& s = j["stop"];
        const nlohmann::json list = s.is_string() ? nlohmann::json::array({s}) : s;
        if (!list.is_array())
            bad("\"stop\" must be a string or a list of strings");
        for (const auto& x : list) {
            if (!x.is_string() || x.get_ref<const std::string&>().empty())
                bad("\"stop\" holds " + x.dump() + ", not a non-empty string");
            r.stop.push_back(x.get<std::string>());
        }
    }
    if (j.contains("stop_token_ids")) {
        const auto& s = j["stop_token_ids"];
        if (!s.is_array())
            bad("\"stop_token_ids\" must be a list of token ids");
        for (const auto& t : s) {
            if (!t.is_number_integer() || t.get<int64_t>() < 0)
                bad("\"stop_token_ids\" holds " + t.dump() + ", not a token id");
            r.stop_token_ids.push_back(t.get<int64_t>());
        }
    }
}

}  // namespace

std::vector<text::ChatMessage> messages_from_json(const nlohmann::json& j) {
    if (!j.is_array() || j.empty())
        HYMOE_FAIL(Exit::bad_input, "\"messages\" must be a non-empty list");
    std::vector<text::ChatMessage> out;
    for (const auto& m : j) {
        if (!m.is_object() || !m.contains("role") || !m["role"].is_string() ||
            !m.contains("content") || !m["content"].is_string())
            HYMOE_FAIL(Exit::bad_input,
                       "\"messages\" holds ",
                       m.dump().substr(0, 80),
                       ", not {\"role\": string, \"content\": string}");
        out.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    }
    return out;
}

bool JsonlReader::next(Request& r) {
    std::string line;
    do {
        if (!std::getline(in_, line))
            return false;
        ++line_;
    } while (line.find_first_not_of(" \t\r") == std::string::npos);  // blank lines are skipped
    r = Request{};
    r.line = line_;
    auto bad = [&](const std::string& what) {
        HYMOE_FAIL(Exit::bad_input, path_, ":", line_, ": ", what);
    };
    if (const size_t at = text::utf8_first_invalid(line); at != std::string::npos)
        bad(cat("invalid UTF-8 at byte ", at, " of the line"));
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object())
        bad("not a JSON object");
    const int prompts = j.contains("tokens") + j.contains("text") + j.contains("messages");
    if (prompts != 1)
        bad("give the prompt as exactly one of \"tokens\", \"text\" or \"messages\"");
    if (j.contains("text")) {
        if (!j["text"].is_string() || j["text"].get_ref<const std::string&>().empty())
            bad("\"text\" must be a non-empty string");
        r.text = j["text"].get<std::string>();
    } else if (j.contains("messages")) {
        try {
            r.messages = messages_from_json(j["messages"]);
        } catch (const Error& e) {
            bad(e.what());
        }
    } else {
        if (!j["tokens"].is_array() || j["tokens"].empty())
            bad("\"tokens\" must be a non-empty list of token ids");
        for (const auto& t : j["tokens"]) {
            if (!t.is_number_integer() || t.get<int64_t>() < 0)
                bad("\"tokens\" holds " + t.dump() + ", not a token id");
            r.tokens.push_back(t.get<int64_t>());
        }
    }
    if (j.contains("id")) {
        const auto& id = j["id"];
        if (!id.is_string() && !id.is_number_integer())
            bad("\"id\" must be a string or an integer");
        r.id = id.is_string() ? id.get<std::string>() : id.dump();
    } else {
        r.id = "line-" + std::to_string(line_);
    }
    if (j.contains("max_new_tokens") && j.contains("max_tokens"))
        bad("give \"max_tokens\" or \"max_new_tokens\", not both");
    for (const char* key : {"max_new_tokens", "max_tokens"}) {
        if (!j.contains(key))
            continue;
        const auto& m = j[key];
        if (!m.is_number_integer() || m.get<int64_t>() < 0 || m.get<int64_t>() > (1 << 24))
            bad(cat("\"", key, "\" must be an integer from 0 to 16777216"));
        r.max_new_tokens = static_cast<int>(m.get<int64_t>());
    }
    read_sampling(j, r, bad);
    read_stops(j, r, bad);
    if (j.contains("n")) {
        const auto& n = j["n"];
        if (!n.is_number_integer() || n.get<int64_t>() < 1 || n.get<int64_t>() > 4096)
            bad("\"n\" must be an integer from 1 to 4096 (the samples of the request)");
        r.n = static_cast<int>(n.get<int64_t>());
        r.has_n = true;
    }
    if (j.contains("adapter")) {
        if (!j["adapter"].is_string())
            bad("\"adapter\" must be a string");
        r.adapter = j["adapter"].get<std::string>();
    }
    if (j.contains("images")) {
        if (!j["images"].is_array())
            bad("\"images\" must be a list of image file paths");
        const std::filesystem::path dir = std::filesystem::path(path_).parent_path();
        for (const auto& im : j["images"]) {
            if (!im.is_string() || im.get<std::string>().empty())
                bad("\"images\" holds " + im.dump() + ", not an image file path");
            const std::filesystem::path f = im.get<std::string>();
            r.images.push_back(f.is_absolute() ? f.string() : (dir / f).string());
        }
    }
    return true;
}

}  // namespace hymoe::io
