// The MoE layer forward over ranks: expert parallelism (ep) and expert tensor parallelism (etp)
// inside the dense tensor-parallel (tp) groups (DESIGN.md "Rank grid", Megatron-Core's MoE
// parallel folding). The math is moe_forward's (model/ffn.h); only where it runs changes.
//
// What a rank holds (the loader's contract, model/shard.h): the router gate [E, d], the correction
// bias [E] and the latent projections fc1 [ℓ, d], fc2 [d, ℓ] whole; experts[e] filled iff
// expert_rank[e] == ep_rank (by default e / (E/ep) == ep_rank), each as its etp slice etp_rank
// (gate/up rows, down columns [etp_rank·I/etp, (etp_rank+1)·I/etp)); the shared experts as their tp
// slice (width S/tp). The input x [n_tok, d] is the same on every rank of a tp group; tp groups of
// different dp replicas carry different tokens, and different n_tok (0 included).
//
// The algorithm, per layer (the pipeline of phases 3-5 in moe_dispatch.cpp, shared with the
// backward; the experts' computation in moe_grouped.cpp):
//  1. ownership: the tp group is cut into tp/etp "etp blocks" of etp consecutive tp ranks
//     (block b = tp_rank / etp; etp_rank = tp_rank mod etp because etp divides tp). Block b owns
//     the contiguous rows moe_owned_rows() gives it (chunk b of tp/etp near-equal chunks); all
//     etp ranks of a block own the same rows.
//  2. route the owned rows with the full gate (route(): one GEMV per token, so a token's choice
//     is bit for bit the one-rank choice). latent_moe: z = fc1 x on the owned rows, so the
//     payload is ℓ wide, not d. Capacity dropping (capacity_factor > 0) is computed over each
//     block's owned rows (C from the owned count), as Megatron drops per rank.
//  3. dispatch over the ep comm (made of the ranks sharing etp rank, edp and pp; its rank r hosts
//     the experts expert_rank places there, by default [r·E/ep, (r+1)·E/ep)): each owned token goes
//     ONCE to each distinct ep rank hosting any of its kept top-k experts, rows sorted by
//     destination then token; comm::exchange_counts then comm::all_to_all_v_start. Per row, the
//     metadata (the top-k expert ids hosted there, −1 elsewhere, and their combine weights) travels
//     in two small all-to-alls of its own.
//  4. experts: each rank gathers the received rows of each hosted expert (source rank, then token
//     order) into one block, runs dense_ffn_forward on it, and forms per received row the
//     weighted sum over its hosted experts in top-k slot order (fp32). With etp > 1 it is a
//     partial sum over the rank's slice of I.
//  5. combine: the reverse all_to_all_v returns each row's partial to its owner, which adds the
//     partials of a token in ascending source-rank order: a fixed order, independent of arrival.
//  6. assembly: y_partial [n_tok, d] is zero except the owned rows (routed part, after fc2 for
//     latent_moe), plus the shared experts' tp-partial on every row; ONE comm::all_reduce(sum)
//     over tp then sums the etp partials and the shared partials and places every block's rows,
//     so y is the full output on every rank of the tp group.
// Overlap (MoeParallel::overlap): the owned rows are split into two micro-batches; both
// dispatches start non-blocking (comm::all_to_all_v_start), micro-batch 1's experts run while
// micro-batch 2's rows are in flight, and 1's combine is in flight while 2 computes. Each token's
// arithmetic is the same as without overlap (only the BLAS batch of its expert GEMMs differs, so
// the two agree to BLAS rounding, bit for bit under inference.batch_invariant).
//
// Invariants: collective over tp and ep; every rank calls it for every MoE layer, also with
// n_tok = 0, and every rank of an ep group passes the same `overlap`. y equals moe_forward on one
// rank with the whole weights on the same x up to fp32 rounding (the sum over slots is regrouped
// by rank). The dispatched payload is the analytic minimum: Σ over owned tokens of the number of
// distinct ep ranks hosting its kept experts, × payload width × 4 bytes.
#pragma once

#include <cstdint>
#include <vector>

#include "hymoe/backend/ctx.h"
#include "hymoe/model/config.h"
#include "hymoe/model/ffn.h"
#include "hymoe/model/lora_views.h"
#include "hymoe/model/moe_views.h"
#include "hymoe/parallel/comm.h"
#include "hymoe/tensor/tensor.h"

namespace hymoe::model {

// The communicators the MoE layer uses, and how it runs over them. A null comm stands for a group
// of one.
struct MoeParallel {
    const comm::Comm* tp = nullptr;  // tokens replicated across it
    const comm::Comm* ep = nullptr;  // ranks with the same etp rank, edp and pp; ep rank = position
    int etp = 1;                     // etp size (divides the tp size)
    bool overlap = false;            // two micro-batches, one dispatching while the other computes
    bool fused = true;  // fused kernels where moe_runs_fused allows (DeviceModelOptions::fused)
    bool fused_load = true;  // fused: stats get the expert load (one download, which waits for the
                             //   stream); false keeps the layer free of host waits (decode graphs)
};

// Summed over calls, for profiles and benches. Seconds are the time each phase kept this rank
// busy or waiting: under overlap, communication hidden behind compute is not counted.
struct MoeCommStats {
    int64_t calls = 0;
    int64_t dispatch_rows = 0;    // token rows sent (this rank as owner, self included)
    int64_t dispatch_bytes = 0;   // their payload (not the metadata): the rows; the backward
                                  //   sends each row with its output gradient (2×)
    int64_t combine_bytes = 0;    // the rows returned to this rank as owner (self included): the
                                  //   partials; the backward adds each slot's dw (top_k floats)
    int64_t self_rows = 0;        // of dispatch_rows, those to this rank itself (no link used)
    double route_seconds = 0;     // router (+ fc1 for latent_moe) on the owned rows
    double dispatch_seconds = 0;  // layout, count and metadata exchange, payload all-to-all
    double compute_seconds = 0;   // hosted experts on the received rows
    double combine_seconds = 0;   // reverse all-to-all and the owner's sum (+ fc2)
    double shared_seconds = 0;    // shared experts (tp slice, every row)
    double reduce_seconds = 0;    // the tp all-reduce of y
    std::vector<int64_t> tokens_per_expert;  // [E] assignments computed by THIS rank's experts
    void add(const MoeCommStats& other);     // this += other, field by field
};

// The rows [begin, begin + count) of n_tok that the etp block of tp rank `tp_rank` owns: chunk
// b = tp_rank / etp of tp/etp near-equal contiguous chunks (the first n_tok mod (tp/etp) chunks
// one row longer).
struct RowRange {
    int64_t begin = 0, count = 0;
};
RowRange moe_owned_rows(int64_t n_tok, int tp_rank, int tp, int etp);

// y [n_tok, d] = the full MoE output (routed + shared), identical on every rank of the tp group,
// equal to moe_forward (one rank, whole weights) on the same x up to fp32 rounding. cfg is the
// whole model's config (widths are read from the local weights' shapes). y must not alias x.
// rows (null: adapter 0 everywhere) names each token's LoRA adapter, as moe_forward's; a token's
// adapter travels with its expert ids (4 bytes a dispatched row).
void moe_forward_parallel(const ModelConfig& cfg,
                          const LayerSpec& spec,
                          const MoeWeights& local,
                          const Tensor& x /*[n_tok, d]*/,
                          Tensor& y /*[n_tok, d]*/,
                          const MoeParallel& par,
                          MoeCommStats* stats = nullptr,
                          const SeqBatch* rows = nullptr,
                          Routing* routing_out = nullptr);  // the owned rows' routing

// The same on ctx's device, the one MoE forward of both backends (the overload above is this one
// on a CPU context with moe_views(local)): x [n_tok, d] and y [n_tok, d] f32 and the weights'
// views on ctx's device, the experts' inputs cast to local.act. Router logits by
// ops::router_logits on the device, brought to the host and routed there (router.h: scores,
// groups, top-k, weights, capacity), so the expert choice is the CPU's given the logits; the
// pipeline's rows move on the device (device tensors over NCCL, blocking: each all-to-all waits
// for ctx's stream first and returns complete, so `overlap` changes the order of the work, not
// what overlaps). lora_rows (null: none) are the step's rows per adapter for the shared experts'
// factor-view adapters (model/lora_views.h). Where moe_runs_fused holds (a CUDA context, groups of
// one, bf16 SwiGLU dropless layers) it runs the fused kernels instead, routing on the device.
void moe_forward_parallel(const backend::Ctx& ctx,
                          const ModelConfig& cfg,
                          const LayerSpec& spec,
                          const MoeWeightViews& local,
                          const Tensor& x /*[n_tok, d]*/,
                          Tensor& y /*[n_tok, d]*/,
                          const MoeParallel& par,
                          MoeCommStats* stats = nullptr,
                          const SeqBatch* rows = nullptr,
                          Routing* routing_out = nullptr,
                          const std::vector<LoraRowsView>* lora_rows = nullptr);

// Whether moe_forward_parallel runs layer `spec` on n_tok rows in the fused kernels
// (backend/ops_moe_fused.h: routing, dispatch plan, grouped SwiGLU experts and combine on the
// device, no host round trip) rather than the generic path above: a CUDA context (`device`),
// par.fused, groups of one (par.tp and par.ep null), no routed-expert adapters in use
// (expert_adapters), and a layer the kernels take (ops::moe_fused_supported: experts' inputs act
// bf16, SwiGLU, dropless, E ≤ 1024, widths they tile). The GPU decode graphs' planner asks the same
// (model/decode_graph_plan.h). Fused, y is the one-rank moe_forward up to the kernels' bf16
// rounding (h and the experts' outputs in bf16); stats get calls and, with par.fused_load, the
// expert load only.
bool moe_runs_fused(Device device,
                    const ModelConfig& cfg,
                    const LayerSpec& spec,
                    DType act,
                    int64_t n_tok,
                    const MoeParallel& par,
                    bool expert_adapters);

// The backward of moe_forward_parallel: dx [n_tok, d] (identical on the tp group) from dy [n_tok,
// d] (identical on the tp group), equal to moe_backward (one rank, whole weights) up to fp32
// rounding. Same layout, same collectives and the same ownership and routing as the forward
// (recomputed and held constant, capacity drops per etp block included); the same pipeline
// (moe_dispatch.h) carries, per owned token and distinct ep rank, the row u and its output
// gradient g (u = x, g = dy; latent_moe: u = fc1 x, g = dy fc2) side by side, 2× the forward's
// dispatch payload, and brings back the row's input-gradient partial and the gradient dw of each
// slot hosted there, (w + top_k)/w × the forward's combine. The expert side recomputes its
// experts' forward on u (each expert once on its received rows, grouped as the forward groups
// them) and runs their backward for w_i · g. With etp > 1 both results are partials over the
// rank's slice of I: the owner runs the router's backward (linear in dw) on its partial dw, so
// the one tp all-reduce of dx sums the etp partials of the routed part, the router's and fc1's
// backward, the shared experts' tp partials, and places every block's rows. No extra collective.
// Adapters accumulate (+=) into this rank's local factors, with no reduction: the gradient of
// the rows this rank computed, i.e. a routed expert's over the tokens its ep group sent it (a
// slice's partial over I for factors whole across etp), a shared expert's over every row of the
// tp group (a tp partial for factors whole across tp). Summed over the groups that hold copies
// (runtime/lora_grads.h: shared experts tp and dp, routed experts etp and edp, and ep for one
// adapter shared by the experts) they give the one-rank gradient over every replica's tokens,
// each token counted once. Adapter dropout is deterministic (lora.h: a mask row is keyed by its
// row in the call) and the backward draws the forward's masks (same layout and `overlap`), but the
// masks depend on the layout: an expert's rows are numbered in received order (source rank, then
// token, per micro-batch), and a factor cut along its input draws only its slice's columns; so they
// equal one rank's only at tp = ep = etp = 1 without overlap. Stats: route_seconds also counts the
// router's and fc1's backward; combine_bytes the returned rows with their dw.
void moe_backward_parallel(const ModelConfig& cfg,
                           const LayerSpec& spec,
                           const MoeWeights& local,
                           const Tensor& x /*[n_tok, d]*/,
                           const Tensor& dy /*[n_tok, d]*/,
                           Tensor& dx /*[n_tok, d]*/,
                           const MoeParallel& par,
                           MoeCommStats* stats = nullptr);

// The same on ctx's device, the one MoE backward of both backends (the overload above is this one
// on a CPU context with moe_views(local)): x, dy, dx [n_tok, d] and the weights' views f32 on
// ctx's device (local.act f32). The routing is the forward's Ctx path's (logits by
// ops::router_logits, routed on the host); the dispatch's [u | g] rows and the returned
// [d_u | dw] rows move on the device; the experts' recompute and backward run grouped
// (ops_moe.h, ops_moe_backward.h); each owned token's slot gradients dw come to the host for the
// placement, then the router's backward (ops::router_scores_backward) runs on the device. rows
// (null: adapter 0 everywhere) names each token's adapter for the routed experts' adapters, as
// the forward's; lora_rows (null: none) are the step's rows per adapter for the shared experts'
// factor-view adapters. Adapters: host slots (a CPU context) and factor views with gradient views
// (model/lora_views.h) on the shared and the routed experts, accumulated (+=) as above.
void moe_backward_parallel(const backend::Ctx& ctx,
                           const ModelConfig& cfg,
                           const LayerSpec& spec,
                           const MoeWeightViews& local,
                           const Tensor& x /*[n_tok, d]*/,
                           const Tensor& dy /*[n_tok, d]*/,
                           Tensor& dx /*[n_tok, d]*/,
                           const MoeParallel& par,
                           MoeCommStats* stats = nullptr,
                           const SeqBatch* rows = nullptr,
                           const std::vector<LoraRowsView>* lora_rows = nullptr);

}  // namespace hymoe::model
