// The one-shot --model/--prompt (runtime/prompt.h): writes the deck and the request, runs the
// infer job with its text streamed, and prints the summary.
#include "hymoe/runtime/prompt.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "hymoe/core/error.h"
#include "hymoe/core/log.h"
#include "hymoe/core/timer.h"
#include "hymoe/model/config.h"
#include "hymoe/parallel/comms.h"
#include "hymoe/parallel/mpi_env.h"
#include "hymoe/runtime/run.h"

namespace hymoe::runtime {

namespace fs = std::filesystem;

namespace {

// A YAML (flow) string: JSON's quoting is YAML's double-quoted scalar.
std::string quoted(const std::string& s) {
    return nlohmann::json(s).dump();
}

// The deck's model and tokenizer lines for --model and --tokenizer.
std::string model_lines(const CommandLine& cli) {
    std::string tokenizer = cli.tokenizer;
    std::string model;
    if (fs::is_directory(cli.model)) {
        const fs::path dir = fs::absolute(cli.model);
        if (!fs::exists(dir / "config.json"))
            HYMOE_FAIL(Exit::invalid, "--model ", cli.model, ": the folder holds no config.json");
        model = "{config: " + quoted((dir / "config.json").string()) +
                ", weights: " + quoted(dir.string()) + "}";
        if (tokenizer.empty())
            tokenizer = dir.string();
    } else {
        const std::vector<std::string> presets = model::preset_names();
        if (std::find(presets.begin(), presets.end(), cli.model) == presets.end())
            HYMOE_FAIL(
                Exit::invalid,
                "--model ",
                cli.model,
                ": neither a model folder nor a preset (",
                [&] {
                    std::string s;
                    for (const std::string& p : presets)
                        s += (s.empty() ? "" : ", ") + p;
                    return s;
                }(),
                ")");
        model = "{preset: " + quoted(cli.model) + ", init: random}";
        if (tokenizer.empty())
            HYMOE_FAIL(Exit::invalid,
                       "--model ",
                       cli.model,
                       " is a preset with random weights and no tokenizer: give --tokenizer PATH");
    }
    return "model: " + model + "\ntokenizer: {path: " + quoted(fs::absolute(tokenizer).string()) +
           (cli.chat ? ", chat: template" : "") + "}\n";
}

}  // namespace

int run_prompt(const CommandLine& cli) {
    if (parallel::world_size() != 1)
        HYMOE_FAIL(Exit::invalid, "--prompt runs on one rank, not ", parallel::world_size());
    const std::string lines = model_lines(cli);
    std::string tmp = (fs::temp_directory_path() / "hymoe-prompt-XXXXXX").string();
    if (::mkdtemp(tmp.data()) == nullptr)
        HYMOE_FAIL(Exit::internal, "cannot make a temporary folder like ", tmp);
    nlohmann::json request = {{"id", "prompt"}};
    if (cli.chat)
        request["messages"] = {{{"role", "user"}, {"content", cli.prompt}}};
    else
        request["text"] = cli.prompt;
    std::ofstream(tmp + "/request.jsonl") << request.dump() << "\n";
    std::ofstream(tmp + "/deck.yaml")
        << "job: {kind: infer, name: prompt, output: " << quoted(tmp + "/out") << "}\n"
        << lines << "inference:\n  dataset: " << quoted(tmp + "/request.jsonl") << "\n"
        << (cli.max_tokens >= 0 ? cat("  max_new_tokens: ", cli.max_tokens, "\n") : "")
        << "  sampling: {temperature: " << cli.temperature << "}\n";
    CommandLine deck_cli;
    deck_cli.deck_path = tmp + "/deck.yaml";
    deck_cli.sets = cli.sets;
    log::console(false);
    const double t0 = wall_seconds();
    int code = 0;
    try {
        Job job = load_job(deck_cli, 1);
        job.stream_text = true;
        code = run_job(job, parallel::make_grid(job.layout));
    } catch (const Error&) {
        std::fprintf(stderr, "hymoe --prompt: the deck and log are kept in %s\n", tmp.c_str());
        throw;
    }
    std::fputs("\n", stdout);
    std::fflush(stdout);
    const double seconds = wall_seconds() - t0;
    if (code != 0) {
        std::fprintf(stderr, "hymoe --prompt: exit %d; the log is %s/out/log\n", code, tmp.c_str());
        return code;
    }
    std::ifstream in(tmp + "/out/results.jsonl");
    const nlohmann::json r = nlohmann::json::parse(in);
    const nlohmann::json& out = r["outputs"][0];
    const auto generated = static_cast<int64_t>(out["token_ids"].size());
    std::fprintf(stderr,
                 "%lld prompt tokens, %lld generated (finish %s) in %.2f s, %.1f tokens/s\n",
                 static_cast<long long>(r["prompt_len"].get<int64_t>()),
                 static_cast<long long>(generated),
                 out["finish_reason"].get<std::string>().c_str(),
                 seconds,
                 static_cast<double>(generated) / seconds);
    fs::remove_all(tmp);
    return 0;
}

}  // namespace hymoe::runtime
