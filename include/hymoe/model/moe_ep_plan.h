// The host plan of the GPU MoE layer over an ep group (src/model/cuda/device_moe_ep.cpp): plain
// C++, built and unit-tested in CPU builds too. It follows the CPU pipeline (model/moe_parallel.h,
// moe_dispatch.cpp) at tp = etp = 1: each token of a micro-batch goes once to each distinct ep
// rank hosting one of its kept top-k experts, rows sorted by destination and then token; the
// expert side (model/moe_grouped.h on local expert ids) groups the received rows of each hosted
// expert (source rank, then token order) for the grouped GEMMs and forms each received row's
// weighted sum over its hosted slots in slot order (fp32); the owner adds a token's returned
// partials in ascending source rank.
#pragma once

#include <cstdint>
#include <vector>

#include "hymoe/model/ffn.h"
#include "hymoe/model/moe_parallel.h"

namespace hymoe::model {

// The step's rows cut into micro-batches: one ([0, n_tok)), or with `overlap` two halves (the
// first ⌈n_tok/2⌉ rows, then the rest; either may be empty). Every rank of an ep group makes the
// same number of micro-batches, whatever its n_tok.
std::vector<RowRange> moe_micro_batches(int64_t n_tok, bool overlap);

// The local index of every routed expert on ep rank `ep_rank` ([E]: its position among the
// experts that rank hosts, ascending ids; −1 elsewhere), under a placement (MoeWeights::
// expert_rank; empty: blocks of E/ep).
std::vector<int> local_expert_index(const std::vector<int>& placement,
                                    int64_t n_exp,
                                    int ep,
                                    int ep_rank);

// Owner side of one micro-batch: rows [first, first + n_tok) of the step under routing r.
struct EpSendPlan {
    RowRange tokens;
    std::vector<int64_t> send_rows;  // [ep] rows to each rank
    std::vector<int64_t> token;      // [n_send] step row each sent row carries (gather map)
    std::vector<int32_t> ids;        // [n_send, k] the slot's expert if kept and hosted at the
                                     //   row's destination, else −1
    std::vector<float> weight;       // [n_send, k] its combine weight (0 where −1)
    // [n_tok, ep] the sent row of (token, rank), −1 where none: the owner's combine reads the
    // returned partials through it, rank ascending (moe_unpermute with k = ep, weights 1).
    std::vector<int64_t> back_row;
    int64_t n_send() const { return static_cast<int64_t>(token.size()); }
};
EpSendPlan plan_ep_send(const Routing& r,
                        int64_t top_k,
                        const std::vector<int>& placement,
                        int64_t n_exp,
                        int ep,
                        RowRange tokens);

// Expert side of one micro-batch: the received rows' expert ids recv_ids [n_recv, k] (−1: not
// hosted here) as local indices (local_expert_index), −1 kept, for the grouped expert stage
// (model/moe_grouped.h, whose groups keep the received order: source rank, then token). An id
// not hosted on this rank is an internal error.
std::vector<int32_t> local_expert_ids(const std::vector<int32_t>& recv_ids,
                                      const std::vector<int>& local_index);

}  // namespace hymoe::model
