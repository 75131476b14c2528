// Reruns of a finished infer job: "already complete", or another deck's results refused
// (runtime/rerun.h).
#include "hymoe/runtime/rerun.h"

#include <cstdio>
#include <filesystem>

#include <yaml-cpp/yaml.h>

#include "hymoe/core/error.h"
#include "hymoe/core/sha256.h"
#include "hymoe/io/h5.h"
#include "hymoe/parallel/mpi_env.h"

namespace hymoe::runtime {

std::string results_deck_sha(const std::string& resolved_yaml) {
    YAML::Node root = YAML::Load(resolved_yaml);
    if (root["job"] && root["job"].IsMap())
        root["job"].remove("overwrite");
    YAML::Emitter out;
    out << root;
    return sha256_hex(out.c_str());
}

bool infer_already_complete(const Job& job) {
    const std::string file = job.deck.job.output + "/results.h5";
    // rank 0: "" (no finished file), "same <its request count>", "other <count>" or
    // "unreadable <why>"
    std::string verdict;
    if (parallel::world_rank() == 0 && std::filesystem::exists(file)) {
        try {
            io::H5Reader r(file);
            const bool same = r.exists("/meta/deck_resolved") &&
                              results_deck_sha(r.text("/meta/deck_resolved")) ==
                                  results_deck_sha(job.deck.resolved_yaml);
            // the same deck is finished only with every output it writes: a run killed while
            // writing profile.h5 has its results but reruns (and recomputes the same results)
            const bool profiled = job.deck.profile.layers || job.deck.profile.experts;
            const bool whole =
                !profiled || std::filesystem::exists(job.deck.job.output + "/profile.h5");
            if (same && !whole)
                verdict = "";
            else
                verdict = cat(same ? "same " : "other ", r.shape("/requests/id").at(0));
        } catch (const std::exception& e) {
            verdict = cat("unreadable ", e.what());
        }
    }
    verdict = parallel::broadcast_bytes(verdict);
    if (verdict.empty() || job.deck.job.overwrite)
        return false;
    const std::string n = verdict.substr(verdict.find(' ') + 1);
    if (verdict.starts_with("unreadable"))
        HYMOE_FAIL(Exit::bad_input,
                   file,
                   ": not a finished results file (",
                   n,
                   "); set job.overwrite: true to rerun and replace it");
    if (verdict.starts_with("other"))
        HYMOE_FAIL(Exit::invalid,
                   job.deck.locate("job.output"),
                   ": ",
                   file,
                   " holds the ",
                   n,
                   " results of another deck (its resolved deck differs from this one); set "
                   "job.overwrite: true to rerun and replace it, or choose another job.output");
    if (parallel::world_rank() == 0)
        std::printf(
            "hymoe: %s: already complete (%s requests of this deck); nothing to do "
            "(job.overwrite: true reruns it)\n",
            file.c_str(),
            n.c_str());
    return true;
}

}  // namespace hymoe::runtime
