// The request stream of an infer job (private to src/runtime): the dataset's requests as a
// RequestSource, with on_bad_request, array shards, resume and the dealing to dp replicas.
#pragma once

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hymoe/core/error.h"
#include "hymoe/core/log.h"
#include "hymoe/io/image.h"
#include "hymoe/io/requests.h"
#include "hymoe/model/vision.h"
#include "hymoe/runtime/engine.h"
#include "hymoe/runtime/results.h"
#include "hymoe/text/tokenizer.h"

namespace hymoe::runtime {

// The JSONL requests as a RequestSource: counts request lines (index), applies on_bad_request,
// skips the requests a journal already holds (their lines must match), and deals the rest to the
// dp replicas: each request goes to the replica with the fewest tokens dealt so far (prompt +
// max_new_tokens; ties to the lower replica). Every rank reads the whole file and deals alike,
// and keeps its own replica's requests. A request's images are read by the ranks of the replica
// it is dealt to (every stage, so that all of them agree on a bad one): an unreadable or
// oversized image, or a count of placeholder tokens other than its images' tokens, makes it a bad
// request. Text and chat requests are encoded by the deck's tokenizer (chat messages rendered by
// tokenizer.chat's template first). A request with n samples becomes n Pendings (sample 0 .. n − 1)
// dealt together; on a resume only the samples the journal lacks run again. A request counts as
// finished when the last of its samples does (finish_sample).
struct Stream {
    const Job& job;
    const std::vector<DoneRequest>& done;
    const text::Tokenizer* tokenizer;  // null: the deck has no tokenizer
    std::unique_ptr<io::RequestReader> reader;
    int replica;
    std::vector<int64_t> dealt;  // [dp] tokens dealt to each replica
    int64_t index = -1, read = 0, skipped = 0, resumed = 0;
    bool on_gpu = false;  // per-request sampling settings are bad requests there
    size_t next_done = 0;
    std::deque<Pending> samples;  // the samples of the request read last still to hand out
    std::map<int64_t, int64_t> samples_left;  // request index -> its samples still running

    Stream(const Job& j, const std::vector<DoneRequest>& d, int dp_rank, const text::Tokenizer* tok)
        : job(j),
          done(d),
          tokenizer(tok),
          reader(io::open_requests(j.deck.inference.dataset)),
          replica(dp_rank),
          dealt(static_cast<size_t>(j.layout.dp), 0) {}

    bool mine(const io::Request& r, int64_t n_samples) {
        const auto least = std::min_element(dealt.begin(), dealt.end());
        const int64_t max_new =
            r.max_new_tokens >= 0 ? r.max_new_tokens : job.deck.inference.max_new_tokens;
        *least += n_samples * (static_cast<int64_t>(r.tokens.size()) + max_new);
        return least - dealt.begin() == replica;
    }

    void bad(const Error& e) {
        if (job.deck.inference.on_bad_request == "fail")
            throw e;
        log::warn(cat(e.what(), " (skipped)"));
        ++skipped;
    }
    // What the request does not give comes from the deck's inference.sampling.
    void inherit_sampling(io::Request& r) const {
        const auto& in = job.deck.inference;
        if (!r.has_stop)
            r.stop = in.stop;
        if (!r.has_stop_token_ids)
            r.stop_token_ids = in.stop_token_ids;
        if (!r.has_n)
            r.n = in.n;
    }
    std::string encode(io::Request& r) const {  // text or messages -> tokens; "" if done
        if (!r.tokens.empty())
            return "";
        if (!tokenizer)
            return "a text or chat request needs a tokenizer (deck key tokenizer.path)";
        try {
            const std::string s =
                r.messages.empty()
                    ? r.text
                    : text::render_chat(job.deck.tokenizer.chat_template, r.messages);
            for (int32_t id : tokenizer->encode(s))
                r.tokens.push_back(id);
        } catch (const Error& e) {
            return e.what();
        }
        return r.tokens.empty() ? "the prompt encodes to no tokens" : "";
    }
    std::string check(const io::Request& r) const {  // "" if the request can run
        for (int64_t t : r.tokens)
            if (t >= job.model.vocab_size)
                return cat("token id ",
                           t,
                           " is outside the vocabulary (",
                           job.model.vocab_size,
                           " tokens)");
        for (int64_t t : r.stop_token_ids)
            if (t >= job.model.vocab_size)
                return cat("\"stop_token_ids\" holds ",
                           t,
                           ", outside the vocabulary (",
                           job.model.vocab_size,
                           " tokens)");
        if (!r.stop.empty() && tokenizer == nullptr)
            return "\"stop\" strings need a tokenizer (deck key tokenizer.path)";
        if (!r.adapter.empty() && !job.deck.inference.adapters.count(r.adapter))
            return "adapter '" + r.adapter + "' is not one of inference.adapters";
        // the GPU reduces a step's rows to the deck's top-k before drawing (runtime/engine.h)
        if (on_gpu &&
            (r.temperature >= 0 || r.top_k >= 0 || r.top_p >= 0 || r.seed >= 0 || r.min_p ||
             r.presence_penalty || r.frequency_penalty || r.repetition_penalty))
            return "per-request sampling settings (temperature, top_p, top_k, min_p, seed, "
                   "penalties) run on the CPU backend only, not with job.device: cuda yet";
        return "";
    }
    // r's images decoded, resized and normalised into out; false when r was a bad request
    // (skipped; with on_bad_request: fail the error is thrown).
    bool load_images(const io::Request& r, std::vector<io::Image>& out) {
        if (r.images.empty())
            return true;
        const model::VisionConfig& v = job.model.vision;
        const auto& in = job.deck.inference;
        const std::string where = cat(in.dataset, ":", r.line, ": request ", r.id, ": ");
        try {
            if (!v.present)
                HYMOE_FAIL(Exit::bad_input, where, "the model has no vision tower for its images");
            const io::ImageOptions o{
                v.patch_size, v.merge * in.image_pool, in.image_max_patches, in.image_max_pixels};
            int64_t tokens = 0;
            for (const std::string& f : r.images) {
                try {
                    out.push_back(io::load_image(f, o));
                } catch (const Error& e) {
                    HYMOE_FAIL(e.code(), where, e.what());
                }
                tokens +=
                    model::vision_tokens(v, out.back().grid_h, out.back().grid_w, in.image_pool);
            }
            const auto placeholders =
                std::count(r.tokens.begin(), r.tokens.end(), v.media_token_id);
            if (placeholders != tokens)
                HYMOE_FAIL(Exit::bad_input,
                           where,
                           placeholders,
                           " media placeholder tokens (id ",
                           v.media_token_id,
                           ") but its ",
                           r.images.size(),
                           " image(s) make ",
                           tokens,
                           " image tokens");
        } catch (const Error& e) {
            bad(e);
            return false;
        }
        return true;
    }
    std::string changed(const DoneRequest& d) const {  // the dataset is not the journal's
        return cat(job.deck.inference.dataset,
                   " changed since the interrupted run (request ",
                   d.index,
                   " of ",
                   job.deck.job.output,
                   "/results.parts is not where it was); remove that folder to start afresh");
    }
    bool in_shard() const {  // array jobs: this shard's share of the request indexes
        return index % job.deck.inference.shards == job.deck.inference.shard;
    }
    // Called as each sample of a request handed out finishes: true for its request's last one.
    bool finish_sample(int64_t request_index) {
        const auto it = samples_left.find(request_index);
        HYMOE_CHECK(it != samples_left.end(), "request ", request_index, " was not handed out");
        if (--it->second > 0)
            return false;
        samples_left.erase(it);
        return true;
    }
    bool next(Pending& p) {
        if (!samples.empty()) {
            p = std::move(samples.front());
            samples.pop_front();
            return true;
        }
        for (io::Request r;;) {
            try {
                if (!reader->next(r))
                    break;
            } catch (const Error& e) {
                ++index;
                if (in_shard())
                    bad(e);
                continue;
            }
            ++index;
            if (!in_shard())
                continue;
            inherit_sampling(r);
            std::string why = encode(r);
            if (why.empty())
                why = check(r);
            if (!why.empty()) {
                try {
                    HYMOE_FAIL(Exit::bad_input, job.deck.inference.dataset, ":", r.line, ": ", why);
                } catch (const Error& e) {
                    bad(e);
                }
                continue;
            }
            std::vector<bool> have(static_cast<size_t>(r.n), false);  // samples done before
            int64_t n_have = 0;
            for (; next_done < done.size() && done[next_done].index == index; ++next_done) {
                const DoneRequest& d = done[next_done];
                if (d.line != r.line || d.id != r.id || d.sample >= r.n ||
                    d.prompt_len != static_cast<int64_t>(r.tokens.size()))
                    HYMOE_FAIL(Exit::bad_input, changed(d));
                n_have += !have[static_cast<size_t>(d.sample)];
                have[static_cast<size_t>(d.sample)] = true;
            }
            if (n_have == r.n) {
                ++resumed;
                continue;
            }
            if (!mine(r, r.n - n_have))
                continue;
            std::vector<io::Image> images;
            if (!load_images(r, images))
                continue;
            ++read;
            samples_left[index] = r.n - n_have;
            for (int j = 0; j < r.n; ++j)
                if (!have[static_cast<size_t>(j)])
                    samples.push_back(Pending{index, j, r, images});
            p = std::move(samples.front());
            samples.pop_front();
            return true;
        }
        if (next_done < done.size())
            HYMOE_FAIL(Exit::bad_input, changed(done[next_done]));
        return false;
    }
};

}  // namespace hymoe::runtime
