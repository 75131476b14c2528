// HDF5 writer (atomic, serial or collective MPI-IO) and reader; see io/h5.h.
#include "hymoe/io/h5.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "hymoe/core/error.h"
#include "hymoe/core/kill_point.h"
#include "hymoe/io/durable.h"
#include "hymoe/parallel/mpi_handle.h"

namespace hymoe::io {

namespace {

// HDF5's own error stack printing is off: failures become one hymoe::Error with context.
struct QuietHdf5 {
    QuietHdf5() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }
};
const QuietHdf5 quiet_hdf5;

H5Id string_type(size_t len) {
    H5Id t(H5Tcopy(H5T_C_S1), H5Tclose, "string type");
    H5Tset_size(t.get(), len ? len : 1);
    H5Tset_cset(t.get(), H5T_CSET_UTF8);
    return t;
}

H5Id link_props() {
    H5Id p(H5Pcreate(H5P_LINK_CREATE), H5Pclose, "link properties");
    H5Pset_create_intermediate_group(p.get(), 1);
    return p;
}

std::vector<hsize_t> dims_of(const Shape& shape) {
    return {shape.begin(), shape.end()};
}

}  // namespace

hid_t h5_type(DType t) {
    switch (t) {
        case DType::f32:
            return H5T_NATIVE_FLOAT;
        case DType::i32:
            return H5T_NATIVE_INT32;
        case DType::i64:
            return H5T_NATIVE_INT64;
        case DType::u8:
            return H5T_NATIVE_UINT8;
        case DType::bf16:
        case DType::f16:
            return H5T_NATIVE_UINT16;  // raw bits; the dataset's attrs name the dtype
    }
    return H5T_NATIVE_UINT8;
}

H5Id::H5Id(hid_t id, Closer close, const std::string& what) : id_(id), close_(close) {
    // a full disk or quota is named: HDF5's own stack (off, above) would be the only other trace
    const bool full = errno == ENOSPC || errno == EDQUOT;
    if (id < 0)
        HYMOE_FAIL_ONE(
            Exit::internal, "HDF5: ", what, " failed", full ? ": no space left on device" : "");
}

H5Id::~H5Id() {
    if (id_ >= 0 && close_)
        close_(id_);
}

H5Id::H5Id(H5Id&& o) noexcept : id_(o.id_), close_(o.close_) {
    o.id_ = -1;
}

H5Id& H5Id::operator=(H5Id&& o) noexcept {
    if (this != &o) {
        if (id_ >= 0 && close_)
            close_(id_);
        id_ = o.id_;
        close_ = o.close_;
        o.id_ = -1;
    }
    return *this;
}

H5Writer::H5Writer(const std::string& path, const comm::Comm& comm)
    : path_(path), partial_(path + ".partial"), comm_(comm), parallel_(comm.size() > 1) {
    H5Id fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, "file access properties");
    if (parallel_)
        H5Pset_fapl_mpio(fapl.get(), comm::mpi_handle(comm), MPI_INFO_NULL);
    file_ = H5Id(H5Fcreate(partial_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()),
                 H5Fclose,
                 "creating " + partial_);
}

H5Writer::~H5Writer() = default;

H5Id H5Writer::create_dataset(const std::string& name, hid_t type, const Shape& shape) {
    std::vector<hsize_t> dims = dims_of(shape);
    H5Id space(shape.empty()
                   ? H5Screate(H5S_SCALAR)
                   : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
               H5Sclose,
               "dataspace for " + name);
    return H5Id(H5Dcreate2(file_.get(),
                           name.c_str(),
                           type,
                           space.get(),
                           link_props().get(),
                           H5P_DEFAULT,
                           H5P_DEFAULT),
                H5Dclose,
                "creating " + name + " in " + path_);
}

void H5Writer::text(const std::string& name, const std::string& value) {
    H5Id type = string_type(value.size());
    H5Id d = create_dataset(name, type.get(), {});
    if (comm_.rank() == 0 || !parallel_) {
        if (H5Dwrite(d.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, value.data()) < 0)
            HYMOE_FAIL_ONE(Exit::internal, "HDF5: writing ", name, " in ", path_);
    }
}

void H5Writer::strings(const std::string& name, const std::vector<std::string>& values) {
    size_t len = 1;
    for (const auto& v : values)
        len = std::max(len, v.size());
    std::string packed(len * values.size(), '\0');
    for (size_t i = 0; i < values.size(); ++i)
        std::copy(values[i].begin(), values[i].end(), packed.begin() + static_cast<long>(i * len));
    H5Id type = string_type(len);
    H5Id d = create_dataset(name, type.get(), {static_cast<int64_t>(values.size())});
    if ((comm_.rank() == 0 || !parallel_) && !values.empty()) {
        if (H5Dwrite(d.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, packed.data()) < 0)
            HYMOE_FAIL_ONE(Exit::internal, "HDF5: writing ", name, " in ", path_);
    }
}

void H5Writer::attr(const std::string& object, const std::string& name, const std::string& value) {
    H5Id type = string_type(value.size());
    H5Id space(H5Screate(H5S_SCALAR), H5Sclose, "scalar dataspace");
    H5Id a(H5Acreate_by_name(file_.get(),
                             object.c_str(),
                             name.c_str(),
                             type.get(),
                             space.get(),
                             H5P_DEFAULT,
                             H5P_DEFAULT,
                             H5P_DEFAULT),
           H5Aclose,
           "creating attribute " + object + "@" + name);
    if (H5Awrite(a.get(), type.get(), value.data()) < 0)
        HYMOE_FAIL_ONE(Exit::internal, "HDF5: writing attribute ", object, "@", name);
}

void H5Writer::array(const std::string& name, const Tensor& t) {
    H5Id d = create_dataset(name, h5_type(t.dtype), t.shape);
    if ((comm_.rank() == 0 || !parallel_) && t.numel() > 0) {
        if (H5Dwrite(d.get(), h5_type(t.dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data) < 0)
            HYMOE_FAIL_ONE(Exit::internal, "HDF5: writing ", name, " in ", path_);
    }
}

void H5Writer::rows(const std::string& name,
                    const Tensor& local,
                    int64_t row_offset,
                    int64_t total_rows) {
    Shape shape = local.shape;
    HYMOE_CHECK(!shape.empty() && row_offset + shape[0] <= total_rows,
                "rows ",
                row_offset,
                "+",
                shape_string(shape),
                " of ",
                total_rows);
    shape[0] = total_rows;
    H5Id d = create_dataset(name, h5_type(local.dtype), shape);
    H5Id file_space(H5Dget_space(d.get()), H5Sclose, "dataspace of " + name);
    std::vector<hsize_t> start(shape.size(), 0), count = dims_of(local.shape);
    start[0] = static_cast<hsize_t>(row_offset);
    H5Sselect_hyperslab(
        file_space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
    H5Id mem_space(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr),
                   H5Sclose,
                   "memory dataspace");
    if (local.numel() == 0) {
        H5Sselect_none(file_space.get());
        H5Sselect_none(mem_space.get());
    }
    H5Id xfer(H5Pcreate(H5P_DATASET_XFER), H5Pclose, "transfer properties");
    if (parallel_)
        H5Pset_dxpl_mpio(xfer.get(), H5FD_MPIO_COLLECTIVE);
    if (H5Dwrite(d.get(),
                 h5_type(local.dtype),
                 mem_space.get(),
                 file_space.get(),
                 xfer.get(),
                 local.data) < 0)
        HYMOE_FAIL_ONE(Exit::internal, "HDF5: writing rows of ", name, " in ", path_);
}

void H5Writer::slab(const std::string& name,
                    const Tensor& local,
                    const Shape& full,
                    int dim,
                    int64_t begin,
                    bool write,
                    const Shape& chunk) {
    std::vector<hsize_t> dims = dims_of(full);
    H5Id space(full.empty() ? H5Screate(H5S_SCALAR)
                            : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
               H5Sclose,
               "dataspace for " + name);
    H5Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, "dataset properties");
    if (!chunk.empty() && shape_numel(full) > 0) {
        std::vector<hsize_t> c = dims_of(chunk);
        H5Pset_chunk(dcpl.get(), static_cast<int>(c.size()), c.data());
    }
    const hid_t type = h5_type(local.dtype);
    H5Id d(H5Dcreate2(file_.get(),
                      name.c_str(),
                      type,
                      space.get(),
                      link_props().get(),
                      dcpl.get(),
                      H5P_DEFAULT),
           H5Dclose,
           "creating " + name + " in " + path_);
    std::vector<hsize_t> start(full.size(), 0), count = dims;
    if (dim >= 0) {
        start[dim] = static_cast<hsize_t>(begin);
        count[dim] = static_cast<hsize_t>(local.shape.at(dim));
    }
    H5Id file_space(H5Dget_space(d.get()), H5Sclose, "dataspace of " + name);
    if (!full.empty())
        H5Sselect_hyperslab(
            file_space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
    H5Id mem_space(full.empty()
                       ? H5Screate(H5S_SCALAR)
                       : H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr),
                   H5Sclose,
                   "memory dataspace");
    if (!write || shape_numel(full) == 0) {
        H5Sselect_none(file_space.get());
        H5Sselect_none(mem_space.get());
    }
    H5Id xfer(H5Pcreate(H5P_DATASET_XFER), H5Pclose, "transfer properties");
    if (parallel_)
        H5Pset_dxpl_mpio(xfer.get(), H5FD_MPIO_COLLECTIVE);
    if (H5Dwrite(d.get(), type, mem_space.get(), file_space.get(), xfer.get(), local.data) < 0)
        HYMOE_FAIL_ONE(Exit::internal, "HDF5: writing ", name, " in ", path_);
}

namespace {

// The rows of an extendible dataset: created [0, ...] with unlimited axis 0 and chunks of about
// 64 KiB, then extended by each append.
H5Id open_or_create_extendible(hid_t file, const std::string& name, hid_t type, Shape rest) {
    if (H5Lexists(file, name.c_str(), H5P_DEFAULT) > 0)
        return H5Id(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose, "opening " + name);
    std::vector<hsize_t> dims{0}, maxdims{H5S_UNLIMITED}, chunk{1};
    hsize_t row = H5Tget_size(type);
    for (int64_t d : rest) {
        dims.push_back(static_cast<hsize_t>(d)), maxdims.push_back(static_cast<hsize_t>(d));
        chunk.push_back(static_cast<hsize_t>(std::max<int64_t>(d, 1)));
        row *= static_cast<hsize_t>(std::max<int64_t>(d, 1));
    }
    chunk[0] = std::max<hsize_t>(1, (hsize_t{1} << 16) / row);
    H5Id space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), maxdims.data()),
               H5Sclose,
               "dataspace for " + name);
    H5Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, "dataset properties");
    H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data());
    return H5Id(
        H5Dcreate2(
            file, name.c_str(), type, space.get(), link_props().get(), dcpl.get(), H5P_DEFAULT),
        H5Dclose,
        "creating " + name);
}

// Extend d by n rows and write buf into them.
void append_rows(hid_t d, const std::string& name, hid_t type, int64_t n, const void* buf) {
    H5Id space(H5Dget_space(d), H5Sclose, "dataspace of " + name);
    const int rank = H5Sget_simple_extent_ndims(space.get());
    std::vector<hsize_t> dims(static_cast<size_t>(rank)), start(dims.size(), 0);
    H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
    if (n == 0)
        return;
    start[0] = dims[0];
    std::vector<hsize_t> count = dims;
    count[0] = static_cast<hsize_t>(n);
    dims[0] += count[0];
    if (H5Dset_extent(d, dims.data()) < 0)
        HYMOE_FAIL_ONE(Exit::internal, "HDF5: extending ", name);
    H5Id file_space(H5Dget_space(d), H5Sclose, "dataspace of " + name);
    H5Sselect_hyperslab(
        file_space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
    H5Id mem(H5Screate_simple(rank, count.data(), nullptr), H5Sclose, "memory dataspace");
    if (H5Dwrite(d, type, mem.get(), file_space.get(), H5P_DEFAULT, buf) < 0)
        HYMOE_FAIL_ONE(Exit::internal, "HDF5: appending to ", name);
}

}  // namespace

void H5Writer::append(const std::string& name, const Tensor& local) {
    HYMOE_CHECK(!parallel_ && !local.shape.empty(), "append ", name, ": serial, rows [n, ...]");
    Shape rest(local.shape.begin() + 1, local.shape.end());
    H5Id d = open_or_create_extendible(file_.get(), name, h5_type(local.dtype), rest);
    append_rows(d.get(), name, h5_type(local.dtype), local.shape[0], local.data);
}

void H5Writer::append_strings(const std::string& name, const std::vector<std::string>& values) {
    HYMOE_CHECK(!parallel_, "append_strings ", name, ": serial writers only");
    H5Id type(H5Tcopy(H5T_C_S1), H5Tclose, "string type");
    H5Tset_size(type.get(), H5T_VARIABLE);
    H5Tset_cset(type.get(), H5T_CSET_UTF8);
    H5Id d = open_or_create_extendible(file_.get(), name, type.get(), {});
    std::vector<const char*> ptrs;
    for (const std::string& v : values)
        ptrs.push_back(v.c_str());
    append_rows(d.get(), name, type.get(), static_cast<int64_t>(values.size()), ptrs.data());
}

void H5Writer::copy(const std::string& src_path, const std::string& object) {
    H5Id src(
        H5Fopen(src_path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose, "opening " + src_path);
    if (H5Ocopy(src.get(), object.c_str(), file_.get(), object.c_str(), H5P_DEFAULT, H5P_DEFAULT) <
        0)
        HYMOE_FAIL_ONE(Exit::internal, "HDF5: copying ", object, " of ", src_path, " into ", path_);
}

void H5Writer::commit() {
    kill_point(path_);  // tests: a kill -9 with the file written but neither flushed nor renamed
    if (H5Fflush(file_.get(), H5F_SCOPE_GLOBAL) < 0)
        HYMOE_FAIL_ONE(Exit::internal,
                       "HDF5: flushing ",
                       partial_,
                       errno == ENOSPC || errno == EDQUOT ? ": no space left on device" : "");
    file_ = H5Id();
    if (parallel_)
        comm::barrier(comm_);
    if (comm_.rank() == 0 || !parallel_) {
        sync_path(partial_);  // the data is on disk before the name says the file is complete
        std::error_code ec;
        std::filesystem::rename(partial_, path_, ec);
        if (ec)
            HYMOE_FAIL_ONE(
                Exit::internal, "renaming ", partial_, " to ", path_, ": ", ec.message());
        sync_path(std::filesystem::path(path_).parent_path().string());  // the rename itself
    }
    if (parallel_)
        comm::barrier(comm_);
}

H5Reader::H5Reader(const std::string& path)
    : path_(path),
      file_(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose, "opening " + path) {}

bool H5Reader::exists(const std::string& name) const {
    return H5Lexists(file_.get(), name.c_str(), H5P_DEFAULT) > 0;
}

std::string H5Reader::text(const std::string& name) const {
    H5Id d(H5Dopen2(file_.get(), name.c_str(), H5P_DEFAULT), H5Dclose, path_ + ": " + name);
    H5Id type(H5Dget_type(d.get()), H5Tclose, "type of " + name);
    std::string s(H5Tget_size(type.get()), '\0');
    if (H5Dread(d.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, s.data()) < 0)
        HYMOE_FAIL_ONE(Exit::internal, "HDF5: reading ", name, " in ", path_);
    return s.substr(0, s.find('\0'));
}

std::string H5Reader::attr(const std::string& object, const std::string& name) const {
    H5Id a(H5Aopen_by_name(file_.get(), object.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT),
           H5Aclose,
           path_ + ": attribute " + object + "@" + name);
    H5Id type(H5Aget_type(a.get()), H5Tclose, "attribute type");
    std::string s(H5Tget_size(type.get()), '\0');
    if (H5Aread(a.get(), type.get(), s.data()) < 0)
        HYMOE_FAIL_ONE(Exit::internal, "HDF5: reading attribute ", object, "@", name);
    return s.substr(0, s.find('\0'));
}

Shape H5Reader::shape(const std::string& name) const {
    H5Id d(H5Dopen2(file_.get(), name.c_str(), H5P_DEFAULT), H5Dclose, path_ + ": " + name);
    H5Id space(H5Dget_space(d.get()), H5Sclose, "dataspace of " + name);
    int rank = H5Sget_simple_extent_ndims(space.get());
    std::vector<hsize_t> dims(static_cast<size_t>(rank > 0 ? rank : 0));
    H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
    return Shape(dims.begin(), dims.end());
}

namespace {

template <typename T>
std::vector<T> read_all(
    hid_t file, const std::string& path, const std::string& name, hid_t type, int64_t n) {
    std::vector<T> v(static_cast<size_t>(n));
    H5Id d(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose, path + ": " + name);
    if (n > 0 && H5Dread(d.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0)
        HYMOE_FAIL_ONE(Exit::internal, "HDF5: reading ", name, " in ", path);
    return v;
}

}  // namespace

std::vector<std::string> H5Reader::strings(const std::string& name) const {
    H5Id d(H5Dopen2(file_.get(), name.c_str(), H5P_DEFAULT), H5Dclose, path_ + ": " + name);
    H5Id type(H5Dget_type(d.get()), H5Tclose, "type of " + name);
    const size_t len = H5Tget_size(type.get());
    const int64_t n = shape_numel(shape(name));
    if (H5Tis_variable_str(type.get()) > 0) {
        std::vector<char*> ptrs(static_cast<size_t>(n), nullptr);
        H5Id mem(H5Tcopy(H5T_C_S1), H5Tclose, "string type");
        H5Tset_size(mem.get(), H5T_VARIABLE);
        H5Tset_cset(mem.get(), H5T_CSET_UTF8);
        if (n > 0 && H5Dread(d.get(), mem.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, ptrs.data()) < 0)
            HYMOE_FAIL_ONE(Exit::internal, "HDF5: reading ", name, " in ", path_);
        std::vector<std::string> out;
        for (char* p : ptrs)
            out.emplace_back(p ? p : "");
        H5Id space(H5Dget_space(d.get()), H5Sclose, "dataspace of " + name);
        if (n > 0)
            H5Dvlen_reclaim(mem.get(), space.get(), H5P_DEFAULT, ptrs.data());
        return out;
    }
    std::string packed(len * static_cast<size_t>(n), '\0');
    if (n > 0 && H5Dread(d.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, packed.data()) < 0)
        HYMOE_FAIL_ONE(Exit::internal, "HDF5: reading ", name, " in ", path_);
    std::vector<std::string> out;
    for (int64_t i = 0; i < n; ++i) {
        std::string s = packed.substr(static_cast<size_t>(i) * len, len);
        out.push_back(s.substr(0, s.find('\0')));
    }
    return out;
}

void H5Reader::slab(const std::string& name, int dim, int64_t begin, Tensor& dest) const {
    H5Id d(H5Dopen2(file_.get(), name.c_str(), H5P_DEFAULT), H5Dclose, path_ + ": " + name);
    H5Id space(H5Dget_space(d.get()), H5Sclose, "space of " + name);
    const Shape full = shape(name);
    HYMOE_CHECK(full.size() == dest.shape.size(),
                name,
                " is ",
                shape_string(full),
                ", read into ",
                shape_string(dest.shape));
    std::vector<hsize_t> start(full.size(), 0), count = dims_of(dest.shape);
    if (dim >= 0)
        start[dim] = static_cast<hsize_t>(begin);
    if (!full.empty() &&
        H5Sselect_hyperslab(
            space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr) < 0)
        HYMOE_FAIL_ONE(Exit::internal, "HDF5: selecting a slab of ", name, " in ", path_);
    H5Id mem(full.empty() ? H5Screate(H5S_SCALAR)
                          : H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr),
             H5Sclose,
             "memory space");
    if (dest.numel() > 0 &&
        H5Dread(d.get(), h5_type(dest.dtype), mem.get(), space.get(), H5P_DEFAULT, dest.data) < 0)
        HYMOE_FAIL_ONE(Exit::internal, "HDF5: reading ", name, " in ", path_);
}

std::vector<float> H5Reader::floats(const std::string& name) const {
    return read_all<float>(file_.get(), path_, name, H5T_NATIVE_FLOAT, shape_numel(shape(name)));
}

std::vector<int64_t> H5Reader::ints(const std::string& name) const {
    return read_all<int64_t>(file_.get(), path_, name, H5T_NATIVE_INT64, shape_numel(shape(name)));
}

std::vector<int64_t> H5Reader::ints(const std::string& name, int64_t begin, int64_t count) const {
    std::vector<int64_t> v(static_cast<size_t>(count));
    H5Id d(H5Dopen2(file_.get(), name.c_str(), H5P_DEFAULT), H5Dclose, path_ + ": " + name);
    H5Id space(H5Dget_space(d.get()), H5Sclose, "space of " + name);
    const hsize_t start[1] = {static_cast<hsize_t>(begin)}, n[1] = {static_cast<hsize_t>(count)};
    H5Id mem(H5Screate_simple(1, n, nullptr), H5Sclose, "memory space");
    if (count > 0 &&
        (H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start, nullptr, n, nullptr) < 0 ||
         H5Dread(d.get(), H5T_NATIVE_INT64, mem.get(), space.get(), H5P_DEFAULT, v.data()) < 0))
        HYMOE_FAIL_ONE(
            Exit::internal, "HDF5: reading ", name, " [", begin, ", +", count, ") in ", path_);
    return v;
}

}  // namespace hymoe::io
