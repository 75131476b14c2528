// /meta for every HDF5 output (see io/meta.h).
#include "hymoe/io/meta.h"

#include <cctype>
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
    for (const auto& [name, value] : slurm_env())
        file.text("/meta/slurm/" + name, value);
}

std::vector<std::pair<std::string, std::string>> slurm_env() {
    // The variables every task of a job (or of one array task) sees with the same value, so
    // each rank of a collective writer passes the same; SLURM_RESTART_COUNT appears from the
    // first requeue on.
    static const char* const vars[] = {"SLURM_JOB_ID",
                                       "SLURM_ARRAY_JOB_ID",
                                       "SLURM_ARRAY_TASK_ID",
                                       "SLURM_JOB_NODELIST",
                                       "SLURM_NTASKS",
                                       "SLURM_RESTART_COUNT"};
    std::vector<std::pair<std::string, std::string>> env;
    for (const char* var : vars) {
        const char* value = std::getenv(var);
        if (value == nullptr)
            continue;
        std::string name(var + 6);  // without "SLURM_", lower case: job_id, ntasks, ...
        for (char& c : name)
            c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        env.emplace_back(name, value);
    }
    return env;
}

}  // namespace hymoe::io
