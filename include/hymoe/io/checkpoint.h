// Checkpoints: named tensors, each held by the ranks as slices along one dim, written into HDF5
// files of a folder with a manifest (manifest.json) that lists every tensor's file, dtype, global
// shape and the sha256 of every saved piece; read back at any layout (each rank reads the saved
// pieces its slice overlaps, verifies them and copies its part out).
//
// Two users: training checkpoints (root/step_N/, written under step_N.partial, flushed, renamed,
// then root/latest updated last; the newest `keep` kept), and model checkpoints made by the
// convert job (runtime/convert.h: the pieces are the slices of a target layout, one file per
// pipeline stage and per stage and ep rank for routed experts). README "Checkpoints" documents the
// layout. Every load failure (a missing tensor or file, a shape or dtype mismatch, a bad checksum,
// an unreadable or truncated file) is a hymoe::Error with Exit::checkpoint whose one sentence
// names the tensor and the file.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hymoe/parallel/comm.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::io {

// One tensor as this rank holds it: rows [begin, begin + local.shape[split_dim]) along split_dim
// of a global tensor whose split_dim is `full` long; split_dim < 0: the whole tensor, written by
// the lowest rank with writer = true (or, when none set it, the lowest rank that has it). Several
// ranks may hold the same slice (data-parallel replicas): the lowest writes it.
struct CkptEntry {
    std::string name;
    Tensor local;
    int split_dim = -1;
    int64_t begin = 0;
    int64_t full = 0;
    bool writer = true;
    std::string file;  // the HDF5 file of the folder that holds it; "" = tensors.h5
};

// Collective over world: writes root/step_<step> (HDF5 files and manifest.json with per-piece
// sha256 and state_json, rank 0's) under root/step_<step>.partial, flushes it to disk, renames it,
// then (best = true) points root/best at it, then root/latest; then removes all but the newest
// `keep` step folders (keep ≤ 0: keeps all), never the one root/best names.
void save_checkpoint(const comm::Comm& world,
                     const std::string& root,
                     int64_t step,
                     const std::vector<CkptEntry>& entries,
                     const std::string& state_json,
                     int keep,
                     bool best = false);

// The newest complete step folder under root ("" if none): the one `latest` names when it is
// complete, else the highest step_N holding a manifest.
std::string latest_checkpoint(const std::string& root);

// Collective over world: fills each entry's local tensor (its shape, dtype, split_dim, begin and
// full say which slice; f32 entries may read bf16/f16 tensors) from step_dir, verifying the
// checksum of every saved piece it reads; state_json ← the manifest's. The saved split need not
// match. Failures: Exit::checkpoint, collective (rank 0 prints the first failing rank's sentence).
void load_checkpoint(const comm::Comm& world,
                     const std::string& step_dir,
                     std::vector<CkptEntry>& entries,
                     std::string& state_json);

// ---- the parts both checkpoint kinds share ---------------------------------------------------

// Collective: the entries into HDF5 files under dir (each written as NAME.partial and renamed;
// with MPI-IO by all ranks, or by its one writing rank alone when only one writes into it);
// returns (on every rank) the manifest's "tensors" object as JSON text:
// {name: {"file", "dtype", "shape", "split_dim", "sha256", "pieces": [{"begin", "rows",
// "sha256"}]}}
// ("sha256": of the pieces' hashes in order). chunked: each dataset's HDF5 chunks are its pieces
// when they are equal, so a reader at the saved layout reads whole chunks.
std::string write_tensors(const comm::Comm& world,
                          const std::string& dir,
                          const std::vector<CkptEntry>& entries,
                          bool chunked);

// Every rank's string, in rank order, on every rank (manifests gather per-rank JSON this way).
std::vector<std::string> all_gather_strings(const std::string& s, const comm::Comm& c);

// Rank 0 only: dir/manifest.json ← text, atomically (written, fsynced, renamed).
void write_manifest(const std::string& dir, const std::string& json_text);
// dir/manifest.json's text; missing or unreadable: Exit::checkpoint naming it (this rank only).
std::string read_manifest(const std::string& dir);

// The tensors of a checkpoint folder, as its manifest lists them; files are opened on first use.
// Reads raise one-rank Exit::checkpoint errors naming the tensor and the file.
class TensorStore {
public:
    TensorStore(const std::string& dir, const std::string& manifest_json);
    ~TensorStore();
    TensorStore(const TensorStore&) = delete;
    TensorStore& operator=(const TensorStore&) = delete;
    const std::string& dir() const { return dir_; }
    bool has(const std::string& name) const;
    Shape shape(const std::string& name) const;  // the global shape
    DType dtype(const std::string& name) const;  // as stored
    // dest ← [begin, begin + dest.shape[dim]) along dim of a tensor whose dim is `full` long
    // (dim < 0: the whole tensor), read from the saved pieces it overlaps, each verified against
    // its sha256. dest: the stored dtype, or f32 from bf16/f16; the global shape (dest's with dim
    // `full` long) must equal the stored one.
    void read(const std::string& name, int dim, int64_t begin, int64_t full, Tensor& dest) const;

private:
    struct Impl;
    std::string dir_;
    std::unique_ptr<Impl> impl_;
};

}  // namespace hymoe::io
