// HF safetensors dtypes and the reader (SafetensorsFile: memory-mapped, header validated
// completely at open); see io/safetensors.h for the format. Also defines the helpers shared with
// safetensors_folder.cpp and safetensors_write.cpp (safetensors_detail.h).
//
// Validation order at open: the file opens and is a regular file of at least 8 bytes; the header
// length is plausible (<= 100 MB, the limit of HF's reader) and inside the file; the header is JSON
// without duplicate keys at any depth (nlohmann keeps the last of duplicates, so a parser callback
// watches every object's keys); it is an object; "__metadata__" is an object of strings; then per
// tensor (in name order): an object with a known "dtype", a "shape" of non-negative integers whose
// byte count does not overflow, "data_offsets" [begin, end] of non-negative integers with
// begin <= end, end - begin == numel * dtype size, and end inside the data section; last, no two
// tensors share a byte. Gaps between tensors and bytes after the last one are allowed.
// Multi-byte values are little-endian in the file and on every host we build for.
#include "hymoe/io/safetensors.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <limits>
#include <set>
#include <string_view>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "hymoe/core/error.h"
#include "safetensors_detail.h"

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace hymoe::io {

using detail::convert;
using detail::convertible;
using detail::DuplicateKey;
using detail::json_message;
using detail::parse_strict;
using nlohmann::json;

namespace {

constexpr uint64_t kMaxHeaderLen = 100'000'000;  // HF safetensors' MAX_HEADER_SIZE

struct StDTypeName {
    StDType dtype;
    const char* name;
    size_t size;
};
constexpr StDTypeName kStDTypes[] = {
    {StDType::boolean, "BOOL", 1},
    {StDType::u8, "U8", 1},
    {StDType::i8, "I8", 1},
    {StDType::f8_e4m3, "F8_E4M3", 1},
    {StDType::f8_e5m2, "F8_E5M2", 1},
    {StDType::f8_e8m0, "F8_E8M0", 1},
    {StDType::i16, "I16", 2},
    {StDType::u16, "U16", 2},
    {StDType::f16, "F16", 2},
    {StDType::bf16, "BF16", 2},
    {StDType::i32, "I32", 4},
    {StDType::u32, "U32", 4},
    {StDType::f32, "F32", 4},
    {StDType::i64, "I64", 8},
    {StDType::u64, "U64", 8},
    {StDType::f64, "F64", 8},
};

// ---- element loads (convert's inner loops) ------------------------------------------------------

template <typename T>
T load(const unsigned char* p) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
}

// One stored element as f32 (each a distinct lambda type, so store_floats inlines it).
constexpr auto load_f32 = [](const unsigned char* p) { return load<float>(p); };
constexpr auto load_f16 = [](const unsigned char* p) { return f16_to_float(load<uint16_t>(p)); };
constexpr auto load_bf16 = [](const unsigned char* p) { return bf16_to_float(load<uint16_t>(p)); };
constexpr auto load_f64 = [](const unsigned char* p) {
    return static_cast<float>(load<double>(p));
};
constexpr auto load_i32 = [](const unsigned char* p) {
    return static_cast<float>(load<int32_t>(p));
};
constexpr auto load_i64 = [](const unsigned char* p) {
    return static_cast<float>(load<int64_t>(p));
};

template <typename Load>
void store_floats(
    const unsigned char* src, size_t src_size, Load ld, unsigned char* dst, DType d, size_t n) {
    switch (d) {
        case DType::f32:
            for (size_t i = 0; i < n; ++i) {
                float v = ld(src + i * src_size);
                std::memcpy(dst + 4 * i, &v, 4);
            }
            return;
        case DType::f16:
            for (size_t i = 0; i < n; ++i) {
                uint16_t h = float_to_f16(ld(src + i * src_size));
                std::memcpy(dst + 2 * i, &h, 2);
            }
            return;
        case DType::bf16:
            for (size_t i = 0; i < n; ++i) {
                uint16_t h = float_to_bf16(ld(src + i * src_size));
                std::memcpy(dst + 2 * i, &h, 2);
            }
            return;
        default:
            break;
    }
    HYMOE_CHECK(false, "no float conversion into ", to_string(d));
}

// ---- header fields ------------------------------------------------------------------------------

// A JSON integer >= 0 that fits int64, or nothing.
std::optional<uint64_t> non_negative(const json& v) {
    if (v.is_number_unsigned()) {
        uint64_t u = v.get<uint64_t>();
        if (u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
            return u;
    } else if (v.is_number_integer() && v.get<int64_t>() >= 0) {
        return static_cast<uint64_t>(v.get<int64_t>());
    }
    return std::nullopt;
}

void check_convertible(const std::string& path,
                       const std::string& name,
                       StDType s,
                       const Tensor& dest) {
    if (!convertible(s, dest.dtype))
        HYMOE_FAIL_ONE(Exit::bad_input,
                       path,
                       ": tensor '",
                       name,
                       "' is ",
                       to_string(s),
                       " and cannot be read into a ",
                       to_string(dest.dtype),
                       " destination");
    HYMOE_CHECK(dest.device == Device::cpu,
                "safetensors reads into host memory, not ",
                to_string(dest.device));
    HYMOE_CHECK(dest.data != nullptr || dest.numel() == 0,
                "reading tensor '",
                name,
                "' into a null destination");
}

// Copy part of a stored tensor `src` (type s, shape full) into dest (shape part: full with
// [begin, begin + part[dim]) along dim). Viewed as [outer, full[dim], inner] -> [outer, part[dim],
// inner], that is one contiguous run of part[dim] * inner elements per outer index.
void copy_part(const unsigned char* src,
               StDType s,
               const Shape& full,
               int dim,
               int64_t begin,
               const Shape& part,
               Tensor& dest) {
    if (shape_numel(part) == 0)
        return;
    uint64_t outer = 1, inner = 1;
    for (int i = 0; i < static_cast<int>(full.size()); ++i) {
        if (i < dim)
            outer *= static_cast<uint64_t>(full[i]);
        else if (i > dim)
            inner *= static_cast<uint64_t>(full[i]);
    }
    const size_t ssize = st_dtype_size(s), dsize = dtype_size(dest.dtype);
    const uint64_t run = static_cast<uint64_t>(part[dim]) * inner;
    const uint64_t stride = static_cast<uint64_t>(full[dim]) * inner;
    src += static_cast<uint64_t>(begin) * inner * ssize;
    unsigned char* dst = static_cast<unsigned char*>(dest.data);

    // Ask the kernel to read ahead exactly the span about to be copied (and nothing around it).
    const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    uintptr_t lo = reinterpret_cast<uintptr_t>(src) & ~(page - 1);
    uintptr_t hi = reinterpret_cast<uintptr_t>(src) + ((outer - 1) * stride + run) * ssize;
    ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_WILLNEED);

    for (uint64_t o = 0; o < outer; ++o)
        convert(src + o * stride * ssize, s, dst + o * run * dsize, dest.dtype, run);
}

// A JSON array as written in messages: "[4, -1]".
std::string list_string(const json& a) {
    std::string s = "[";
    for (size_t i = 0; i < a.size(); ++i)
        s += (i ? ", " : "") + a[i].dump();
    return s + "]";
}

// Fd closed on scope exit (the mapping outlives it).
struct Fd {
    int fd;
    ~Fd() {
        if (fd >= 0)
            ::close(fd);
    }
};

}  // namespace

// ---- dtypes -------------------------------------------------------------------------------------

const char* to_string(StDType t) {
    for (const StDTypeName& e : kStDTypes)
        if (e.dtype == t)
            return e.name;
    return "?";
}

size_t st_dtype_size(StDType t) {
    for (const StDTypeName& e : kStDTypes)
        if (e.dtype == t)
            return e.size;
    return 0;
}

std::optional<StDType> st_dtype_from_string(const std::string& s) {
    for (const StDTypeName& e : kStDTypes)
        if (s == e.name)
            return e.dtype;
    return std::nullopt;
}

StDType st_dtype_of(DType t) {
    switch (t) {
        case DType::f32:
            return StDType::f32;
        case DType::f16:
            return StDType::f16;
        case DType::bf16:
            return StDType::bf16;
        case DType::i32:
            return StDType::i32;
        case DType::i64:
            return StDType::i64;
        case DType::u8:
            return StDType::u8;
    }
    return StDType::u8;
}

namespace detail {

// ---- strict JSON --------------------------------------------------------------------------------

json parse_strict(std::string_view text, std::optional<DuplicateKey>& dup) {
    std::vector<std::set<std::string>> open;  // keys seen so far in each enclosing object
    std::string top;
    json::parser_callback_t watch = [&](int depth, json::parse_event_t event, json& parsed) {
        if (event == json::parse_event_t::object_start) {
            open.emplace_back();
        } else if (event == json::parse_event_t::object_end) {
            open.pop_back();
        } else if (event == json::parse_event_t::key) {
            const std::string& k = parsed.get_ref<const std::string&>();
            if (depth == 1)
                top = k;
            if (!open.empty() && !open.back().insert(k).second && !dup)
                dup = DuplicateKey{k, depth == 1 ? "" : top};
        }
        return true;
    };
    return json::parse(text.begin(), text.end(), watch);
}

std::string json_message(const json::exception& e) {
    std::string m = e.what();
    size_t p = m.find("] ");
    return p == std::string::npos ? m : m.substr(p + 2);
}

// ---- element conversion -------------------------------------------------------------------------

bool is_float_dtype(DType t) {
    return t == DType::f32 || t == DType::f16 || t == DType::bf16;
}

bool convertible(StDType s, DType d) {
    if (st_dtype_of(d) == s || (s == StDType::boolean && d == DType::u8))
        return true;
    bool numeric = s == StDType::f32 || s == StDType::f16 || s == StDType::bf16 ||
                   s == StDType::f64 || s == StDType::i32 || s == StDType::i64;
    return numeric && is_float_dtype(d);
}

void convert(const unsigned char* src, StDType s, unsigned char* dst, DType d, size_t n) {
    if (st_dtype_of(d) == s || (s == StDType::boolean && d == DType::u8)) {
        std::memcpy(dst, src, n * dtype_size(d));
        return;
    }
    switch (s) {
        case StDType::f32:
            return store_floats(src, 4, load_f32, dst, d, n);
        case StDType::f16:
            return store_floats(src, 2, load_f16, dst, d, n);
        case StDType::bf16:
            return store_floats(src, 2, load_bf16, dst, d, n);
        case StDType::f64:
            return store_floats(src, 8, load_f64, dst, d, n);
        case StDType::i32:
            return store_floats(src, 4, load_i32, dst, d, n);
        case StDType::i64:
            return store_floats(src, 8, load_i64, dst, d, n);
        default:
            break;
    }
    HYMOE_CHECK(false, "no conversion from ", to_string(s), " to ", to_string(d));
}

}  // namespace detail

// ---- SafetensorsFile ----------------------------------------------------------------------------

void SafetensorsFile::Unmap::operator()(void* p) const {
    ::munmap(p, size);
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
    Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
    if (f.fd < 0)
        HYMOE_FAIL_ONE(Exit::bad_input, path, ": cannot open (", std::strerror(errno), ")");
    struct stat st {};
    if (::fstat(f.fd, &st) != 0)
        HYMOE_FAIL_ONE(Exit::bad_input, path, ": cannot stat (", std::strerror(errno), ")");
    if (!S_ISREG(st.st_mode))
        HYMOE_FAIL_ONE(Exit::bad_input, path, ": is not a regular file");
    uint64_t size = static_cast<uint64_t>(st.st_size);
    if (size < 8)
        HYMOE_FAIL_ONE(Exit::bad_input,
                       path,
                       ": file is ",
                       size,
                       " bytes, too short to hold the 8-byte header length (truncated?)");

    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, f.fd, 0);
    if (p == MAP_FAILED)
        HYMOE_FAIL_ONE(Exit::bad_input, path, ": cannot memory-map (", std::strerror(errno), ")");
    map_ = std::unique_ptr<void, Unmap>(p, Unmap{size});
    const unsigned char* bytes = static_cast<const unsigned char*>(p);

    uint64_t header_len = load<uint64_t>(bytes);
    if (header_len > kMaxHeaderLen)
        HYMOE_FAIL_ONE(Exit::bad_input,
                       path,
                       ": header length ",
                       header_len,
                       " is implausible (the limit is ",
                       kMaxHeaderLen,
                       " bytes): not a safetensors file?");
    if (header_len > size - 8)
        HYMOE_FAIL_ONE(Exit::bad_input,
                       path,
                       ": header length ",
                       header_len,
                       " runs past the end of the file (",
                       size,
                       " bytes; truncated?)");
    data_ = bytes + 8 + header_len;
    data_size_ = size - 8 - header_len;
    parse_header(reinterpret_cast<const char*>(bytes + 8), header_len);
}

void SafetensorsFile::parse_header(const char* text, size_t len) {
    json header;
    std::optional<DuplicateKey> dup;
    try {
        header = parse_strict(std::string_view(text, len), dup);
    } catch (const json::exception& e) {
        HYMOE_FAIL_ONE(Exit::bad_input, path_, ": header is not valid JSON: ", json_message(e));
    }
    if (!header.is_object())
        HYMOE_FAIL_ONE(Exit::bad_input,
                       path_,
                       ": header is a JSON ",
                       header.type_name(),
                       ", not an object of tensors");
    if (dup && dup->top.empty())
        HYMOE_FAIL_ONE(Exit::bad_input,
                       path_,
                       ": tensor '",
                       dup->key,
                       "' appears more than once in the header");
    if (dup && dup->top == "__metadata__")
        HYMOE_FAIL_ONE(Exit::bad_input,
                       path_,
                       ": \"__metadata__\" key '",
                       dup->key,
                       "' appears more than once");
    if (dup)
        HYMOE_FAIL_ONE(Exit::bad_input,
                       path_,
                       ": tensor '",
                       dup->top,
                       "': key '",
                       dup->key,
                       "' appears more than once in its entry");

    for (const auto& [name, v] : header.items()) {
        if (name == "__metadata__") {
            if (!v.is_object())
                HYMOE_FAIL_ONE(Exit::bad_input,
                               path_,
                               ": \"__metadata__\" is a JSON ",
                               v.type_name(),
                               ", not an object of strings");
            for (const auto& [k, s] : v.items()) {
                if (!s.is_string())
                    HYMOE_FAIL_ONE(Exit::bad_input,
                                   path_,
                                   ": \"__metadata__\" entry '",
                                   k,
                                   "' is ",
                                   s.dump(),
                                   ", not a string");
                metadata_[k] = s.get<std::string>();
            }
            continue;
        }
        const std::string where = path_ + ": tensor '" + name + "'";
        if (!v.is_object())
            HYMOE_FAIL_ONE(Exit::bad_input,
                           where,
                           ": entry is a JSON ",
                           v.type_name(),
                           ", not an object {dtype, shape, data_offsets}");
        SafetensorsInfo t;

        auto dt = v.find("dtype");
        if (dt == v.end() || !dt->is_string())
            HYMOE_FAIL_ONE(Exit::bad_input, where, ": \"dtype\" is missing or not a string");
        std::optional<StDType> known = st_dtype_from_string(dt->get<std::string>());
        if (!known)
            HYMOE_FAIL_ONE(
                Exit::bad_input, where, ": unknown dtype '", dt->get<std::string>(), "'");
        t.dtype = *known;

        auto sh = v.find("shape");
        if (sh == v.end() || !sh->is_array())
            HYMOE_FAIL_ONE(Exit::bad_input, where, ": \"shape\" is missing or not a list");
        uint64_t numel = 1;
        bool overflow = false;
        for (const json& d : *sh) {
            std::optional<uint64_t> n = non_negative(d);
            if (!n)
                HYMOE_FAIL_ONE(Exit::bad_input,
                               where,
                               ": shape ",
                               list_string(*sh),
                               " has an entry that is not a non-negative integer");
            t.shape.push_back(static_cast<int64_t>(*n));
            overflow = overflow || __builtin_mul_overflow(numel, *n, &numel);
        }
        uint64_t need = 0;
        overflow = overflow || __builtin_mul_overflow(numel, st_dtype_size(t.dtype), &need);
        if (overflow || need > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
            HYMOE_FAIL_ONE(Exit::bad_input, where, ": shape ", list_string(*sh), " is too large");

        auto off = v.find("data_offsets");
        std::optional<uint64_t> begin, end;
        if (off != v.end() && off->is_array() && off->size() == 2) {
            begin = non_negative((*off)[0]);
            end = non_negative((*off)[1]);
        }
        if (!begin || !end)
            HYMOE_FAIL_ONE(Exit::bad_input,
                           where,
                           ": \"data_offsets\" is missing or not two non-negative integers");
        std::string offsets = cat("data_offsets [", *begin, ", ", *end, "]");
        if (*end < *begin)
            HYMOE_FAIL_ONE(Exit::bad_input, where, ": ", offsets, " end before they begin");
        if (*end - *begin != need)
            HYMOE_FAIL_ONE(Exit::bad_input,
                           where,
                           ": ",
                           offsets,
                           " hold ",
                           *end - *begin,
                           " bytes but ",
                           to_string(t.dtype),
                           " ",
                           shape_string(t.shape),
                           " needs ",
                           need);
        if (*end > data_size_)
            HYMOE_FAIL_ONE(Exit::bad_input,
                           where,
                           ": ",
                           offsets,
                           " run past the end of the data section (",
                           data_size_,
                           " bytes; truncated?)");
        t.begin = *begin;
        t.bytes = need;
        tensors_.emplace(name, std::move(t));
        names_.push_back(name);  // header.items() iterates in key order
    }

    // No two tensors share a byte: sorted by begin, each non-empty tensor starts at or after the
    // furthest end so far.
    std::vector<const std::pair<const std::string, SafetensorsInfo>*> order;
    for (const auto& e : tensors_)
        if (e.second.bytes > 0)
            order.push_back(&e);
    std::sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
        return a->second.begin < b->second.begin;
    });
    const std::pair<const std::string, SafetensorsInfo>* furthest = nullptr;
    for (const auto* e : order) {
        const SafetensorsInfo& t = e->second;
        if (furthest && t.begin < furthest->second.begin + furthest->second.bytes) {
            const SafetensorsInfo& u = furthest->second;
            HYMOE_FAIL_ONE(Exit::bad_input,
                           path_,
                           ": tensors '",
                           furthest->first,
                           "' [",
                           u.begin,
                           ", ",
                           u.begin + u.bytes,
                           "] and '",
                           e->first,
                           "' [",
                           t.begin,
                           ", ",
                           t.begin + t.bytes,
                           "] overlap");
        }
        if (!furthest || t.begin + t.bytes > furthest->second.begin + furthest->second.bytes)
            furthest = e;
    }
}

const SafetensorsInfo& SafetensorsFile::info(const std::string& name) const {
    auto it = tensors_.find(name);
    if (it == tensors_.end())
        HYMOE_FAIL_ONE(Exit::bad_input,
                       path_,
                       ": tensor '",
                       name,
                       "' is missing (",
                       tensors_.size(),
                       " tensors in the file)");
    return it->second;
}

const void* SafetensorsFile::raw(const std::string& name) const {
    return data_ + info(name).begin;
}

void SafetensorsFile::read(const std::string& name, Tensor& dest) const {
    const SafetensorsInfo& t = info(name);
    if (dest.shape != t.shape)
        HYMOE_FAIL_ONE(Exit::bad_input,
                       path_,
                       ": tensor '",
                       name,
                       "' is ",
                       to_string(t.dtype),
                       " ",
                       shape_string(t.shape),
                       " but the destination is ",
                       to_string(dest.dtype),
                       " ",
                       shape_string(dest.shape));
    check_convertible(path_, name, t.dtype, dest);
    Shape whole = t.shape.empty() ? Shape{1} : t.shape;  // a scalar reads as one element
    copy_part(data_ + t.begin, t.dtype, whole, 0, 0, whole, dest);
}

void SafetensorsFile::read_rows(const std::string& name, int64_t row_begin, Tensor& dest) const {
    read_slice(name, 0, row_begin, dest);
}

int SafetensorsFile::check_slice(const std::string& name,
                                 int dim,
                                 int64_t begin,
                                 const Tensor& dest) const {
    const SafetensorsInfo& t = info(name);
    const int rank = static_cast<int>(t.shape.size());
    const int d = dim < 0 ? dim + rank : dim;
    bool same_rank = d >= 0 && d < rank && dest.shape.size() == t.shape.size();
    bool fits =
        same_rank && begin >= 0 && dest.shape[d] >= 0 && begin <= t.shape[d] - dest.shape[d];
    for (int i = 0; fits && i < rank; ++i)
        fits = i == d || dest.shape[i] == t.shape[i];
    if (!fits) {
        std::string what = cat("a slice along dim ", dim, " does");
        if (same_rank)
            what = d == 0 ? cat("rows [", begin, ", ", begin + dest.shape[0], ") do")
                          : cat("[", begin, ", ", begin + dest.shape[d], ") along dim ", d, " do");
        HYMOE_FAIL_ONE(Exit::bad_input,
                       path_,
                       ": tensor '",
                       name,
                       "' is ",
                       to_string(t.dtype),
                       " ",
                       shape_string(t.shape),
                       ": ",
                       what,
                       " not fit a destination ",
                       to_string(dest.dtype),
                       " ",
                       shape_string(dest.shape));
    }
    return d;
}

void SafetensorsFile::read_slice(const std::string& name,
                                 int dim,
                                 int64_t begin,
                                 Tensor& dest) const {
    const SafetensorsInfo& t = info(name);
    const int d = check_slice(name, dim, begin, dest);
    check_convertible(path_, name, t.dtype, dest);
    copy_part(data_ + t.begin, t.dtype, t.shape, d, begin, dest.shape, dest);
}

}  // namespace hymoe::io
