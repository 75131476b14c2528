// The phases of the expert-parallel MoE layer (model/moe_parallel.h) for one micro-batch of owned
// tokens: plan the dispatch (owner side), exchange counts and metadata, start the payload
// all-to-all, run the hosted experts on the received rows (expert side), start the reverse
// all-to-all, and add the returned partials (owner side). Private to src/model.
// A null ep comm stands for a group of one: the exchanges become copies.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "hymoe/model/ffn.h"
#include "hymoe/model/moe_parallel.h"
#include "hymoe/model/shard.h"
#include "hymoe/parallel/comm.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::model::detail {

// Where the routed experts live (model/shard.h expert_rank_of): MoeWeights::expert_rank, or ep
// rank r hosting experts [r·E/ep, (r+1)·E/ep) when that is empty.
struct ExpertHosting {
    int ep = 1, ep_rank = 0;
    int64_t n_exp = 0;                    // E
    const std::vector<int>* placement{};  // [E] ep rank of each expert (empty: blocks)
    int rank_of(int64_t expert) const { return expert_rank_of(*placement, expert, n_exp, ep); }
};

// One micro-batch on its way to the experts and back. Owner side: the rows this rank sends, by
// destination and then token; expert side: the rows it receives, by source and then token.
// Every buffer stays put while a Request on it is in flight.
struct MoeBatch {
    int64_t first = 0, n_tok = 0;    // owned rows [first, first + n_tok) (owned-row indices)
    std::vector<int64_t> send_rows;  // [ep] rows to each ep rank
    std::vector<int64_t> recv_rows;  // [ep] rows from each ep rank
    std::vector<int64_t> token;      // [n_send] owned row each sent row carries
    Buffer send;                     // [n_send, w] payload
    Buffer send_ids;                 // [n_send, k] i32 slot's expert if hosted there, else −1
    Buffer send_weight;              // [n_send, k] f32 its combine weight (0 where −1)
    Buffer recv;                     // [n_recv, w]
    Buffer recv_ids;                 // [n_recv, k] i32
    Buffer recv_weight;              // [n_recv, k] f32
    Buffer partial;                  // [n_recv, w] Σ over hosted slots w_i · expert_i(row)
    Buffer back;                     // [n_send, w] the partials, returned to the owner
    comm::Request dispatch, combine;
};

// Owner side: the rows of owned tokens [b.first, b.first + b.n_tok) of payload [n_own, w] under
// routing r (of the owned rows): each token once per distinct ep rank hosting a kept expert.
void plan_batch(const Routing& r,
                int64_t top_k,
                const ExpertHosting& hosting,
                const Tensor& payload /*[n_own, w]*/,
                MoeBatch& b);

// Counts (comm::exchange_counts) and metadata (two all_to_all_v), blocking; allocates every
// expert-side buffer and `back`. Collective over ep.
void exchange_metadata(MoeBatch& b, const comm::Comm* ep);

// The payload to the experts; non-blocking, completes in b.dispatch. Collective over ep.
void start_dispatch(MoeBatch& b, const comm::Comm* ep);

// Expert side: each hosted expert on its received rows (grouped, dense_ffn_forward), then
// b.partial. poll() runs between experts (to progress other batches' requests);
// tokens_per_expert [E] += assignments computed here.
void run_experts(const MoeWeights& local,
                 ExpertAct act,
                 const ExpertHosting& hosting,
                 MoeBatch& b,
                 const std::function<void()>& poll,
                 std::vector<int64_t>& tokens_per_expert);

// The partials back to their owners; non-blocking, completes in b.combine. Collective over ep.
void start_combine(MoeBatch& b, const comm::Comm* ep);

// Owner side, after b.combine completed: acc[token] += each returned partial, in ascending
// source-rank order.
void add_partials(const MoeBatch& b, Tensor& acc /*[n_own, w]*/);

}  // namespace hymoe::model::detail
