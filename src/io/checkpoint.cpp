// Training checkpoints (io/checkpoint.h): root/step_N written under step_N.partial, its files and
// manifest flushed to disk, renamed, then root/latest replaced (written, flushed, renamed) last,
// so a crash at any point leaves the previous checkpoint complete and findable; old step folders
// pruned to the newest `keep` (root/best, when written, names one that is never pruned); loading at
// any layout through TensorStore.
#include "hymoe/io/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>

#include <nlohmann/json.hpp>

#include "checkpoint_detail.h"
#include "hymoe/core/log.h"
#include "hymoe/io/durable.h"

namespace hymoe::io {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kFormat = "hymoe-checkpoint";

// The step of a complete step folder name ("step_12" → 12), −1 for anything else.
int64_t step_of(const std::string& folder_name) {
    static const std::regex pattern("step_([0-9]{1,18})");
    std::smatch m;
    return std::regex_match(folder_name, m, pattern) ? std::stoll(m[1].str()) : -1;
}

bool complete(const fs::path& dir) {
    std::error_code ec;
    return fs::is_regular_file(dir / "manifest.json", ec);
}

// Rank 0: root/<pointer> ← name, atomically (pointer: latest or best).
void point(const std::string& root, const std::string& pointer, const std::string& name) {
    const std::string path = root + "/" + pointer, partial = path + ".partial";
    {
        std::ofstream f(partial, std::ios::trunc);
        f << name << "\n";
        if (!f.flush())
            HYMOE_FAIL_ONE(Exit::internal, "writing ", partial);
    }
    sync_path(partial);
    fs::rename(partial, path);
    sync_path(root);
}

// Rank 0: remove every step folder but the newest `keep` complete ones and the one root/best
// names, and any leftover step_N.partial of an interrupted write.
void prune(const std::string& root, int keep, const std::string& current) {
    std::string best;
    std::ifstream(root + "/best") >> best;
    std::vector<std::pair<int64_t, fs::path>> steps;
    for (const fs::directory_entry& d : fs::directory_iterator(root)) {
        const std::string name = d.path().filename().string();
        if (name.size() > 8 && name.ends_with(".partial") && name.starts_with("step_") &&
            d.is_directory())
            fs::remove_all(d.path());
        else if (step_of(name) >= 0 && d.is_directory())
            steps.emplace_back(step_of(name), d.path());
    }
    if (keep <= 0)
        return;
    std::sort(steps.rbegin(), steps.rend());
    for (size_t i = static_cast<size_t>(keep); i < steps.size(); ++i)
        if (steps[i].second.filename() != current && steps[i].second.filename() != best)
            fs::remove_all(steps[i].second);
}

}  // namespace

void save_checkpoint(const comm::Comm& world,
                     const std::string& root,
                     int64_t step,
                     const std::vector<CkptEntry>& entries,
                     const std::string& state_json,
                     int keep,
                     bool best) {
    const std::string name = "step_" + std::to_string(step);
    const std::string final_dir = root + "/" + name, tmp = final_dir + ".partial";
    detail::agree(world, Exit::internal, [&] {
        if (world.rank() != 0)
            return;
        std::error_code ec;
        fs::create_directories(root, ec);
        fs::remove_all(tmp, ec);
        if (!fs::create_directory(tmp, ec) || ec)
            HYMOE_FAIL_ONE(
                Exit::internal, "checkpoint: cannot create ", tmp, " (", ec.message(), ")");
    });
    const std::string tensors = write_tensors(world, tmp, entries, false);
    detail::agree(world, Exit::internal, [&] {
        if (world.rank() != 0)
            return;
        const json manifest = {{"format", kFormat},
                               {"version", 1},
                               {"step", step},
                               {"created", log::utc_timestamp()},
                               {"world", world.size()},
                               {"state_json", state_json},
                               {"tensors", json::parse(tensors)}};
        write_manifest(tmp, manifest.dump(1));
        publish_dir(tmp, final_dir);  // a rewrite of the same step replaces it atomically
        if (best)  // before latest: a crash between the two leaves best complete and findable
            point(root, "best", name);
        point(root, "latest", name);
        prune(root, keep, name);
    });
}

std::string latest_checkpoint(const std::string& root) {
    std::error_code ec;
    if (!fs::is_directory(root, ec))
        return "";
    std::string named;
    std::ifstream(root + "/latest") >> named;
    if (step_of(named) >= 0 && complete(fs::path(root) / named))
        return (fs::path(root) / named).string();
    int64_t best = -1;  // latest is missing or stale (a crash before it was updated)
    std::string found;
    for (const fs::directory_entry& d : fs::directory_iterator(root, ec)) {
        const int64_t s = step_of(d.path().filename().string());
        if (s > best && complete(d.path()))
            best = s, found = d.path().string();
    }
    return found;
}

void load_checkpoint(const comm::Comm& world,
                     const std::string& step_dir,
                     std::vector<CkptEntry>& entries,
                     std::string& state_json) {
    detail::agree(world, Exit::checkpoint, [&] {
        const std::string text = read_manifest(step_dir);
        json manifest;
        try {
            manifest = json::parse(text);
            if (manifest.at("format") != kFormat)
                HYMOE_FAIL_ONE(Exit::checkpoint,
                               step_dir,
                               "/manifest.json is a '",
                               manifest.at("format").get<std::string>(),
                               "' manifest, not a training checkpoint's");
            state_json = manifest.at("state_json");
        } catch (const json::exception& e) {
            HYMOE_FAIL_ONE(Exit::checkpoint,
                           step_dir,
                           "/manifest.json is not a valid checkpoint manifest (",
                           e.what(),
                           ")");
        }
        TensorStore store(step_dir, text);
        for (CkptEntry& e : entries)
            store.read(e.name, e.split_dim, e.begin, e.full, e.local);
    });
}

}  // namespace hymoe::io
