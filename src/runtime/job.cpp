// Command line, deck and model config loading, and the layout-versus-model rules (runtime/job.h).
#include "hymoe/runtime/job.h"

#include <cstdio>
#include <cstring>
#include <optional>
#include <utility>

#include "hymoe/core/error.h"
#include "hymoe/parallel/mpi_env.h"
#include "hymoe/runtime/preflight.h"

namespace hymoe::runtime {

std::string usage() {
    return "usage: mpirun -np N hymoe DECK.yaml [--check] [--set key.path=value]... "
           "| hymoe DECK.yaml --ranks [--set ...] | hymoe --gather OUT_DIR SHARD_DIR... "
           "| hymoe --model DIR|PRESET --prompt TEXT [--tokenizer PATH] [--max-tokens N] "
           "[--temperature T] [--chat] "
           "| hymoe --describe-deck [SECTION] | hymoe --help | hymoe --version";
}

namespace {

// The value after option argv[i] (i advanced past it).
std::string option_value(int argc, char** argv, int& i) {
    if (i + 1 >= argc)
        HYMOE_FAIL(Exit::invalid, argv[i], " needs a value; ", usage());
    return argv[++i];
}

// A number of the one-shot's options, checked: "--max-tokens needs ... , not 'x'".
double option_number(const std::string& option, const std::string& v, double lo, double hi) {
    size_t used = 0;
    double x = 0;
    try {
        x = std::stod(v, &used);
    } catch (const std::exception&) {
        used = 0;
    }
    if (used != v.size() || !(x >= lo && x <= hi))
        HYMOE_FAIL(Exit::invalid,
                   option,
                   " needs a number from ",
                   static_cast<int64_t>(lo),
                   " to ",
                   static_cast<int64_t>(hi),
                   ", not '",
                   v,
                   "'");
    return x;
}

}  // namespace

CommandLine parse_command_line(int argc, char** argv) {
    CommandLine cli;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--model") {
            cli.model = option_value(argc, argv, i);
        } else if (a == "--prompt") {
            cli.prompt = option_value(argc, argv, i);
        } else if (a == "--tokenizer") {
            cli.tokenizer = option_value(argc, argv, i);
        } else if (a == "--max-tokens") {
            const double n = option_number(a, option_value(argc, argv, i), 0, 1 << 24);
            if (n != static_cast<int>(n))
                HYMOE_FAIL(Exit::invalid, a, " needs an integer, not '", argv[i], "'");
            cli.max_tokens = static_cast<int>(n);
        } else if (a == "--temperature") {
            cli.temperature = option_number(a, option_value(argc, argv, i), 0, 100);
        } else if (a == "--chat") {
            cli.chat = true;
        } else if (a == "--check") {
            cli.check = true;
        } else if (a == "--help" || a == "-h") {
            cli.help = true;
        } else if (a == "--version") {
            cli.version = true;
        } else if (a == "--ranks") {
            cli.ranks = true;
        } else if (a == "--gather") {
            cli.gather.assign(argv + i + 1, argv + argc);
            if (cli.gather.size() < 2)
                HYMOE_FAIL(Exit::invalid,
                           "--gather needs an output folder and at least one shard folder; ",
                           usage());
            for (const std::string& dir : cli.gather)
                if (dir.starts_with("-"))
                    HYMOE_FAIL(
                        Exit::invalid, "--gather takes folders only, not '", dir, "'; ", usage());
            break;
        } else if (a == "--set" || a.rfind("--set=", 0) == 0) {
            if (a == "--set" && i + 1 >= argc)
                HYMOE_FAIL(Exit::invalid, "--set needs key.path=value; ", usage());
            cli.sets.push_back(a == "--set" ? argv[++i] : a.substr(6));
        } else if (a.rfind("-", 0) == 0) {
            HYMOE_FAIL(Exit::invalid, "unknown option '", a, "'; ", usage());
        } else if (cli.deck_path.empty()) {
            cli.deck_path = a;
        } else {
            HYMOE_FAIL(Exit::invalid,
                       "more than one deck given ('",
                       cli.deck_path,
                       "' and '",
                       a,
                       "'); ",
                       usage());
        }
    }
    if (cli.one_shot()) {
        if (cli.model.empty() || cli.prompt.empty())
            HYMOE_FAIL(Exit::invalid, "--model and --prompt go together; ", usage());
        if (!cli.deck_path.empty() || cli.check || cli.ranks || !cli.gather.empty())
            HYMOE_FAIL(Exit::invalid,
                       "--model/--prompt builds its own deck: no deck, --check, --ranks or "
                       "--gather with it; ",
                       usage());
        return cli;
    }
    if (cli.tokenizer.size() || cli.max_tokens >= 0 || cli.temperature != 0 || cli.chat)
        HYMOE_FAIL(Exit::invalid,
                   "--tokenizer, --max-tokens, --temperature and --chat go with --model and "
                   "--prompt; ",
                   usage());
    if (cli.deck_path.empty() && !cli.help && !cli.version && cli.gather.empty())
        HYMOE_FAIL(Exit::invalid, "no deck given; ", usage());
    return cli;
}

namespace {

// Rank 0 reads a file and every rank gets its bytes; a read failure on rank 0 becomes the same
// collective error on every rank. The first byte of the broadcast says which it is.
std::string read_on_rank0(const std::string& path) {
    std::string payload;
    if (parallel::world_rank() == 0) {
        try {
            payload = "+" + deck::read_deck_file(path);
        } catch (const Error& e) {
            payload = std::string("-") + e.what();
        }
    }
    payload = parallel::broadcast_bytes(payload);
    if (payload[0] == '-')
        HYMOE_FAIL(Exit::invalid, payload.substr(1));
    return payload.substr(1);
}

model::ModelConfig load_model(const deck::Deck& deck) {
    if (!deck.model.preset.empty()) {
        try {
            return model::preset_config(deck.model.preset);
        } catch (const Error& e) {
            HYMOE_FAIL(Exit::invalid, deck.where("model.preset"), ": ", e.what());
        }
    }
    return model::parse_model_config(read_on_rank0(deck.model.config), deck.model.config);
}

// "3 does not divide <what> = 8 (why)"
std::string not_divisible(int size, const char* what, int64_t n, const char* why) {
    return cat(size, " does not divide ", what, " = ", n, " (", why, ")");
}

// Every rank parses the same bytes, but each checks the deck's paths on its own file system view
// (node-local disks, NFS lag): ranks agree on the outcome, so a failure on some ranks becomes the
// same collective error everywhere instead of leaving the others waiting in the next collective.
deck::Deck parse_deck_agreed(const CommandLine& cli) {
    const std::string text = read_on_rank0(cli.deck_path);
    deck::Deck deck;
    std::string failure;  // "<exit code> <message>" on a rank that failed
    try {
        deck = deck::parse_deck(text, cli.deck_path, cli.sets);
    } catch (const Error& e) {
        failure = cat(static_cast<int>(e.code()), " ", e.what());
    }
    const int first = parallel::first_failed_rank(!failure.empty());
    if (first == parallel::world_size())
        return deck;
    failure = parallel::broadcast_bytes(failure, first);
    const size_t space = failure.find(' ');
    HYMOE_FAIL(static_cast<Exit>(std::stoi(failure.substr(0, space))), failure.substr(space + 1));
}

// The layout rules against the world (0: the world the deck's layout needs) and the model.
Job validated(deck::Deck deck, int world_size) {
    Job job;
    job.deck = std::move(deck);
    const deck::ParallelSection& p = job.deck.parallel;
    job.layout = parallel::Layout{p.tp, p.dp, p.pp, p.ep, p.etp};
    parallel::check_layout(job.layout, world_size > 0 ? world_size : job.layout.world(), job.deck);
    job.model = load_model(job.deck);
    check_model_layout(job.model, job.layout, job.deck);
    check_sampling_defaults(job);
    return job;
}

}  // namespace

int deck_ranks(const CommandLine& cli) {
    const Job job = validated(parse_deck_agreed(cli), 0);
    preflight(job);
    return job.layout.world();
}

Job load_job(const CommandLine& cli, int world_size) {
    return validated(parse_deck_agreed(cli), world_size);
}

std::optional<LayoutProblem> model_layout_problem(const model::ModelConfig& m,
                                                  const parallel::Layout& l) {
    using model::Ffn;
    using model::Mixer;
    const int n_layer = static_cast<int>(m.layers.size());
    if (l.pp > n_layer)
        return LayoutProblem{"parallel.pp",
                             "pp exceeds the layers",
                             cat(l.pp,
                                 " pipeline stages for a model of ",
                                 n_layer,
                                 " layers (every stage needs at least one layer)")};
    if (!m.stage_boundaries.empty() && l.pp != static_cast<int>(m.stage_boundaries.size()) + 1)
        return LayoutProblem{"parallel.pp",
                             "pp differs from the '|' stages",
                             cat(l.pp,
                                 " stages, but the model's layer_pattern marks ",
                                 m.stage_boundaries.size() + 1,
                                 " stages with '|'")};
    const bool any_attention = count_layers(m, Mixer::mla) + count_layers(m, Mixer::dsa) > 0;
    if (any_attention && m.mla.n_head % l.tp != 0)
        return LayoutProblem{
            "parallel.tp",
            "tp does not divide the attention heads",
            not_divisible(
                l.tp, "the attention heads", m.mla.n_head, "tp splits the MLA/DSA heads")};
    if (count_layers(m, Mixer::kda) > 0 && m.kda.n_head % l.tp != 0)
        return LayoutProblem{
            "parallel.tp",
            "tp does not divide the KDA heads",
            not_divisible(l.tp, "the KDA heads", m.kda.n_head, "tp splits the KDA heads")};
    if (count_layers(m, Mixer::dsa) > 0 && m.indexer.n_head % l.tp != 0)
        return LayoutProblem{"parallel.tp",
                             "tp does not divide the indexer heads",
                             not_divisible(l.tp,
                                           "the indexer heads",
                                           m.indexer.n_head,
                                           "tp splits the lightning-indexer heads")};
    if (m.vocab_size % l.tp != 0)
        return LayoutProblem{"parallel.tp",
                             "tp does not divide the vocabulary",
                             not_divisible(l.tp,
                                           "the vocabulary",
                                           m.vocab_size,
                                           "the embedding and LM head are split over tp")};
    if (count_layers(m, Ffn::dense) > 0 && m.intermediate_size % l.tp != 0)
        return LayoutProblem{
            "parallel.tp",
            "tp does not divide the dense FFN width",
            not_divisible(
                l.tp, "the dense FFN width", m.intermediate_size, "tp splits the dense SwiGLU")};
    const bool any_moe = count_layers(m, Ffn::moe) + count_layers(m, Ffn::latent_moe) > 0;
    if (!any_moe)
        return std::nullopt;
    if (m.moe.n_routed_experts % l.ep != 0)
        return LayoutProblem{"parallel.ep",
                             "ep does not divide the routed experts",
                             not_divisible(l.ep,
                                           "the routed experts",
                                           m.moe.n_routed_experts,
                                           "every ep rank hosts the same number of experts")};
    if (l.tp % l.etp != 0)
        return LayoutProblem{"parallel.etp",
                             "etp does not divide tp",
                             cat("etp = ",
                                 l.etp,
                                 " does not divide tp = ",
                                 l.tp,
                                 " (the parts of an expert must sit in one tp group, which holds "
                                 "the same tokens)")};
    if (m.moe.moe_intermediate % l.etp != 0)
        return LayoutProblem{
            "parallel.etp",
            "etp does not divide the expert width",
            not_divisible(
                l.etp, "the expert width", m.moe.moe_intermediate, "etp splits each expert")};
    if (m.moe.shared_intermediate % l.tp != 0)
        return LayoutProblem{"parallel.tp",
                             "tp does not divide the shared-expert width",
                             not_divisible(l.tp,
                                           "the shared-expert width",
                                           m.moe.shared_intermediate,
                                           "shared experts are split over tp")};
    return std::nullopt;
}

void check_model_layout(const model::ModelConfig& m,
                        const parallel::Layout& l,
                        const deck::Deck& deck) {
    if (std::optional<LayoutProblem> p = model_layout_problem(m, l))
        HYMOE_FAIL(Exit::invalid, deck.locate(p->key), ": ", p->what);
}

}  // namespace hymoe::runtime
