// A host vector's elements as a host Tensor without a copy, for io::H5Writer and comm:: (the
// vector must outlive the view). Private to src/runtime.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "hymoe/core/error.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::runtime {

// v's first numel(shape) elements as a tensor of dtype (of T's size) and shape; all of v, 1-D,
// without a shape.
template <typename T>
Tensor view_of(const std::vector<T>& v, DType dtype, Shape shape) {
    HYMOE_CHECK(
        dtype_size(dtype) == sizeof(T) && shape_numel(shape) <= static_cast<int64_t>(v.size()),
        "view_of: ",
        v.size(),
        " elements of ",
        sizeof(T),
        " bytes as ",
        to_string(dtype),
        " ",
        shape_string(shape));
    return Tensor{const_cast<T*>(v.data()), dtype, Device::cpu, std::move(shape)};
}
template <typename T>
Tensor view_of(const std::vector<T>& v, DType dtype) {
    return view_of(v, dtype, {static_cast<int64_t>(v.size())});
}

}  // namespace hymoe::runtime
