// The dispatch → experts → combine pipeline of the expert-parallel MoE layer
// (model/moe_parallel.h), shared by its forward and its backward: per micro-batch of owned tokens,
// plan the dispatch (owner side), exchange counts and metadata, start the payload all-to-all, run
// an expert stage on the received rows (expert side: the forward's experts, or their backward),
// start the reverse all-to-all, and hand the returned rows to an owner stage. The payload and the
// returned rows have any width (forward: the row in, its partial out; backward: the row and its
// output gradient in, its input-gradient partial and the slots' combine-weight gradients out).
// The payload, the partials and the rows moved between them live on the pipeline's Ctx (CPU, or a
// GPU whose all-to-alls go through NCCL); the plan and the metadata stay on the host.
// Private to src/model. A null ep comm stands for a group of one: the metadata exchanges become
// copies, and the payload and the partials are handed to the other side (no copy).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "hymoe/backend/ctx.h"
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

// A batch's rows on the pipeline's device, read as the host Buffer it replaced (view(), ptr()).
struct BatchRows {
    Tensor t;
    Tensor& view() { return t; }
    const Tensor& view() const { return t; }
    template <typename T>
    T* ptr() const {
        return t.ptr<T>();
    }
};

// One micro-batch on its way to the experts and back. Owner side: the rows this rank sends, by
// destination and then token; expert side: the rows it receives, by source and then token.
// Every tensor stays put while a Request on it is in flight.
struct MoeBatch {
    int64_t first = 0, n_tok = 0;    // owned rows [first, first + n_tok) (owned-row indices)
    std::vector<int64_t> send_rows;  // [ep] rows to each ep rank
    std::vector<int64_t> recv_rows;  // [ep] rows from each ep rank
    std::vector<int64_t> token;      // [n_send] owned row each sent row carries
    std::vector<int64_t> back_row;   // [n_tok, ep] the sent row of (token, ep rank), −1: none
    Buffer send_ids;                 // [n_send, k] i32 slot's expert if hosted there, else −1
    Buffer send_weight;              // [n_send, k] f32 its combine weight (0 where −1)
    Buffer send_adapter;             // [n_send, 1] i32 the row's LoRA adapter (inference)
    Buffer recv_ids;                 // [n_recv, k] i32
    Buffer recv_weight;              // [n_recv, k] f32
    Buffer recv_adapter;             // [n_recv, 1] i32
    // On the pipeline's device:
    BatchRows send;     // [n_send, w_in] payload, the payload's dtype (one rank: also recv)
    BatchRows recv;     // [n_recv, w_in]
    BatchRows partial;  // [n_recv, w_out] f32 expert results (one rank: also back)
    BatchRows back;     // [n_send, w_out] f32 the partials, returned to the owner
    comm::Request dispatch, combine;
};

// The expert side's work on one batch: b.partial [n_recv, w_out] from b.recv and its metadata;
// poll() progresses the requests in flight (call it between experts).
using ExpertStage = std::function<void(MoeBatch& b, const std::function<void()>& poll)>;
// The owner side's use of one batch's returned rows b.back [n_send, w_out].
using OwnerStage = std::function<void(const MoeBatch& b)>;

// The layer against its layout, as the forward and the backward check it (moe.cpp): an MoE
// layer, n_slots = E expert slots, E divisible by ep, etp dividing tp.
void check_moe_layout(const ModelConfig& cfg,
                      const LayerSpec& spec,
                      int64_t n_slots,
                      const MoeParallel& par);
// The expert slots local's weights name: local.expert_slot's, else one per expert held.
int64_t expert_slots(const MoeWeightViews& local);

// The layer's arguments against each other: check_moe_layout, and x [n_tok, d] and out of x's
// shape and not aliasing it (moe.cpp).
void check_moe_layer(const ModelConfig& cfg,
                     const LayerSpec& spec,
                     const MoeWeights& local,
                     const Tensor& x,
                     const Tensor& out,
                     const MoeParallel& par);

// This rank's place in ep and the experts' placement (local.expert_rank) for E experts.
ExpertHosting hosting_of(const MoeWeights& local, int64_t n_exp, const comm::Comm* ep);
// The same for a placement [E] (empty: blocks of E/ep), which must outlive the result.
ExpertHosting hosting_of(const std::vector<int>& placement, int64_t n_exp, const comm::Comm* ep);

// The pipeline of the owned rows' payload [n_own, w_in] under routing r (of the owned rows) over
// ep: one micro-batch, or two (par.overlap: halves of the owned rows). Order, the same on every
// rank (non-blocking collectives must start in one order over a comm): counts and metadata of
// every batch; every dispatch started; per batch: wait its dispatch, the expert stage (polling
// the other requests), start its combine; then per batch in order: wait its combine, the owner
// stage. Stats: rows, bytes (payload and returned) and the dispatch, compute and combine times.
// row_adapter ([n_own], null: 0) is each owned row's LoRA adapter; it travels with the expert ids.
// payload and the batches' rows live on ctx's device. Collective over ep.
void run_pipeline(const ExpertHosting& hosting,
                  const Routing& r,
                  int64_t top_k,
                  const Tensor& payload,  // [n_own, w_in]
                  int64_t out_width,      // w_out
                  const MoeParallel& par,
                  MoeCommStats& s,
                  const ExpertStage& experts,
                  const OwnerStage& owner,
                  const int* row_adapter = nullptr,
                  const backend::Ctx& ctx = backend::cpu_ctx());

// Expert side: the received rows' adapters for RowSlots::adapter; null when every row uses
// adapter 0 (training), so the experts run as without adapters chosen per row.
const int* received_adapters(const MoeBatch& b);

// Owner side on ctx's device: acc rows [b.first, b.first + b.n_tok) = the sum of each token's
// returned rows in ascending source-rank order (ops::moe_combine; zero for a token sent nowhere),
// b.back as wide as acc.
void sum_partials(const backend::Ctx& ctx, const MoeBatch& b, Tensor& acc /*[n_own, w]*/);
// The same with the returned rows' first acc.dim(1) columns as back [n_send, w] (the backward's
// input-gradient partials, split from their combine-weight gradients).
void sum_partials(const backend::Ctx& ctx,
                  const MoeBatch& b,
                  const Tensor& back /*[n_send, w]*/,
                  Tensor& acc /*[n_own, w]*/);

}  // namespace hymoe::model::detail
