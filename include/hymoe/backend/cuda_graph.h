// Decode steps replayed as CUDA graphs (issue 13). At small batches a decode step's hundreds of
// launches cost more on the host than their kernels on the GPU; captured once per batch bucket
// and replayed, a step is one launch. DecodeBuckets (plain C++, every build,
// src/backend/decode_buckets.cpp) picks a batch's bucket: the smallest bucket size ≥ the batch,
// the step running padded to it. DecodeGraphs (CUDA builds, src/backend/cuda/decode_graph.cu)
// captures the caller's step for a bucket on its first use and replays it after; when the
// step's inputs move (new buffers), refresh() re-captures every captured bucket and updates its
// executable graph in place (cudaGraphExecUpdate), re-instantiating only where CUDA refuses.
// The step must be capture-safe: kernels, cuBLAS calls and device copies on the given stream
// only, every buffer allocated beforehand, no synchronisation; run it once eagerly first, so
// that one-time setup (kernel attributes, cuBLAS state) happens outside the capture.
#pragma once

#include <functional>
#include <vector>

#include "hymoe/backend/cuda_arena.h"

struct CUgraphExec_st;  // = cudaGraphExec_t's pointee

namespace hymoe::backend::cuda {

class DecodeBuckets {
public:
    // Powers of two below max_batch, then max_batch: 1, 2, 4, ..., 64, 100 for 100.
    explicit DecodeBuckets(int max_batch);
    // Given sizes, each ≥ 1 (sorted and deduplicated here).
    explicit DecodeBuckets(std::vector<int> sizes);
    // The smallest bucket ≥ n, for 1 ≤ n ≤ max(): its index and its size.
    int index_for(int n) const;
    int bucket_for(int n) const { return sizes_[static_cast<size_t>(index_for(n))]; }
    int padding(int n) const { return bucket_for(n) - n; }  // rows a batch of n runs padded with
    int count() const { return static_cast<int>(sizes_.size()); }
    int max() const { return sizes_.back(); }
    const std::vector<int>& sizes() const { return sizes_; }

private:
    std::vector<int> sizes_;  // ascending
};

class DecodeGraphs {
public:
    // step(s, bucket): queue one decode step for `bucket` sequences on s.
    using Step = std::function<void(const Stream& s, int bucket)>;
    DecodeGraphs(DecodeBuckets buckets, Step step);
    ~DecodeGraphs();
    DecodeGraphs(const DecodeGraphs&) = delete;
    DecodeGraphs& operator=(const DecodeGraphs&) = delete;

    // Queues the step for a batch of n on s: the graph of bucket_for(n), captured on first use.
    // Returns that bucket size.
    int run(const Stream& s, int n);
    // Re-captures every captured bucket from the step as it is now.
    void refresh(const Stream& s);

    const DecodeBuckets& buckets() const { return buckets_; }
    int captured() const;                                   // buckets with a graph
    int updated() const { return updated_; }                // refreshes done in place
    int reinstantiated() const { return reinstantiated_; }  // refreshes that rebuilt a graph

private:
    CUgraphExec_st* capture(const Stream& s, int bucket, CUgraphExec_st* update);

    DecodeBuckets buckets_;
    Step step_;
    std::vector<CUgraphExec_st*> exec_;  // [count] null until captured
    int updated_ = 0, reinstantiated_ = 0;
};

}  // namespace hymoe::backend::cuda
