// Sequences paged into one KV pool for the GPU model tests (tests/cuda, tests/mpi/test_cuda_ep):
// on the CPU (device null) or on a DeviceModel, its pages on the device or in its host tier.
#pragma once

#include <memory>
#include <vector>

#include "hymoe/model/device_model.h"
#include "hymoe/model/kv_cache.h"
#include "hymoe/model/model.h"

namespace hymoe::cuda_test {

struct PagedSequences {
    std::unique_ptr<model::KvPool> pool;
    std::vector<model::SequenceState> states;  // never resized: the pool holds their pages
};

// n_seq new sequences of m in a pool of `pages` pages of page_tokens tokens.
inline PagedSequences paged_sequences(const model::Model& m,
                                      model::DeviceModel* device,
                                      int page_tokens,
                                      int64_t pages,
                                      size_t n_seq,
                                      bool host_tier = false) {
    PagedSequences p;
    if (device)
        p.pool = std::make_unique<model::KvPool>(
            m.local, m.shard, page_tokens, pages, [device, host_tier](const model::KvLayout& l) {
                return host_tier ? device->host_kv_store(l) : device->kv_store(l);
            });
    else
        p.pool = std::make_unique<model::KvPool>(m.local, m.shard, page_tokens, pages);
    for (size_t s = 0; s < n_seq; ++s)
        p.states.push_back(device ? device->new_sequence() : model::make_sequence_state(m));
    for (model::SequenceState& st : p.states)
        model::attach_kv_pool(m, st, *p.pool);
    return p;
}

}  // namespace hymoe::cuda_test
