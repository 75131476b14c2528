// Tensor: a non-owning, row-major, contiguous view (data pointer, element type, device, shape).
// Buffer: the RAII owner of host memory (64-byte aligned) that views are taken from. Device
// memory is owned by the CUDA backend's arena and viewed the same way.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "hymoe/core/types.h"

namespace hymoe {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& shape);
std::string shape_string(const Shape& shape);  // "[2, 3]"

struct Tensor {
    void* data = nullptr;
    DType dtype = DType::f32;
    Device device = Device::cpu;
    Shape shape;

    int64_t numel() const { return shape_numel(shape); }
    size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
    int64_t dim(int i) const { return shape.at(i < 0 ? shape.size() + i : i); }
    template <typename T>
    T* ptr() const {
        return static_cast<T*>(data);
    }
    // Rows [begin, begin + count) along dim 0, as a view.
    Tensor rows(int64_t begin, int64_t count) const;
};

// Tag of the Buffer constructor that leaves the memory as allocated (no zero-fill), for an
// output its producer overwrites element by element before anything reads it: a GEMM's C with
// beta 0, a gather's destination. Zero-fill stays the default: use this only where every element
// is written first, as the fill costs a pass over the memory (~2% of a prefill).
struct Uninit {};
inline constexpr Uninit uninit{};

// Owns 64-byte aligned host memory for one tensor; movable, not copyable.
class Buffer {
public:
    Buffer() = default;
    Buffer(DType dtype, Shape shape);          // zero-filled
    Buffer(DType dtype, Shape shape, Uninit);  // contents unspecified until written
    Tensor& view() { return view_; }
    const Tensor& view() const { return view_; }
    template <typename T>
    T* ptr() const {
        return view_.ptr<T>();
    }

private:
    struct Free {
        size_t bytes;  // as allocated, for buffer_bytes(); no initializer, or the nested
                       // struct makes Buffer() ill-formed (unique_ptr value-initialises it)
        void operator()(void* p) const;
    };
    std::unique_ptr<void, Free> mem_;
    Tensor view_;
};

// The allocator figures of host Buffers (memory reports): bytes held now and the most held at
// once since the process started.
struct BufferBytes {
    int64_t live = 0, peak = 0;
};
BufferBytes buffer_bytes();

}  // namespace hymoe
