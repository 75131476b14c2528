// Prefix caching for infer jobs (inference.prefix_cache), per engine lane: prompts that start with
// the same tokens (a shared system prompt, earlier turns of a chat) prefill the shared part once.
// The model is hybrid, so a cached prefix of n tokens is two things: the full KV pages of its
// MLA/DSA layers (shared by reference in the lane's KvPool, never copied and never written again:
// n is a multiple of page_tokens), and a snapshot of every KDA layer's state and conv tails after
// token n (vLLM does the same for Mamba layers). Keys are vLLM's block hashes: a hash chain over
// the prompt's whole blocks of page_tokens tokens, seeded by the request's adapter name (another
// adapter gives other states); an entry keeps its tokens too, so a hash collision never restores
// the wrong prefix. Requests with images are never cached (their placeholder tokens do not say
// which image they stand for).
// Where snapshots are taken: a KDA state exists only at the positions the prefill stopped at, so
// the lane stops a prompt's prefill at its snapshot point, the longest boundary inside the prefix
// it shares with one of the last `recent` prompts (a branch point of the prompt tree), and stores
// it there. The first prompt of a family is prefilled whole; the second stores the shared prefix;
// every later one restores it. A request always prefills at least its last prompt token (its
// logits give the first output token).
// Boundaries (prefix_boundary): multiples of page_tokens where the uncached run's prefill call may
// be cut in two without changing its rows' KDA chunks, attention query blocks or forms; the lane
// keeps every other call boundary where the uncached run has it (multiples of prefill_chunk).
// Under inference.batch_invariant (GEMM rows independent of the call's row count) the results are
// then bit-identical with the cache on and off.
// Memory: an entry's pages count in the pool (the lane evicts least recently used entries before
// it preempts a sequence); its KDA snapshots and tokens count against max_bytes.
// With a device model (model/device_model.h) the KDA states are the device's: a snapshot is its
// copy of them into host memory (DeviceModel::save_kda_states, the sequence's host states not
// read) and a restore copies it back (load_kda_states); the pages are shared in the pool as on
// the host.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <unordered_map>
#include <vector>

#include "hymoe/model/device_model.h"
#include "hymoe/model/kv_cache.h"
#include "hymoe/model/model.h"

namespace hymoe::runtime {

// Whether a prompt of prompt_len tokens may stop its prefill after token n and go on from a stored
// state with every row's arithmetic unchanged: 0 < n < prompt_len, n a multiple of page_tokens,
// and n starts a prefill call of the uncached run (n mod prefill_chunk = 0) or lies inside one at
// a multiple of model::kPrefillAlign with at least 2 of that call's tokens after it (a call of one
// token takes the recurrent KDA and absorbed attention forms instead of the chunked ones).
bool prefix_boundary(int64_t n, int64_t prompt_len, int page_tokens, int prefill_chunk);

// The hash chain of a prompt's whole blocks: out[i] covers tokens [0, (i+1)·block), chained from
// a seed that hashes the adapter name. Equal chains at i mean equal blocks 0..i (up to a 64-bit
// collision, which the cache checks against the stored tokens).
std::vector<uint64_t> block_hashes(const std::string& adapter,
                                   const std::vector<int64_t>& tokens,
                                   int block);

struct PrefixCacheStats {
    int64_t stored = 0, evicted = 0;    // entries made, dropped (for room or max_bytes)
    int64_t entries = 0;                // entries held now
    int64_t bytes = 0, peak_bytes = 0;  // KDA snapshots + tokens held now, at most
    int64_t pages = 0;                  // KV pages the entries hold now (shared or not)
};

class PrefixCache {
public:
    // Entries share pages of `pool` (which must outlive the cache) and keep at most max_bytes of
    // snapshots; branch points are looked for among the last `recent` prompts. device (null:
    // none): the model whose sequences the cache stores and restores (it must outlive the cache).
    PrefixCache(model::KvPool& pool,
                int prefill_chunk,
                int64_t max_bytes,
                int recent = 256,
                model::DeviceModel* device = nullptr);
    ~PrefixCache();
    PrefixCache(const PrefixCache&) = delete;
    PrefixCache& operator=(const PrefixCache&) = delete;

    // The longest cached prefix of the prompt shorter than the prompt (hashes: block_hashes of
    // adapter and tokens): its pages shared into the fresh state s (no tokens yet, paged into the
    // pool), its KDA states copied, s and its attention caches advanced to its length, which is
    // returned (0: none, s unchanged). The entry becomes the most recently used.
    int64_t restore(const std::string& adapter,
                    const std::vector<int64_t>& tokens,
                    const std::vector<uint64_t>& hashes,
                    model::SequenceState& s);
    // Where the prompt's state is to be stored: the longest boundary ≤ the prefix it shares with a
    // recent prompt, past `restored` and shorter than the prompt, with no entry yet; 0: none. Then
    // counts the prompt among the recent ones.
    int64_t snapshot_point(const std::vector<int64_t>& tokens,
                           const std::vector<uint64_t>& hashes,
                           int64_t restored);
    // Stores s, which holds exactly the first n tokens of the prompt (n from snapshot_point):
    // references to its first n / page_tokens pages and copies of its KDA states. Nothing when an
    // entry for them exists or the snapshot alone exceeds max_bytes; least recently used entries
    // go to make room.
    void store(const std::string& adapter,
               const std::vector<int64_t>& tokens,
               const std::vector<uint64_t>& hashes,
               int64_t n,
               const model::SequenceState& s);
    // Drops the least recently used entry (its page references released); for_pages: the least
    // recently used of those that free a page (hold one no sequence holds). False when none.
    bool evict_one(bool for_pages = false);
    const PrefixCacheStats& stats() const { return stats_; }

private:
    struct Entry {
        std::string adapter;
        std::vector<int64_t> tokens;       // [n] the prefix
        std::vector<int32_t> pages;        // [n / page_tokens] references in the pool
        std::vector<model::KdaState> kda;  // [n_layer] the KDA layers' states after token n (no
                                           //   device)
        Buffer device_kda;                 // with a device: its copy of them (save_kda_states)
        int64_t bytes = 0;                 // snapshots + tokens
        uint64_t used = 0;                 // last use (LRU)
    };
    void drop(std::unordered_map<uint64_t, Entry>::iterator it);

    model::KvPool& pool_;
    model::DeviceModel* device_;
    int prefill_chunk_;
    int64_t max_bytes_;
    size_t recent_cap_;
    uint64_t clock_ = 0;
    std::unordered_map<uint64_t, Entry> entries_;  // by the hash of the prefix's last block
    std::deque<std::vector<uint64_t>> recent_;     // the last prompts' hash chains
    std::unordered_map<uint64_t, int> seen_;       // hash → recent prompts holding it
    PrefixCacheStats stats_;
};

}  // namespace hymoe::runtime
