// Tensor views and aligned host buffers.
#include "hymoe/tensor/tensor.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "hymoe/core/error.h"

namespace hymoe {

int64_t shape_numel(const Shape& shape) {
    int64_t n = 1;
    for (int64_t d : shape)
        HYMOE_CHECK(
            d >= 0 && !__builtin_mul_overflow(n, d, &n), "invalid shape ", shape_string(shape));
    return n;
}

std::string shape_string(const Shape& shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i)
        s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

Tensor Tensor::rows(int64_t begin, int64_t count) const {
    HYMOE_CHECK(!shape.empty() && begin >= 0 && count >= 0 && begin + count <= shape[0],
                "rows [",
                begin,
                ", ",
                begin + count,
                ") of ",
                shape_string(shape));
    Tensor t = *this;
    t.shape[0] = count;
    size_t row_bytes = shape[0] ? bytes() / static_cast<size_t>(shape[0]) : 0;
    t.data = static_cast<char*>(data) + static_cast<size_t>(begin) * row_bytes;
    return t;
}

namespace {

std::atomic<int64_t> live_bytes{0}, peak_bytes{0};

void count(int64_t delta) {
    const int64_t now = live_bytes += delta;
    int64_t peak = peak_bytes.load();
    while (now > peak && !peak_bytes.compare_exchange_weak(peak, now)) {
    }
}

}  // namespace

BufferBytes buffer_bytes() {
    return {live_bytes.load(), peak_bytes.load()};
}

void Buffer::Free::operator()(void* p) const {
    count(-static_cast<int64_t>(bytes));
    std::free(p);
}

Buffer::Buffer(DType dtype, Shape shape) : Buffer(dtype, std::move(shape), uninit) {
    std::memset(view_.data, 0, mem_.get_deleter().bytes);
}

Buffer::Buffer(DType dtype, Shape shape, Uninit) {
    view_.dtype = dtype;
    view_.shape = std::move(shape);
    size_t n = view_.bytes();
    size_t padded = (n + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, padded ? padded : 64);
    HYMOE_CHECK(p != nullptr, "out of host memory allocating ", n, " bytes");
    mem_ = std::unique_ptr<void, Free>(p, Free{padded});
    count(static_cast<int64_t>(padded));
    view_.data = p;
}

}  // namespace hymoe
