// Measured against planned memory of a rank (runtime/memory.h).
#include "hymoe/runtime/memory.h"

#include <algorithm>
#include <cstdio>
#include <sys/resource.h>

#include "hymoe/runtime/plan.h"

namespace hymoe::runtime {

const char* const kMemoryColumnNames =
    "weights kv_pages allocated resident planned_weights planned_kv_pages planned_kda_state "
    "planned_activations planned_total kv_resident";

RankMemory rank_memory(const Job& job,
                       model::Model& m,
                       int64_t peak_kv_bytes,
                       int64_t resident_kv_bytes) {
    RankMemory r{};
    for (const model::TensorSpec& t : model::model_tensors(m))
        r[0] += static_cast<double>(t.dest->view().bytes());  // at its storage dtype
    r[1] = static_cast<double>(peak_kv_bytes);
    r[9] = static_cast<double>(resident_kv_bytes);
    r[2] = static_cast<double>(buffer_bytes().peak) + r[9];
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    r[3] = static_cast<double>(usage.ru_maxrss) * 1024.0;  // kB on Linux
    // a copy: plan_job returns a temporary, gone at the end of this statement
    const StageMemory p = plan_job(job).plan.stages[static_cast<size_t>(m.shard.stage)].mem;
    r[4] = p.weights, r[5] = p.kv_cache, r[6] = p.kda_state;
    r[7] = std::max(p.act_prefill, p.act_decode);
    r[8] = r[4] + r[5] + r[6] + r[7];
    return r;
}

std::string memory_line(const RankMemory& r) {
    char line[512];
    const double mb = 1e6;
    std::snprintf(
        line,
        sizeof line,
        "memory of rank 0: allocated %.2f MB at most (weights %.2f, KV pages %.2f in memory "
        "of %.2f), "
        "resident %.2f MB at most; planned %.2f MB (weights %.2f, KV pages %.2f, KDA "
        "states %.2f, activations %.2f; no runtime reserve): allocated/planned %.3f, "
        "resident/planned %.3f, weights held/planned %.3f",
        r[2] / mb,
        r[0] / mb,
        r[9] / mb,
        r[1] / mb,
        r[3] / mb,
        r[8] / mb,
        r[4] / mb,
        r[5] / mb,
        r[6] / mb,
        r[7] / mb,
        r[8] > 0 ? r[2] / r[8] : 0.0,
        r[8] > 0 ? r[3] / r[8] : 0.0,
        r[4] > 0 ? r[0] / r[4] : 0.0);
    return line;
}

}  // namespace hymoe::runtime
