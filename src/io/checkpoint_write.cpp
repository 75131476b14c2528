// Writing a checkpoint's tensors (io/checkpoint.h): every rank's entries are gathered into one
// plan (each tensor's file, dtype, global shape and pieces, each piece written by one rank), the
// files are written collectively with parallel HDF5, and the writers' piece hashes are gathered
// into the manifest's "tensors" object. Also the small helpers of checkpoint_detail.h.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "checkpoint_detail.h"
#include "hymoe/core/kill_point.h"
#include "hymoe/core/sha256.h"
#include "hymoe/io/checkpoint.h"
#include "hymoe/io/durable.h"
#include "hymoe/io/h5.h"

namespace hymoe::io {

namespace fs = std::filesystem;
using nlohmann::json;

std::vector<std::string> all_gather_strings(const std::string& s, const comm::Comm& c) {
    Buffer len(DType::i64, {1}), lens(DType::i64, {c.size()});
    len.ptr<int64_t>()[0] = static_cast<int64_t>(s.size());
    comm::all_gather(len.view(), lens.view(), c);
    int64_t longest = 1;
    for (int r = 0; r < c.size(); ++r)
        longest = std::max(longest, lens.ptr<int64_t>()[r]);
    Buffer mine(DType::u8, {longest}), all(DType::u8, {longest * c.size()});
    std::copy(s.begin(), s.end(), mine.ptr<char>());
    comm::all_gather(mine.view(), all.view(), c);
    std::vector<std::string> out;
    for (int r = 0; r < c.size(); ++r)
        out.emplace_back(all.ptr<char>() + r * longest,
                         static_cast<size_t>(lens.ptr<int64_t>()[r]));
    return out;
}

namespace detail {

std::string broadcast_string(const std::string& s, int root, const comm::Comm& c) {
    const int64_t n = comm::broadcast_value(static_cast<int64_t>(s.size()), root, c);
    Buffer bytes(DType::u8, {std::max<int64_t>(n, 1)});
    if (c.rank() == root)
        std::copy(s.begin(), s.end(), bytes.ptr<char>());
    comm::broadcast(bytes.view(), root, c);
    return std::string(bytes.ptr<char>(), static_cast<size_t>(n));
}

DType dtype_from_name(const std::string& s, const std::string& where) {
    for (DType t : {DType::f32, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8})
        if (s == to_string(t))
            return t;
    HYMOE_FAIL_ONE(Exit::checkpoint, where, ": unknown dtype '", s, "'");
}

}  // namespace detail

namespace {

struct Piece {
    int64_t rows = 0;
    int owner = -1;
    bool owner_writes = false;  // the owner set writer
    std::string sha256;
};

// One tensor of the plan: the same on every rank.
struct TensorPlan {
    std::string file;
    std::string dtype;
    Shape shape;  // global
    int split_dim = -1;
    std::map<int64_t, Piece> pieces;  // by begin along split_dim (0 for a whole tensor)
};

Shape global_shape(const CkptEntry& e) {
    Shape s = e.local.shape;
    if (e.split_dim >= 0)
        s.at(e.split_dim) = e.full;
    return s;
}

json describe_entries(const std::vector<CkptEntry>& entries) {
    json out = json::array();
    for (const CkptEntry& e : entries) {
        HYMOE_CHECK(e.local.device == Device::cpu, e.name, ": checkpoints take host tensors");
        HYMOE_CHECK(e.split_dim < static_cast<int>(e.local.shape.size()),
                    e.name,
                    ": split_dim ",
                    e.split_dim,
                    " of ",
                    shape_string(e.local.shape));
        out.push_back({{"name", e.name},
                       {"file", e.file.empty() ? "tensors.h5" : e.file},
                       {"dtype", to_string(e.local.dtype)},
                       {"shape", global_shape(e)},
                       {"split_dim", e.split_dim},
                       {"begin", e.split_dim < 0 ? 0 : e.begin},
                       {"rows", e.split_dim < 0 ? 0 : e.local.shape[e.split_dim]},
                       {"writer", e.writer}});
    }
    return out;
}

// Every rank's entries into one plan; a disagreement between ranks is a collective error (every
// rank builds the same plan from the same gathered text).
std::map<std::string, TensorPlan> make_plan(const std::vector<std::string>& per_rank) {
    std::map<std::string, TensorPlan> plan;
    for (size_t r = 0; r < per_rank.size(); ++r) {
        for (const json& d : json::parse(per_rank[r])) {
            const std::string name = d["name"];
            auto [it, fresh] = plan.try_emplace(name);
            TensorPlan& t = it->second;
            const Shape shape = d["shape"].get<Shape>();
            const int split = d["split_dim"];
            if (fresh) {
                t.file = d["file"], t.dtype = d["dtype"], t.shape = shape, t.split_dim = split;
            } else if (t.file != d["file"] || t.dtype != d["dtype"] || t.shape != shape ||
                       t.split_dim != split) {
                HYMOE_FAIL(Exit::internal,
                           "checkpoint: rank ",
                           r,
                           " holds ",
                           name,
                           " as ",
                           d["dtype"].get<std::string>(),
                           " ",
                           shape_string(shape),
                           " split along ",
                           split,
                           ", another rank as ",
                           t.dtype,
                           " ",
                           shape_string(t.shape),
                           " split along ",
                           t.split_dim);
            }
            const int64_t begin = d["begin"], rows = d["rows"];
            const bool writes = d["writer"];
            auto [p, first] = t.pieces.try_emplace(begin);
            if (first)
                p->second = {rows, static_cast<int>(r), writes, ""};
            else if (p->second.rows != rows)
                HYMOE_FAIL(Exit::internal,
                           "checkpoint: ranks hold overlapping slices of ",
                           name,
                           " at ",
                           begin);
            else if (writes && !p->second.owner_writes)
                p->second.owner = static_cast<int>(r), p->second.owner_writes = true;
        }
    }
    for (auto& [name, t] : plan) {
        if (t.split_dim < 0)
            continue;
        int64_t next = 0;  // the pieces must tile [0, full) along split_dim
        for (const auto& [begin, p] : t.pieces) {
            if (begin != next)
                HYMOE_FAIL(Exit::internal,
                           "checkpoint: the slices of ",
                           name,
                           " leave rows ",
                           next,
                           "..",
                           begin,
                           " along dim ",
                           t.split_dim,
                           " unheld");
            next = begin + p.rows;
        }
        if (next != t.shape[t.split_dim])
            HYMOE_FAIL(Exit::internal,
                       "checkpoint: the slices of ",
                       name,
                       " end at ",
                       next,
                       " of ",
                       t.shape[t.split_dim],
                       " along dim ",
                       t.split_dim);
    }
    return plan;
}

// The chunk shape of a split tensor whose pieces are equal (and under 1 GiB); else {}.
Shape chunk_of(const TensorPlan& t) {
    if (t.split_dim < 0 || t.pieces.empty())
        return {};
    const int64_t rows = t.pieces.begin()->second.rows;
    for (const auto& [begin, p] : t.pieces)
        if (p.rows != rows || rows == 0)
            return {};
    Shape chunk = t.shape;
    chunk[t.split_dim] = rows;
    const int64_t bytes =
        shape_numel(chunk) * static_cast<int64_t>(dtype_size(detail::dtype_from_name(t.dtype, "")));
    return bytes < (int64_t{1} << 30) ? chunk : Shape{};
}

std::string sha256_of(const Tensor& t) {
    Sha256 h;
    h.update(t.data, t.bytes());
    return h.hex_digest();
}

}  // namespace

std::string write_tensors(const comm::Comm& world,
                          const std::string& dir,
                          const std::vector<CkptEntry>& entries,
                          bool chunked) {
    std::map<std::string, TensorPlan> plan =
        make_plan(all_gather_strings(describe_entries(entries).dump(), world));
    std::map<std::string, const CkptEntry*> mine;  // name -> this rank's entry
    for (const CkptEntry& e : entries)
        if (!mine.emplace(e.name, &e).second)
            HYMOE_FAIL_ONE(Exit::internal, "checkpoint: this rank gives ", e.name, " twice");
    std::map<std::string, std::vector<std::string>> files;  // file -> its tensors, by name
    for (const auto& [name, t] : plan)
        files[t.file].push_back(name);

    // A file whose pieces all come from one rank is written by that rank alone (serial HDF5, no
    // collective metadata), the ranks' own files at the same time; the others collectively.
    std::map<std::string, int> solo;  // file -> its one writing rank, or -1: several
    for (const auto& [file, names] : files) {
        std::set<int> writers;
        for (const std::string& name : names)
            for (const auto& [begin, p] : plan.at(name).pieces)
                writers.insert(p.owner);
        solo[file] = writers.size() == 1 ? *writers.begin() : -1;
    }
    json hashes = json::object();  // name -> {begin: sha256} of the pieces this rank wrote
    const comm::Comm self = comm::self_comm();
    for (const bool collective : {true, false})
        for (const auto& [file, names] : files) {
            if (collective != (solo[file] < 0) || (!collective && solo[file] != world.rank()))
                continue;
            H5Writer w(dir + "/" + file, collective ? world : self);
            for (const std::string& name : names) {
                const TensorPlan& t = plan.at(name);
                auto it = mine.find(name);
                const CkptEntry* e = it == mine.end() ? nullptr : it->second;
                const int64_t begin = e && t.split_dim >= 0 ? e->begin : 0;
                const bool writes = e && t.pieces.at(begin).owner == world.rank();
                Tensor local = e ? e->local : Tensor{};
                local.dtype = detail::dtype_from_name(t.dtype, name);
                if (!e) {  // nothing to write, but the memory space needs a shape of the right rank
                    local.shape = t.shape;
                    if (t.split_dim >= 0)
                        local.shape[t.split_dim] = 0;
                }
                w.slab("/" + name,
                       local,
                       t.shape,
                       t.split_dim,
                       begin,
                       writes,
                       chunked ? chunk_of(t) : Shape{});
                w.attr("/" + name, "dtype", t.dtype);
                if (writes)
                    hashes[name][std::to_string(begin)] = sha256_of(local);
            }
            w.commit();
        }
    for (const std::string& text : all_gather_strings(hashes.dump(), world)) {
        const json rank_hashes = json::parse(text);
        for (const auto& [name, by_begin] : rank_hashes.items())
            for (const auto& [begin, sha] : by_begin.items())
                plan.at(name).pieces.at(std::stoll(begin)).sha256 = sha;
    }

    json out = json::object();
    for (const auto& [name, t] : plan) {
        json pieces = json::array();
        Sha256 all;  // the tensor's hash: of its pieces' hashes, in order
        for (const auto& [begin, p] : t.pieces) {
            pieces.push_back({{"begin", begin}, {"rows", p.rows}, {"sha256", p.sha256}});
            all.update(p.sha256);
        }
        out[name] = {{"file", t.file},
                     {"dtype", t.dtype},
                     {"shape", t.shape},
                     {"split_dim", t.split_dim},
                     {"sha256", all.hex_digest()},
                     {"pieces", pieces}};
    }
    return out.dump();
}

void write_manifest(const std::string& dir, const std::string& json_text) {
    const std::string path = dir + "/manifest.json", partial = path + ".partial";
    {
        std::ofstream f(partial, std::ios::binary | std::ios::trunc);
        f << json_text << "\n";
        if (!f.flush())
            HYMOE_FAIL_ONE(Exit::internal, "writing ", partial);
    }
    sync_path(partial);
    kill_point(path);  // tests: a kill -9 with the manifest written but not renamed
    std::error_code ec;
    fs::rename(partial, path, ec);
    if (ec)
        HYMOE_FAIL_ONE(Exit::internal, "renaming ", partial, ": ", ec.message());
    sync_path(dir);
}

}  // namespace hymoe::io
