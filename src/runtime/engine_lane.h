// The engine's sequences and lanes (private to src/runtime/engine*.cpp). A lane is one running set
// with its own KV page pool: it builds its next step (decode rows, prefill chunks, admissions; see
// runtime/engine.h), reserving every row's pages first. When the pool runs out, the lane preempts
// its most recently admitted sequence not yet in the step (vLLM's recompute preemption): its
// pages go back to the pool and it restarts from its prompt later, before any new request. Its
// tokens come out the same, since they depend on the request alone (runtime/sampler.h).
// With a prefix cache (runtime/prefix_cache.h) a sequence starts from the longest cached prefix of
// its prompt, stops its prefill at its snapshot point to store its state there, and otherwise
// keeps the uncached run's chunk boundaries (multiples of prefill_chunk); the lane evicts cache
// entries before it preempts.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "hymoe/model/kv_cache.h"
#include "hymoe/model/model.h"
#include "hymoe/runtime/engine.h"
#include "hymoe/runtime/prefix_cache.h"

namespace hymoe::runtime {

struct Seq {
    Finished out;             // filled as the sequence runs; out.req holds the prompt
    int64_t max_new = 0;      // tokens to generate at most
    int64_t n_prefilled = 0;  // prompt tokens already in state
    int64_t next_token = -1;  // the last sampled token, fed by the next decode row
    std::string text;         // the output tokens' bytes so far, when the request has stop strings
    bool done = false;
    bool in_step = false;  // has a row in the step being built
    model::SequenceState state;
    std::vector<io::Image> images;  // decoded images still to encode (cleared once encoded)
    Buffer media;                   // [n_media, d] projected image tokens (first stage)
    bool cacheable = false;         // prefix cache on and no images
    bool looked_up = false;         // this admission looked the prompt up in the prefix cache
    std::vector<uint64_t> hashes;   // the prompt's block hashes (cacheable)
    int64_t reused = 0;             // prompt tokens restored from the prefix cache
    int64_t snapshot_at = 0;        // store the state after this many prompt tokens (0: never)
    int64_t prompt_len() const { return static_cast<int64_t>(out.req.tokens.size()); }
    bool decoding() const { return n_prefilled == prompt_len(); }
};

// One sequence's rows in a step's packed batch.
struct Row {
    Seq* seq;
    int64_t n;  // tokens in this step
};

// One forward step of a lane, in flight through the pipeline stages.
struct Step {
    int lane = 0;
    std::vector<Row> rows;
    std::vector<int64_t> tokens;  // [n_tok] packed as batch
    model::SeqBatch batch{{0}, {}, {}};
    std::vector<model::SequenceState*> states;  // [n_seq]
    bool all_rows = false;                      // logits of every row (prompt logprobs)
    model::MediaSplice media;                   // image tokens of its prefill rows (first stage)
};

// The request source with one request of look-ahead, shared by the lanes.
class RequestQueue {
public:
    explicit RequestQueue(const RequestSource& source) : source_(source) {}
    Pending* peek();  // the next request, null when there are no more
    void pop() { have_ = false; }
    bool exhausted() const { return exhausted_; }

private:
    const RequestSource& source_;
    Pending next_;
    bool have_ = false, exhausted_ = false;
};

class Lane {
public:
    Lane(const model::Model& m, const EngineOptions& o, int index, int max_seqs, int64_t pages);
    // The lane's next step; stats.preemptions counts the sequences it preempts.
    Step next_step(RequestQueue& queue, EngineStats& stats);
    // Finished sequences leave, in admission order, through sink; their pages are freed.
    void retire(const FinishedSink& sink, EngineStats& stats);
    bool empty() const { return running_.empty() && preempted_.empty(); }
    int64_t running() const { return static_cast<int64_t>(running_.size()); }
    int64_t pages_in_use() const { return pool_.capacity() - pool_.free_pages(); }
    int64_t kv_resident_bytes() const { return pool_.peak_resident_bytes(); }
    // The prefix cache's figures (zeros without one).
    PrefixCacheStats cache_stats() const { return cache_ ? cache_->stats() : PrefixCacheStats{}; }

private:
    // Where the pool's rows live: the device model's store, else o.kv_store.
    static model::KvStoreFactory store_factory(const EngineOptions& o);
    // A fresh state for s (the device model's when there is one), paged into this lane's pool.
    void reset_state(Seq& s);
    // s back to the start of its prompt: its pages (and restored prefix) released, its outputs
    // and counts dropped.
    void restart(Seq& s, EngineStats& stats);
    // Frees the latest admitted sequence not in the step (other than keep); false when none.
    bool preempt_one(const Seq* keep, EngineStats& stats);
    // s, fresh, starts from the longest cached prefix of its prompt; on its first admission
    // (first) its snapshot point is chosen.
    void restore_prefix(Seq& s, bool first, EngineStats& stats);
    // Tokens of s's next prefill chunk: up to the uncached run's next chunk boundary, its
    // snapshot point or its prompt's end, whichever comes first.
    int64_t chunk(const Seq& s) const;
    // First stage: the images of running sequences not yet encoded, packed into one encoder call.
    void encode_images();
    // First stage: st's placeholder rows and their image tokens.
    void splice_rows(Step& st) const;

    const model::Model& m_;
    const EngineOptions& o_;
    int index_, max_seqs_;
    model::KvPool pool_;
    std::unique_ptr<PrefixCache> cache_;          // null: no prefix caching (declared after pool_)
    std::vector<std::unique_ptr<Seq>> running_;   // in admission order
    std::deque<std::unique_ptr<Seq>> preempted_;  // to restart, oldest first; hold no pages
};

}  // namespace hymoe::runtime
