// Pre-flight checks of the tokenizer and the lora datasets against the model's vocabulary
// (runtime/preflight.h).
#include "hymoe/runtime/preflight.h"

#include "hymoe/core/error.h"
#include "hymoe/core/log.h"
#include "hymoe/io/token_data.h"
#include "hymoe/parallel/mpi_env.h"
#include "hymoe/text/tokenizer.h"

namespace hymoe::runtime {

std::string vocab_source(const deck::Deck& deck) {
    return deck.model.preset.empty() ? "model.config: " + deck.model.config
                                     : "model.preset: " + deck.model.preset;
}

void check_tokenizer_vocab(const Job& job) {
    const deck::Deck& d = job.deck;
    if (!d.tokenizer.present)
        return;
    const text::Tokenizer tok = text::load_tokenizer(d.tokenizer.path, d.tokenizer.pattern);
    if (tok.n_vocab() > job.model.vocab_size)
        HYMOE_FAIL(Exit::invalid,
                   d.locate("tokenizer.path"),
                   ": the tokenizer '",
                   d.tokenizer.path,
                   "' has ",
                   tok.n_vocab(),
                   " token ids (",
                   tok.describe(),
                   "), more than the model's vocabulary of ",
                   job.model.vocab_size,
                   " (",
                   vocab_source(d),
                   "): ids from ",
                   job.model.vocab_size,
                   " up have no embedding row");
}

void check_train_data_vocab(const Job& job) {
    const deck::FinetuneSection& ft = job.deck.finetune;
    if (job.deck.job.kind != deck::JobKind::lora)
        return;
    std::string problem;  // "<file>: <what>" from rank 0
    if (parallel::world_rank() == 0) {
        try {
            for (const std::string& path :
                 {ft.domain_data, ft.general_data, ft.eval_domain, ft.eval_general}) {
                if (path.empty())
                    continue;
                const std::string what = io::TokenDataset(path).out_of_vocab(job.model.vocab_size);
                if (!what.empty()) {
                    problem = cat(path, ": ", what, " (", vocab_source(job.deck), ")");
                    break;
                }
            }
        } catch (const Error& e) {
            problem = e.what();
        }
    }
    problem = parallel::broadcast_bytes(problem);
    if (!problem.empty())
        HYMOE_FAIL(Exit::bad_input, problem);
}

void check_sampling_defaults(const Job& job) {
    const deck::Deck& d = job.deck;
    if (!d.inference.stop.empty() && !d.tokenizer.present)
        HYMOE_FAIL(Exit::invalid,
                   d.locate("inference.sampling.stop"),
                   ": stop strings need a tokenizer (deck key tokenizer.path)");
    for (int64_t t : d.inference.stop_token_ids)
        if (t >= job.model.vocab_size)
            HYMOE_FAIL(Exit::invalid,
                       d.locate("inference.sampling.stop_token_ids"),
                       ": ",
                       t,
                       " is outside the model's vocabulary of ",
                       job.model.vocab_size,
                       " (",
                       vocab_source(d),
                       ")");
}

void preflight(const Job& job) {
    check_tokenizer_vocab(job);
    check_train_data_vocab(job);
}

}  // namespace hymoe::runtime
