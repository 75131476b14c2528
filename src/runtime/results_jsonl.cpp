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
    const std::vector<int64_t> sample = r.ints("/requests/sample");
    const std::string path = out_dir + "/results.jsonl", partial = path + ".partial";
    int64_t lines = 0;
    {
        std::ofstream out(partial, std::ios::binary | std::ios::trunc);
        for (size_t i = 0; i < id.size();) {  // rows i .. e − 1: the samples of one request
            size_t e = i;
            nlohmann::json outputs = nlohmann::json::array();
            for (; e < id.size() && index[e] == index[i]; ++e) {
                const auto b = offsets[e], end = offsets[e + 1];
                nlohmann::json o = {{"index", sample[e]}};
                if (!text.empty())
                    o["text"] = text[e];
                o["token_ids"] = std::vector<int64_t>(tokens.begin() + b, tokens.begin() + end);
                o["logprobs"] = std::vector<float>(logprobs.begin() + b, logprobs.begin() + end);
                double cumulative = 0;
                for (auto k = b; k < end; ++k)
                    cumulative += static_cast<double>(logprobs[static_cast<size_t>(k)]);
                o["cumulative_logprob"] = cumulative;
                o["finish_reason"] = finish[e];
                // vLLM's stop_reason: the stop token id or stop string that ended it, else null
                if (stop_token[e] >= 0)
                    o["stop_reason"] = stop_token[e];
                else if (!stop_string[e].empty())
                    o["stop_reason"] = stop_string[e];
                else
                    o["stop_reason"] = nullptr;
                outputs.push_back(std::move(o));
            }
            const nlohmann::json j = {{"id", id[i]},
                                      {"index", index[i]},
                                      {"line", line[i]},
                                      {"prompt_len", prompt_len[i]},
                                      {"adapter", adapter[i]},
                                      {"outputs", std::move(outputs)}};
            out << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
            ++lines;
            i = e;
        }
        if (!out.flush())
            HYMOE_FAIL_ONE(Exit::internal, partial, ": write failed");
    }
    std::filesystem::rename(partial, path);
    return lines;
}

}  // namespace hymoe::runtime
