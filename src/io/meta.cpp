// /meta for every HDF5 output (see io/meta.h).
#include "hymoe/io/meta.h"

#include <cstdlib>

#include "hymoe/core/build_info.h"
#include "hymoe/core/sha256.h"
#include "hymoe/parallel/mpi_env.h"

namespace hymoe::io {

void write_meta(H5Writer& file, const RunMeta& meta) {
    const deck::Deck& deck = *meta.deck;
    file.text("/meta/deck", deck.text);
    file.text("/meta/deck_resolved", deck.resolved_yaml);
    file.text("/meta/deck_sha256", sha256_hex(deck.text));
    file.text("/meta/deck_path", deck.path);
    file.text("/meta/build/git_sha", build::git_sha);
    file.text("/meta/build/compiler", build::compiler);
    file.text("/meta/build/flags", build::flags);
    file.text("/meta/build/backend", build::backend);
    file.text("/meta/build/mpi", parallel::mpi_version());
    file.text("/meta/grid", parallel::grid_table(meta.layout));
    const parallel::Layout& l = meta.layout;
    Buffer dims(DType::i32, {6});
    int32_t* d = dims.ptr<int32_t>();
    d[0] = l.tp, d[1] = l.dp, d[2] = l.pp, d[3] = l.ep, d[4] = l.etp, d[5] = l.edp();
    file.array("/meta/grid_tp_dp_pp_ep_etp_edp", dims.view());
    file.text("/meta/model", meta.model_summary);
    file.text("/meta/started_utc", meta.started_utc);
    const char* slurm_job = std::getenv("SLURM_JOB_ID");
    file.text("/meta/slurm_job_id", slurm_job ? slurm_job : "");
}

}  // namespace hymoe::io
