// Many tensors to the host with one wait (backend/ops_bulk.h).
#include "hymoe/backend/ops_bulk.h"

#include <cstring>

#include "hymoe/backend/ops_rows.h"
#include "hymoe/core/error.h"

namespace hymoe::ops {

void download_all(const backend::Ctx& ctx, std::span<const Tensor> srcs, std::span<Tensor> hosts) {
    HYMOE_CHECK(
        srcs.size() == hosts.size(), "download_all: ", srcs.size(), " tensors into ", hosts.size());
    if (srcs.empty())
        return;
    const DType dtype = srcs[0].dtype;
    int64_t n = 0;
    for (size_t i = 0; i < srcs.size(); ++i) {
        HYMOE_CHECK(srcs[i].dtype == dtype && hosts[i].dtype == dtype &&
                        hosts[i].device == Device::cpu && srcs[i].numel() == hosts[i].numel(),
                    "download_all: tensor ",
                    i,
                    " (",
                    to_string(srcs[i].dtype),
                    " ",
                    shape_string(srcs[i].shape),
                    ") does not match its host tensor");
        n += srcs[i].numel();
    }
    backend::Scratch scratch(ctx);
    Tensor packed = scratch(dtype, {n});  // [n]: every source, in order
    int64_t at = 0;
    for (const Tensor& s : srcs) {
        Tensor part = packed.rows(at, s.numel());
        cast(ctx, s, part);
        at += s.numel();
    }
    Buffer host(dtype, {n}, uninit);
    download(ctx, packed, host.view());
    at = 0;
    for (Tensor& h : hosts) {
        std::memcpy(h.data, host.view().rows(at, h.numel()).data, h.bytes());
        at += h.numel();
    }
}

}  // namespace hymoe::ops
