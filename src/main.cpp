// hymoe: mpirun -np N hymoe DECK.yaml [--check] [--set key.path=value]... (also --ranks, --gather,
// --describe-deck [SECTION]: the deck reference from the schema table the parser uses, and the
// one-shot --model DIR --prompt TEXT of runtime/prompt.h)
// MPI → command line → deck, model config and layout (validated before anything is allocated)
// → communicators → the job (--check: print the plan of runtime/plan.h and stop). Errors seen by
// every rank (deck, config, layout) print once on rank 0 and every rank exits with the error's
// code; an error only one rank saw prints "[rank r] ..." and aborts the world (LAMMPS Error::all /
// Error::one).
#include <cstdio>
#include <exception>
#include <string>

#include "hymoe/core/build_info.h"
#include "hymoe/core/error.h"
#include "hymoe/core/log.h"
#include "hymoe/deck/describe.h"
#include "hymoe/parallel/comms.h"
#include "hymoe/parallel/mpi_env.h"
#include "hymoe/runtime/job.h"
#include "hymoe/runtime/plan.h"
#include "hymoe/runtime/preflight.h"
#include "hymoe/runtime/prompt.h"
#include "hymoe/runtime/results.h"
#include "hymoe/runtime/results_jsonl.h"
#include "hymoe/runtime/run.h"

namespace {

int run(int argc, char** argv) {
    using namespace hymoe;
    if (argc >= 2 && std::string(argv[1]) == "--describe-deck") {
        if (argc > 3)
            HYMOE_FAIL(
                Exit::invalid, "--describe-deck takes one section at most; ", runtime::usage());
        const std::string text = deck::describe_deck(argc == 3 ? argv[2] : "");
        if (parallel::world_rank() == 0)
            std::fputs(text.c_str(), stdout);
        return 0;
    }
    runtime::CommandLine cli = runtime::parse_command_line(argc, argv);
    if (cli.help || cli.version) {
        if (parallel::world_rank() == 0)
            std::printf("%s\n",
                        cli.help ? runtime::usage().c_str()
                                 : cat("hymoe ",
                                       build::git_sha,
                                       " (",
                                       build::backend,
                                       ", ",
                                       build::compiler,
                                       ")")
                                       .c_str());
        return 0;
    }
    if (cli.one_shot())
        return runtime::run_prompt(cli);
    if (cli.ranks) {
        const int n = runtime::deck_ranks(cli);
        if (parallel::world_rank() == 0)
            std::printf("%d\n", n);
        return 0;
    }
    if (!cli.gather.empty()) {
        if (parallel::world_rank() == 0) {
            runtime::gather_results(cli.gather.front(), {cli.gather.begin() + 1, cli.gather.end()});
            runtime::write_results_jsonl(cli.gather.front());
        }
        return 0;
    }
    runtime::Job job = runtime::load_job(cli, parallel::world_size());
    parallel::Grid grid = parallel::make_grid(job.layout);
    runtime::log_job_header(job);
    if (cli.check) {
        runtime::preflight(job);
        log::info(runtime::job_plan_report(runtime::plan_job(job)));
        log::info("check passed: the deck, the model config and the layout are valid");
        return 0;
    }
    return runtime::run_job(job, grid);
}

}  // namespace

int main(int argc, char** argv) {
    hymoe::parallel::MpiEnv mpi(&argc, &argv);
    const int rank = hymoe::parallel::world_rank();
    hymoe::log::init(rank);
    try {
        return run(argc, argv);
    } catch (const hymoe::Error& e) {
        const int code = static_cast<int>(e.code());
        if (e.scope() == hymoe::Scope::collective) {
            if (rank == 0)
                std::fprintf(stderr, "%s\n", e.what());
            return code;
        }
        std::fprintf(stderr, "[rank %d] %s (%s:%d)\n", rank, e.what(), e.file(), e.line());
        hymoe::parallel::abort_world(code);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "[rank %d] internal error: %s\n", rank, e.what());
        hymoe::parallel::abort_world(1);
    }
}
