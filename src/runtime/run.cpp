// Job dispatch by kind, after job.device is settled (runtime/device_choice.h) (infer: the
// inference engine, on the CPU or the GPU; lora: runtime/trainer.h; convert:
// runtime/model_checkpoint.h; tokenize: runtime/tokenize.h; plan: the memory and communication
// plan of runtime/plan.h in the log and in plan.h5, with /meta and every rank's grid
// coordinates), and the log header.
#include "hymoe/runtime/run.h"

#include <filesystem>

#include "hymoe/core/error.h"
#include "hymoe/core/log.h"
#include "hymoe/io/meta.h"
#include "hymoe/parallel/mpi_env.h"
#include "hymoe/runtime/device_choice.h"
#include "hymoe/runtime/engine.h"
#include "hymoe/runtime/lora_adapters.h"
#include "hymoe/runtime/model_checkpoint.h"
#include "hymoe/runtime/output_lock.h"
#include "hymoe/runtime/plan.h"
#include "hymoe/runtime/rerun.h"
#include "hymoe/runtime/tokenize.h"
#include "hymoe/runtime/trainer.h"

namespace hymoe::runtime {

namespace fs = std::filesystem;

void log_job_header(const Job& job) {
    log::info(cat("hymoe: job '",
                  job.deck.job.name,
                  "' (",
                  deck::to_string(job.deck.job.kind),
                  ") from ",
                  job.deck.path,
                  " on ",
                  job.layout.world(),
                  job.layout.world() == 1 ? " rank" : " ranks"));
    log::info("resolved deck:\n" + job.deck.resolved_yaml);
    log::info(parallel::grid_table(job.layout));
    log::info("model: " + model::describe(job.model));
}

namespace {

// Rank 0 creates the folder; every rank learns whether that worked.
void make_output_folder(const std::string& dir) {
    std::string problem;
    if (parallel::world_rank() == 0) {
        std::error_code ec;
        fs::create_directories(dir, ec);
        if (ec)
            problem = ec.message();
    }
    if (!parallel::all_ranks(problem.empty()))
        HYMOE_FAIL(Exit::invalid,
                   "job.output: cannot create '",
                   dir,
                   "'",
                   problem.empty() ? "" : " (" + problem + ")");
}

void write_plan(const Job& job, const parallel::Grid& grid, const io::RunMeta& meta) {
    const JobPlan jp = plan_job(job);  // every rank computes the same plan
    log::info(job_plan_report(jp));
    io::H5Writer file(job.deck.job.output + "/plan.h5", grid.comms.world);
    io::write_meta(file, meta);
    write_job_plan(file, jp);
    Buffer coords(DType::i32, {1, 6});  // this rank's row of /grid/coords [world, 6]
    const parallel::Coords& c = grid.me;
    int32_t* row = coords.ptr<int32_t>();
    row[0] = c.tp, row[1] = c.dp, row[2] = c.pp, row[3] = c.ep, row[4] = c.etp, row[5] = c.edp;
    file.rows("/grid/coords", coords.view(), grid.rank, job.layout.world());
    file.attr("/grid/coords", "columns", "tp dp pp ep etp edp");
    file.commit();
    log::info("wrote " + job.deck.job.output + "/plan.h5");
}

// Expert rebalancing moves the routed experts' weights alone: refused, before anything is written,
// where an adapter of inference.adapters adapts them.
void check_rebalance(const Job& job) {
    const deck::Deck& d = job.deck;
    if (d.parallel.rebalance_every > 0 && job.layout.ep > 1 && adapters_adapt_routed_experts(job))
        HYMOE_FAIL(
            Exit::invalid,
            d.locate("parallel.rebalance_every"),
            ": ",
            d.parallel.rebalance_every,
            ", but an adapter of inference.adapters adapts the routed experts, whose factors "
            "would not move with them (0 keeps the experts in place)");
}

}  // namespace

int run_job(const Job& job, const parallel::Grid& grid) {
    const deck::JobKind kind = job.deck.job.kind;
    if (kind == deck::JobKind::convert)
        check_convert_output(job);
    // the kinds that run the model: job.device (a deck error when it cannot be had), before
    // anything is written or a finished output is looked at
    const bool on_gpu =
        (kind == deck::JobKind::infer || kind == deck::JobKind::lora) && choose_device(job).cuda;
    if (kind == deck::JobKind::infer) {
        check_rebalance(job);
        if (infer_already_complete(job))
            return 0;  // nothing in job.output touched
    }
    make_output_folder(job.deck.job.output);
    const OutputLock lock(job.deck.job.output);  // one job per folder, until this job ends
    log::to_file(job.deck.job.output + "/log");
    if (kind == deck::JobKind::infer)
        return run_infer(job, grid, on_gpu);
    if (kind == deck::JobKind::lora)
        return run_lora(job, grid, on_gpu);
    if (kind == deck::JobKind::convert)
        return run_convert(job, grid);
    if (kind == deck::JobKind::tokenize)
        return run_tokenize(job, grid);
    io::RunMeta meta{&job.deck, job.layout, model::describe(job.model), log::utc_timestamp()};
    write_plan(job, grid, meta);
    return 0;
}

}  // namespace hymoe::runtime
