// From the command line to a validated job: the deck (rank 0 reads it, every rank parses the
// same bytes), the model config, and the layout checked against both the world size and the
// model. Every failure here is collective (all ranks see the same bytes) and exits 2.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "hymoe/deck/deck.h"
#include "hymoe/model/config.h"
#include "hymoe/parallel/grid.h"

namespace hymoe::runtime {

struct CommandLine {
    std::string deck_path;
    bool check = false;             // validate, print the plan, exit
    std::vector<std::string> sets;  // --set key.path=value
    bool help = false, version = false;
    bool ranks = false;               // print the ranks the deck needs (tp·dp·pp), exit
    std::vector<std::string> gather;  // --gather OUT_DIR SHARD_DIR...: merge results.h5 files
    // The one-shot (runtime/prompt.h): --model DIR|PRESET --prompt TEXT [--tokenizer PATH]
    // [--max-tokens N] [--temperature T] [--chat]
    std::string model, prompt, tokenizer;
    int max_tokens = -1;     // −1: the deck default (inference.max_new_tokens)
    double temperature = 0;  // greedy
    bool chat = false;       // the prompt as a user message through the model's chat_template
    bool one_shot() const { return !model.empty() || !prompt.empty(); }
};

// Throws Exit::invalid with the usage line on a malformed command line.
CommandLine parse_command_line(int argc, char** argv);
std::string usage();
// The ranks the deck's layout needs (tp·dp·pp), after every rule a run on that many ranks would
// check before allocating: the layout against itself and the model (load_job) and the
// pre-flight data checks of runtime/preflight.h (collective). slurm/submit asks it, so that a job
// that would exit 2 or 3 at once is never queued.
int deck_ranks(const CommandLine& cli);

struct Job {
    deck::Deck deck;
    model::ModelConfig model;
    parallel::Layout layout;
    bool stream_text = false;  // hymoe --prompt: rank 0 writes each output token's text to
                               //   stdout as it is drawn (runtime/prompt.h)
};

// Collective over the world.
Job load_job(const CommandLine& cli, int world_size);

// The first rule of check_model_layout that a layout breaks, without throwing (the plan's layout
// search asks it of thousands of layouts): the deck key, the rule in a few words (the same for
// every layout that breaks it, for the search's summary) and the sentence with the numbers.
struct LayoutProblem {
    std::string key;   // "parallel.tp"
    std::string rule;  // "tp does not divide the KDA heads"
    std::string what;  // "3 does not divide the KDA heads = 32 (tp splits the KDA heads)"
};
std::optional<LayoutProblem> model_layout_problem(const model::ModelConfig& model,
                                                  const parallel::Layout& layout);

// Every rule that ties the layout to the model (heads, KDA heads, indexer heads, vocab, FFN
// widths against tp; experts against ep; expert width against etp; layers and '|' stages
// against pp). One Exit::invalid sentence naming the deck key and the numbers:
// "<deck.locate(key)>: <what>" of model_layout_problem.
void check_model_layout(const model::ModelConfig& model,
                        const parallel::Layout& layout,
                        const deck::Deck& deck);

}  // namespace hymoe::runtime
