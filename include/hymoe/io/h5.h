// HDF5 files for every output: RAII handles, an atomic writer (written to "<path>.partial" and
// renamed over <path> by commit(), so a crash never leaves a half-written file under the real
// name) that is serial on one rank or collective over a communicator with MPI-IO (parallel HDF5),
// and a small reader for tests and resumes. Groups in dataset names are created as needed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <hdf5.h>

#include "hymoe/parallel/comm.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::io {

// Owns one hid_t and closes it with the matching H5?close.
class H5Id {
public:
    using Closer = herr_t (*)(hid_t);
    H5Id() = default;
    H5Id(hid_t id, Closer close, const std::string& what);  // id < 0 is an error naming `what`
    ~H5Id();
    H5Id(H5Id&& o) noexcept;
    H5Id& operator=(H5Id&& o) noexcept;
    H5Id(const H5Id&) = delete;
    H5Id& operator=(const H5Id&) = delete;
    hid_t get() const { return id_; }

private:
    hid_t id_ = -1;
    Closer close_ = nullptr;
};

class H5Writer {
public:
    // Every rank of `comm` constructs, writes and commits together (collective metadata).
    H5Writer(const std::string& path, const comm::Comm& comm);
    ~H5Writer();  // without commit(): the .partial file stays, the real name is untouched
    H5Writer(const H5Writer&) = delete;
    H5Writer& operator=(const H5Writer&) = delete;

    // A fixed-length UTF-8 string dataset; every rank passes the same value.
    void text(const std::string& name, const std::string& value);
    // A 1-D array of fixed-length UTF-8 strings (padded to the longest); every rank passes the
    // same.
    void strings(const std::string& name, const std::vector<std::string>& values);
    // A string attribute on an existing group or dataset ("/" for the file).
    void attr(const std::string& object, const std::string& name, const std::string& value);
    // A whole array every rank holds the same copy of (rank 0 writes it).
    void array(const std::string& name, const Tensor& t);
    // Collective: dataset [total_rows, ...]; each rank writes its rows at row_offset.
    void rows(const std::string& name, const Tensor& local, int64_t row_offset, int64_t total_rows);
    // Collective: dataset `full` (created with chunks of shape `chunk` when given, else
    // contiguous); the ranks with write = true put local at [begin, begin + local.shape[dim])
    // along dim (dim < 0: local is the whole tensor). Every rank calls it for every dataset, with
    // local's dtype equal on all.
    void slab(const std::string& name,
              const Tensor& local,
              const Shape& full,
              int dim,
              int64_t begin,
              bool write,
              const Shape& chunk = {});
    // Streaming (serial writers only): append rows along axis 0 of an extendible, chunked
    // dataset, created by the first call with the rows' trailing shape. An empty append still
    // creates the dataset. local [n, ...]
    void append(const std::string& name, const Tensor& local);
    // The same for a 1-D dataset of variable-length UTF-8 strings.
    void append_strings(const std::string& name, const std::vector<std::string>& values);
    // Serial writers: copy group or dataset `object` (e.g. "/meta") of the file src_path here.
    void copy(const std::string& src_path, const std::string& object);
    // Close, then rank 0 renames the .partial file to the real path (after every rank closed).
    void commit();

private:
    H5Id create_dataset(const std::string& name, hid_t type, const Shape& shape);
    std::string path_, partial_;
    const comm::Comm& comm_;
    bool parallel_ = false;
    H5Id file_;
};

class H5Reader {
public:
    explicit H5Reader(const std::string& path);
    bool exists(const std::string& name) const;
    std::string text(const std::string& name) const;
    std::string attr(const std::string& object, const std::string& name) const;
    Shape shape(const std::string& name) const;
    std::vector<float> floats(const std::string& name) const;
    std::vector<int64_t> ints(const std::string& name) const;  // any integer dataset, widened
    // Elements [begin, begin + count) of a 1-D integer dataset (streaming readers).
    std::vector<int64_t> ints(const std::string& name, int64_t begin, int64_t count) const;
    // [begin, begin + dest.shape[dim]) along dim (dim < 0: the whole dataset) into dest, whose
    // dtype names the memory type (bf16 and f16 read the stored bits).
    void slab(const std::string& name, int dim, int64_t begin, Tensor& dest) const;
    // Fixed-length or variable-length string datasets.
    std::vector<std::string> strings(const std::string& name) const;

private:
    std::string path_;
    H5Id file_;
};

hid_t h5_type(DType t);

}  // namespace hymoe::io
