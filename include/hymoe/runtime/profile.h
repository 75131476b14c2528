// The profile of an inference run: wall seconds per layer in the mixer (KDA or MLA/DSA, with the
// DSA indexer's share) and the FFN (dense or MoE) and the part of them spent in GEMMs, summed over
// every forward step and averaged over the tp·dp ranks of the layer's pipeline stage
// (profile.layers); and the expert load of every MoE layer: assignments per expert and per rank,
// with the imbalance max/mean over the ranks of its stage, and under tp/ep the dispatch and combine
// seconds (profile.experts). Shown as tables in the log (LAMMPS-style) and written to profile.h5.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hymoe/model/model.h"
#include "hymoe/parallel/comms.h"
#include "hymoe/runtime/job.h"
#include "hymoe/runtime/memory.h"

namespace hymoe::runtime {

// This machine's references, measured when the engine has finished (so the probe does not count
// in the memory report): the sgemm rate on 512³ with the run's threads and the read rate over
// 256 MiB, best of 3.
struct Peaks {
    double gemm_gflops = 0, read_gb_s = 0;
};
Peaks measure_peaks();

// A rank's cache memory per layer at its most [n_layer] (0: not this rank's, or not that mixer):
// MLA/DSA layers the KV pages in use × the layer's bytes a page (rows in kv_dtype); KDA layers
// the sequences running × one sequence's state and conv tails.
struct LayerMemory {
    std::vector<int64_t> kv_bytes, kda_state_bytes;
};
LayerMemory layer_memory(
    const model::Model& m, int page_tokens, DType kv_dtype, int64_t peak_pages, int64_t peak_seqs);

struct JobProfile {
    model::ForwardStats mean;                // per-layer seconds, mean over the stage's ranks
    Peaks peaks;                             // rank 0's
    std::vector<float> gflops, weight_gb_s;  // [n_layer] GEMM FLOP/s; the layer's weight bytes
                                             //   once per step, per second (an upper bound for
                                             //   MoE layers: untouched experts are not read)
    std::vector<std::string> bound;          // [n_layer] "compute", "memory" or "comm": the GEMM
                                             //   FLOPs per weight byte against the peaks' ratio;
                                             //   comm when an MoE layer's dispatch + combine
                                             //   take over half its time
    std::vector<int64_t> tokens_per_expert;  // [n_layer, E] assignments computed (0: not MoE)
    std::vector<int64_t> tokens_per_rank;    // [n_layer, world] assignments each rank computed
    std::vector<float> imbalance;            // [n_layer] max/mean of the assignments computed
                                             //   by the ranks of the layer's stage
    std::vector<float> dispatch_seconds, combine_seconds;  // [n_layer] mean over ranks
    std::vector<int64_t> remote_bytes;  // [n_layer] dispatch + combine payload sent to other
                                        //   ranks, all ranks together (runtime/plan.h's ep bytes)
    std::vector<float> rank_layer_seconds;  // [world, 4, n_layer] each rank's own mixer, ffn,
                                            //   dispatch, combine seconds (0: another stage's)
    std::vector<float> rank_seconds;        // [world, 4] each rank's head, indexer, other
                                            //   attention and pipeline seconds
    model::VisionStats vision;  // the vision encoder over the whole run: images, patches, tokens,
                                //   FLOPs and seconds summed over the dp replicas (each counted
                                //   once, not per tp rank), the largest call's activations
    int64_t vision_weight_bytes = 0;  // the tower + projector held by one first-stage rank
    LayerMemory memory;               // the most over the ranks holding each layer
};

// Every rank's stats combined; collective over the world.
JobProfile gather_profile(const Job& job,
                          const parallel::Grid& grid,
                          model::Model& m,
                          const model::ForwardStats& mine,
                          const Peaks& peaks,
                          const LayerMemory& memory);

// The log tables: one row per layer (mixer, seconds, FFN, seconds, share of the layer total,
// GEMM share of the layer's seconds, GFLOP/s, weight GB/s, bound, KV and KDA state MB),
// then, when the model has MoE layers, one per MoE layer (assignments, imbalance, dispatch and
// combine seconds).
std::string profile_table(const model::ModelConfig& cfg, const JobProfile& p);

// profile.h5 (atomic): /meta, /layers/{mixer,ffn} [n_layer] str, /layers/{mixer,ffn}_seconds
// [n_layer], /layers/gemm_seconds [n_layer] (of the mixer + FFN seconds, those inside
// ops::gemm), /attention/{indexer,other}_seconds, /head_seconds, /pipeline_seconds (waiting for
// the previous stage's activations) (seconds, f32, attr unit "s");
// with MoE layers /experts/tokens_per_expert [n_layer, E], /experts/tokens_per_rank
// [n_layer, world], /experts/remote_bytes [n_layer] (i64), /experts/imbalance,
// /experts/dispatch_seconds, /experts/combine_seconds [n_layer] (f32; rows of dense layers are 0).
// With a vision tower: /vision/{seconds, images, patches, tokens, gflop, activation_bytes,
// weight_bytes} (one value each; seconds and counts summed over dp replicas).
// Also /layers/kv_bytes and /layers/kda_state_bytes [n_layer] (i64, the most at once on the rank
// holding the layer; LayerMemory), /memory/ranks [world, 10] (bytes, f32; attr columns:
// runtime/memory.h);
// every rank's own seconds, not averaged: /ranks/layer_seconds [world, 4, n_layer] and
// /ranks/seconds [world, 4] (f32, attr columns).
void write_profile(const Job& job,
                   const parallel::Grid& grid,
                   const JobProfile& p,
                   const RankMemory& memory);

}  // namespace hymoe::runtime
