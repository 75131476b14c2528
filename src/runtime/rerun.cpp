// Reruns of a finished infer job: "already complete", or another deck's results refused; and
// the comparison of two resolved decks that tells (runtime/rerun.h).
#include "hymoe/runtime/rerun.h"

#include <cstdio>
#include <filesystem>
#include <set>

#include <yaml-cpp/yaml.h>

#include "hymoe/core/error.h"
#include "hymoe/core/log.h"
#include "hymoe/core/sha256.h"
#include "hymoe/io/h5.h"
#include "hymoe/parallel/mpi_env.h"

namespace hymoe::runtime {

namespace {

YAML::Node without_overwrite(const std::string& resolved_yaml) {
    YAML::Node root = YAML::Load(resolved_yaml);
    if (root["job"] && root["job"].IsMap())
        root["job"].remove("overwrite");
    return root;
}

std::string emitted(const YAML::Node& node) {
    YAML::Emitter out;
    out << node;
    return out.c_str();
}

// Maps key by key (a key on one side only goes to c.only_one), anything else by its YAML form.
void compare_nodes(const YAML::Node& a,
                   const YAML::Node& b,
                   const std::string& path,
                   DeckComparison& c) {
    if (!a.IsMap() || !b.IsMap()) {
        c.same = c.same && emitted(a) == emitted(b);
        return;
    }
    std::set<std::string> keys;
    for (const YAML::Node& side : {a, b})
        for (const auto& kv : side)
            keys.insert(kv.first.as<std::string>());
    for (const std::string& key : keys) {
        const std::string at = path.empty() ? key : path + "." + key;
        const YAML::Node x = a[key], y = b[key];  // const: a missing key is not inserted
        if (!x.IsDefined() || !y.IsDefined())
            c.only_one.push_back(at);
        else
            compare_nodes(x, y, at, c);
    }
}

}  // namespace

std::string version_keys_note(const DeckComparison& c) {
    std::string keys;
    for (const std::string& k : c.only_one)
        keys += (keys.empty() ? "" : ", ") + k;
    return " was written under a resolved deck that differs from this one only in keys one of "
           "the two hymoe versions lacks: " +
           keys;
}

std::string results_deck_sha(const std::string& resolved_yaml) {
    return sha256_hex(emitted(without_overwrite(resolved_yaml)));
}

DeckComparison compare_resolved_decks(const std::string& written, const std::string& now) {
    DeckComparison c;
    c.same = true;
    compare_nodes(without_overwrite(written), without_overwrite(now), "", c);
    return c;
}

bool infer_already_complete(const Job& job) {
    const std::string file = job.deck.job.output + "/results.h5";
    // rank 0: "" (no finished file), "same <its request count>", "other <count>" or
    // "unreadable <why>"
    std::string verdict;
    if (parallel::world_rank() == 0 && std::filesystem::exists(file)) {
        try {
            io::H5Reader r(file);
            DeckComparison cmp;
            if (r.exists("/meta/deck_resolved"))
                cmp = compare_resolved_decks(r.text("/meta/deck_resolved"), job.deck.resolved_yaml);
            const bool same = cmp.same;
            if (same && !cmp.only_one.empty())
                log::info(cat(file, version_keys_note(cmp)));
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
