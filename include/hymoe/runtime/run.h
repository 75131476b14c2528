// Running a validated job: the log header every kind prints, the output folder (created only
// after validation), and the dispatch on job.kind.
#pragma once

#include "hymoe/parallel/comms.h"
#include "hymoe/runtime/job.h"

namespace hymoe::runtime {

// Rank 0 logs the resolved deck, the grid table and the model summary.
void log_job_header(const Job& job);
// Collective. Returns the process exit code.
int run_job(const Job& job, const parallel::Grid& grid);

}  // namespace hymoe::runtime
