// results.jsonl from a finished results.h5 (runtime/results_jsonl.h).
#include "hymoe/runtime/results_jsonl.h"

#include <cstdint>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "hymoe/core/error.h"
#include "hymoe/io/h5.h"

namespace hymoe::runtime {

int64_t write_results_jsonl(const std::string& out_dir) {
    io::H5Reader r(out_dir + "/results.h5");
    const std::vector<std::string> id = r.strings("/requests/id");
    const std::vector<std::string> finish = r.strings("/requests/finish_reason");
    const std::vector<std::string> adapter = r.strings("/requests/adapter");
    const std::vector<std::string> stop_string = r.strings("/requests/stop_string");
    const std::vector<int64_t> stop_token = r.ints("/requests/stop_token");
    const std::vector<std::string> text = r.exists("/requests/output_text")
                                              ? r.strings("/requests/output_text")
                                              : std::vector<std::string>{};
    const std::vector<int64_t> index = r.ints("/requests/index"), line = r.ints("/requests/line");
    const std::vector<int64_t> prompt_len = r.ints("/requests/prompt_len");
    const std::vector<int64_t> offsets = r.ints("/requests/output_offsets");  // [N + 1]
    const std::vector<int64_t> tokens = r.ints("/requests/output_tokens");
    const std::vector<float> logprobs = r.floats("/requests/output_logprobs");
    const std::string path = out_dir + "/results.jsonl", partial = path + ".partial";
    {
        std::ofstream out(partial, std::ios::binary | std::ios::trunc);
        for (size_t i = 0; i < id.size(); ++i) {
            nlohmann::json j = {{"id", id[i]},
                                {"index", index[i]},
                                {"line", line[i]},
                                {"prompt_len", prompt_len[i]}};
            if (!text.empty())
                j["output_text"] = text[i];
            j["output_tokens"] =
                std::vector<int64_t>(tokens.begin() + offsets[i], tokens.begin() + offsets[i + 1]);
            j["output_logprobs"] = std::vector<float>(logprobs.begin() + offsets[i],
                                                      logprobs.begin() + offsets[i + 1]);
            j["finish_reason"] = finish[i];
            // vLLM's stop_reason: the stop token id or stop string that ended it, else null
            if (stop_token[i] >= 0)
                j["stop_reason"] = stop_token[i];
            else if (!stop_string[i].empty())
                j["stop_reason"] = stop_string[i];
            else
                j["stop_reason"] = nullptr;
            j["adapter"] = adapter[i];
            out << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
        }
        if (!out.flush())
            HYMOE_FAIL_ONE(Exit::internal, partial, ": write failed");
    }
    std::filesystem::rename(partial, path);
    return static_cast<int64_t>(id.size());
}

}  // namespace hymoe::runtime
