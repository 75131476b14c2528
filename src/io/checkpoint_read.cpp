// Reading a checkpoint's tensors (io/checkpoint.h TensorStore): a slice of a tensor at any layout
// is put together from the saved pieces it overlaps; each piece is read whole with one hyperslab,
// its sha256 checked against the manifest, and the overlap copied into the destination's float
// dtype (kept as stored when they agree: a bf16 checkpoint into bf16 weights makes no fp32 copy).
#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "checkpoint_detail.h"
#include "hymoe/core/sha256.h"
#include "hymoe/io/checkpoint.h"
#include "hymoe/io/h5.h"

namespace hymoe::io {

using nlohmann::json;

namespace {

struct PieceMeta {
    int64_t begin = 0, rows = 0;
    std::string sha256;
};

struct TensorMeta {
    std::string file;
    DType dtype = DType::f32;
    Shape shape;
    int split_dim = -1;
    std::vector<PieceMeta> pieces;
};

float float_at(const char* p, DType t, int64_t i) {
    if (t == DType::f32)
        return reinterpret_cast<const float*>(p)[i];
    const uint16_t h = reinterpret_cast<const uint16_t*>(p)[i];
    return t == DType::bf16 ? bf16_to_float(h) : f16_to_float(h);
}

void set_float(char* p, DType t, int64_t i, float x) {
    if (t == DType::f32)
        reinterpret_cast<float*>(p)[i] = x;
    else
        reinterpret_cast<uint16_t*>(p)[i] = t == DType::bf16 ? float_to_bf16(x) : float_to_f16(x);
}

// n elements of src (dtype s) into dst (dtype d): the same type copied, float types converted
// through fp32 (16-bit → fp32 exact; fp32 → 16-bit rounded to nearest even).
void convert_run(const char* src, DType s, char* dst, DType d, int64_t n) {
    if (s == d) {
        std::copy_n(src, n * static_cast<int64_t>(dtype_size(s)), dst);
        return;
    }
    for (int64_t i = 0; i < n; ++i)
        set_float(dst, d, i, float_at(src, s, i));
}

// Copy the overlap of two boxes of one global index space: src covers [so, so + src.shape),
// dst covers [dso, dso + dst.shape).
void copy_overlap(const Tensor& src, const Shape& so, Tensor& dst, const Shape& dso) {
    const size_t nd = src.shape.size();
    if (nd == 0) {
        convert_run(static_cast<const char*>(src.data),
                    src.dtype,
                    static_cast<char*>(dst.data),
                    dst.dtype,
                    1);
        return;
    }
    Shape lo(nd), hi(nd), sstride(nd, 1), dstride(nd, 1);
    for (size_t k = 0; k < nd; ++k) {
        lo[k] = std::max(so[k], dso[k]);
        hi[k] = std::min(so[k] + src.shape[k], dso[k] + dst.shape[k]);
        if (hi[k] <= lo[k])
            return;
    }
    for (size_t k = nd - 1; k > 0; --k) {
        sstride[k - 1] = sstride[k] * src.shape[k];
        dstride[k - 1] = dstride[k] * dst.shape[k];
    }
    const int64_t ss = static_cast<int64_t>(dtype_size(src.dtype)),
                  ds = static_cast<int64_t>(dtype_size(dst.dtype));
    Shape idx = lo;  // odometer over every dim but the last
    while (true) {
        int64_t s_off = 0, d_off = 0;
        for (size_t k = 0; k < nd; ++k)
            s_off += (idx[k] - so[k]) * sstride[k], d_off += (idx[k] - dso[k]) * dstride[k];
        convert_run(static_cast<const char*>(src.data) + s_off * ss,
                    src.dtype,
                    static_cast<char*>(dst.data) + d_off * ds,
                    dst.dtype,
                    hi[nd - 1] - lo[nd - 1]);
        size_t k = nd - 1;
        while (k > 0) {
            --k;
            if (++idx[k] < hi[k])
                break;
            idx[k] = lo[k];
            if (k == 0)
                return;
        }
        if (nd == 1)
            return;
    }
}

}  // namespace

struct TensorStore::Impl {
    std::map<std::string, TensorMeta> tensors;
    mutable std::map<std::string, std::unique_ptr<H5Reader>> files;  // opened on first use
};

namespace {

// A manifest entry describes a tensor its pieces fit (a fuzz finding: split_dim 5 of a 2-D tensor
// was used as an index): dims ≥ 0, split_dim −1 or a dim, each piece's rows inside it.
void check_entry(const TensorMeta& m, const std::string& name, const std::string& where) {
    bool ok = m.split_dim >= -1 && m.split_dim < static_cast<int>(m.shape.size());
    for (int64_t d : m.shape)
        ok = ok && d >= 0;
    for (const PieceMeta& p : m.pieces)
        ok = ok && p.begin >= 0 && p.rows >= 0 &&
             (m.split_dim < 0 || p.rows <= m.shape[m.split_dim] - p.begin);
    if (!ok)
        HYMOE_FAIL_ONE(Exit::checkpoint,
                       where,
                       ": tensor ",
                       name,
                       ": its shape ",
                       shape_string(m.shape),
                       ", split_dim ",
                       m.split_dim,
                       " and pieces do not fit together");
}

}  // namespace

TensorStore::TensorStore(const std::string& dir, const std::string& manifest_json)
    : dir_(dir), impl_(std::make_unique<Impl>()) {
    const std::string where = dir + "/manifest.json";
    try {
        const json manifest = json::parse(manifest_json);
        for (const auto& [name, t] : manifest.at("tensors").items()) {
            TensorMeta m;
            m.file = t.at("file");
            m.dtype = detail::dtype_from_name(t.at("dtype"), where);
            m.shape = t.at("shape").get<Shape>();
            m.split_dim = t.at("split_dim");
            for (const json& p : t.at("pieces"))
                m.pieces.push_back({p.at("begin"), p.at("rows"), p.at("sha256")});
            check_entry(m, name, where);
            impl_->tensors.emplace(name, std::move(m));
        }
    } catch (const json::exception& e) {
        HYMOE_FAIL_ONE(
            Exit::checkpoint, where, " is not a valid checkpoint manifest (", e.what(), ")");
    }
}

TensorStore::~TensorStore() = default;

bool TensorStore::has(const std::string& name) const {
    return impl_->tensors.count(name) != 0;
}

Shape TensorStore::shape(const std::string& name) const {
    return impl_->tensors.at(name).shape;
}

DType TensorStore::dtype(const std::string& name) const {
    return impl_->tensors.at(name).dtype;
}

void TensorStore::read(
    const std::string& name, int dim, int64_t begin, int64_t full, Tensor& dest) const {
    auto it = impl_->tensors.find(name);
    if (it == impl_->tensors.end())
        HYMOE_FAIL_ONE(Exit::checkpoint,
                       "checkpoint ",
                       dir_,
                       " has no tensor ",
                       name,
                       " (its manifest.json does not list it)");
    const TensorMeta& m = it->second;
    const std::string path = dir_ + "/" + m.file;
    Shape want = dest.shape;
    if (dim >= 0 && dim < static_cast<int>(want.size()))
        want[dim] = full;
    if (want != m.shape || (dim >= 0 && begin + dest.shape[dim] > full))
        HYMOE_FAIL_ONE(Exit::checkpoint,
                       "tensor ",
                       name,
                       " in ",
                       path,
                       " is ",
                       shape_string(m.shape),
                       " but this model needs ",
                       shape_string(want));
    const auto is_float = [](DType t) {
        return t == DType::f32 || t == DType::bf16 || t == DType::f16;
    };
    if (dest.dtype != m.dtype && !(is_float(dest.dtype) && is_float(m.dtype)))
        HYMOE_FAIL_ONE(Exit::checkpoint,
                       "tensor ",
                       name,
                       " in ",
                       path,
                       " is stored as ",
                       to_string(m.dtype),
                       ", which cannot be read as ",
                       to_string(dest.dtype));
    Shape dest_off(want.size(), 0);
    if (dim >= 0)
        dest_off[dim] = begin;
    auto& file = impl_->files[m.file];
    for (const PieceMeta& p : m.pieces) {
        if (m.split_dim >= 0 && m.split_dim == dim &&
            (p.begin >= begin + dest.shape[dim] || p.begin + p.rows <= begin))
            continue;  // this piece lies outside the slice
        Shape piece_shape = m.shape, piece_off(m.shape.size(), 0);
        if (m.split_dim >= 0)
            piece_shape[m.split_dim] = p.rows, piece_off[m.split_dim] = p.begin;
        if (shape_numel(piece_shape) == 0 || dest.numel() == 0)
            continue;
        Buffer buf(m.dtype, piece_shape);
        try {
            if (!file)
                file = std::make_unique<H5Reader>(path);
            file->slab("/" + name, m.split_dim, p.begin, buf.view());
        } catch (const Error& e) {
            HYMOE_FAIL_ONE(Exit::checkpoint,
                           "cannot read tensor ",
                           name,
                           " from ",
                           path,
                           ": the file is missing, truncated or damaged (",
                           e.what(),
                           ")");
        }
        Sha256 h;
        h.update(buf.view().data, buf.view().bytes());
        if (h.hex_digest() != p.sha256)
            HYMOE_FAIL_ONE(
                Exit::checkpoint,
                "tensor ",
                name,
                m.split_dim < 0
                    ? std::string()
                    : cat(" (rows ", p.begin, "..", p.begin + p.rows, " of dim ", m.split_dim, ")"),
                " in ",
                path,
                " does not match its checksum in manifest.json: the file is corrupt");
        copy_overlap(buf.view(), piece_off, dest, dest_off);
    }
}

std::string read_manifest(const std::string& dir) {
    const std::string path = dir + "/manifest.json";
    std::ifstream f(path, std::ios::binary);
    std::ostringstream text;
    text << f.rdbuf();
    if (!f || text.str().empty())
        HYMOE_FAIL_ONE(Exit::checkpoint, "cannot read ", path, " (no complete checkpoint there)");
    return text.str();
}

}  // namespace hymoe::io
