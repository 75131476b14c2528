// results.h5 of an infer job, streamed and resumable, from one or several writers (dp replicas).
//
// On-disk state while the job runs: out/results.parts/, a journal of finished requests.
//   - Each dp replica has one writer rank (tp rank 0 of its last stage); writer w of W numbers
//     its segments w, w + W, w + 2W, ... above every segment already there, so names never clash.
//   - Finished requests are buffered and written as one segment, seg-NNNNNN.h5, every
//     `flush_every` requests (the infer job: 4 × max_seqs, within 8..4096) or `flush_seconds`
//     seconds, whichever comes first. Each segment is a
//     complete HDF5 file written as seg-NNNNNN.h5.partial and renamed (io::H5Writer), so a
//     kill -9 loses at most the buffered requests and never leaves a torn segment under the real
//     name; a leftover *.partial is deleted on the next start.
//   - A segment holds its rows (one per request and sample) sorted by (index, sample):
//     /deck_sha256 (of the resolved deck, so a --set that changes the results also starts
//     afresh), /deck_resolved (the resolved deck: a newer hymoe that resolves the same deck with
//     keys added still resumes, runtime/rerun.h), /index /sample /line /prompt_len
//     /n_out /greedy_token /stop_token [n] i64, /finish [n] i32, /greedy_logprob [n] f32, /id
//     /adapter /stop_string [n] strings, /text [n] strings with a tokenizer (set_tokenizer),
//     /tokens /logprobs [Σ n_out], /prompt_logprobs [Σ (prompt_len − 1)] when asked, /top_tokens
//     /top_logprobs [Σ n_out · K] with inference.logprobs = K.
// Resume: when results.parts/ exists and its segments carry this deck's sha256, their requests
// are done: the reader skips them (their line numbers must match, or the dataset changed and the
// job stops with Exit::bad_input), unfinished ones run again. A journal of another deck is
// removed. Requests are computed the same way whatever the batch (runtime/engine.h), so the
// final file equals an uninterrupted run's.
// World rank 0 prepares the folder (stale .partial files and another deck's journal removed)
// before any rank reads it. At the end, finish() waits for every writer and rank 0 merges the
// segments into results.h5 in file order (written as
// results.h5.partial and renamed), then removes results.parts/. Memory: 24 bytes per row (its
// index, sample and location) plus a few cached segments; results.h5 is appended in chunks.
//
// results.h5 (README "Outputs"), N = rows: one per sample (a request's "n", else 1) of every
// request read without error, in file order, then sample order:
//   /requests/id [N] str, /requests/index [N] (0-based request line, bad lines included),
//   /requests/sample [N] (0 .. n − 1),
//   /requests/line [N] (1-based line in the file), /requests/prompt_len [N],
//   /requests/output_offsets [N+1], /requests/output_tokens [Σ], /requests/output_logprobs [Σ],
//   /requests/finish_reason [N] str ("stop" | "length"), /requests/adapter [N] str ("" = base),
//   /requests/stop_string [N] str ("" none), /requests/stop_token [N] (−1 none),
//   /requests/done [N] u8 (all 1 in a finished file); with the deck's tokenizer also
//   /requests/output_text [N] str (the output tokens detokenised, U+FFFD for ill-formed bytes,
//   cut before the stop string);
//   with inference.prompt_logprobs also /requests/logprob_offsets [N+1],
//   /requests/prompt_logprobs [Σ (prompt_len − 1)] (token t+1 given 0..t),
//   /requests/greedy_token [N], /requests/greedy_logprob [N] (after the whole prompt); with
//   inference.logprobs = K > 0 also /requests/top_tokens, /requests/top_logprobs [Σ, K] (the K
//   most likely tokens at every output token, rows aligned with output_tokens); and /meta.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hymoe/io/meta.h"
#include "hymoe/parallel/comm.h"
#include "hymoe/runtime/engine.h"

namespace hymoe::text {
class Tokenizer;
}

namespace hymoe::runtime {

struct DoneRequest {
    int64_t index, line, prompt_len;
    std::string id;  // with line and prompt_len: how a resume recognises the same request
    int sample = 0;
};

// Who writes: every rank of `world` constructs and finishes the journal together.
struct JournalRanks {
    const comm::Comm& world;
    const comm::Comm& self;  // this rank alone: the files it writes
    int writer = 0;          // this rank's writer number; −1: it writes nothing (add() ignored)
    int n_writers = 1;
};

class ResultsJournal {
public:
    // Opens (resume) or starts out_dir/results.parts/ for this resolved deck.
    ResultsJournal(const std::string& out_dir,
                   const std::string& resolved_deck,
                   bool prompt_logprobs,
                   int top_logprobs,
                   const JournalRanks& ranks,
                   int flush_every = 256,
                   double flush_seconds = 10);
    // Requests finished by an earlier run, sorted by index.
    const std::vector<DoneRequest>& done() const { return done_; }
    // With a tokenizer, segments and results.h5 hold the generated text beside the tokens.
    void set_tokenizer(const text::Tokenizer* tok) { tokenizer_ = tok; }
    void add(Finished&& f);  // buffered; writes a segment when due
    void flush();            // write the buffer as one segment now
    // Flush, merge every segment into out_dir/results.h5 with meta, remove the journal.
    // Returns the number of requests in the file (on every rank).
    int64_t finish(const io::RunMeta& meta);

private:
    int64_t merge(const io::RunMeta& meta);  // rank 0: the segments into results.h5

    std::string dir_, parts_, resolved_, sha_;
    bool prompt_logprobs_;
    int top_n_;
    JournalRanks ranks_;
    int flush_every_;
    double flush_seconds_, last_flush_;
    int next_segment_ = 0;
    std::vector<DoneRequest> done_;
    std::vector<Finished> buffer_;
    const text::Tokenizer* tokenizer_ = nullptr;
};

// hymoe --gather: the results.h5 of every shard folder (array jobs: inference.shard of
// inference.shards) merged into out_dir/results.h5 in request-index order, /meta copied from the
// first shard plus /meta/gathered_from [shards]. Shards whose requests overlap, or a missing
// results.h5, are Exit::bad_input. Returns the number of requests; one process.
int64_t gather_results(const std::string& out_dir, const std::vector<std::string>& shard_dirs);

}  // namespace hymoe::runtime
