// A lane of the engine: admission, page reservation and preemption (src/runtime/engine_lane.h).
#include "engine_lane.h"

#include <algorithm>

#include "hymoe/core/error.h"

namespace hymoe::runtime {

Pending* RequestQueue::peek() {
    if (!have_ && !exhausted_)
        exhausted_ = !(have_ = source_(next_));
    return have_ ? &next_ : nullptr;
}

Lane::Lane(const model::Model& m, const EngineOptions& o, int index, int max_seqs, int64_t pages)
    : m_(m),
      o_(o),
      index_(index),
      max_seqs_(max_seqs),
      pool_(m.local, m.shard, o.page_tokens, pages, store_factory(o), o.kv_dtype) {
    if (o.prefix_cache_bytes > 0 && !o.prompt_logprobs)
        cache_ = std::make_unique<PrefixCache>(
            pool_, o.prefill_chunk, o.prefix_cache_bytes, 256, o.device);
}

model::KvStoreFactory Lane::store_factory(const EngineOptions& o) {
    if (o.device == nullptr || o.kv_store)
        return o.kv_store;
    return [device = o.device](const model::KvLayout& layout) { return device->kv_store(layout); };
}

void Lane::reset_state(Seq& s) {
    pool_.release(s.state.pages);
    s.state = o_.device ? o_.device->new_sequence() : model::make_sequence_state(m_);
    model::attach_kv_pool(m_, s.state, pool_);
}

void Lane::restart(Seq& s, EngineStats& stats) {
    reset_state(s);  // restarts from its prompt: its outputs are made again
    stats.prompt_tokens -= s.n_prefilled - s.reused;  // and counted again then
    stats.cached_tokens -= s.reused;
    stats.cache_lookups -= s.looked_up ? 1 : 0;
    stats.cache_hits -= s.reused > 0 ? 1 : 0;
    s.looked_up = false, s.reused = 0;
    stats.generated_tokens -= static_cast<int64_t>(s.out.tokens.size());
    Finished fresh;
    fresh.index = s.out.index, fresh.sample = s.out.sample;
    fresh.req = std::move(s.out.req);
    s.out = std::move(fresh);
    s.n_prefilled = 0, s.next_token = -1;
    s.text.clear();
}

bool Lane::preempt_one(const Seq* keep, EngineStats& stats) {
    for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
        Seq& s = **it;
        if (&s == keep || s.in_step)
            continue;
        restart(s, stats);
        preempted_.push_front(std::move(*it));
        running_.erase(std::next(it).base());
        ++stats.preemptions;
        return true;
    }
    return false;
}

void Lane::restore_prefix(Seq& s, bool first, EngineStats& stats) {
    if (!s.cacheable || s.looked_up)
        return;
    const io::Request& r = s.out.req;
    s.looked_up = true;
    s.reused = cache_->restore(r.adapter, r.tokens, s.hashes, s.state);
    s.n_prefilled = s.reused;
    ++stats.cache_lookups;
    stats.cache_hits += s.reused > 0 ? 1 : 0;
    stats.cached_tokens += s.reused;
    if (first)
        s.snapshot_at = cache_->snapshot_point(r.tokens, s.hashes, s.reused);
    if (s.snapshot_at <= s.reused)
        s.snapshot_at = 0;
}

int64_t Lane::chunk(const Seq& s) const {
    const int64_t n = s.n_prefilled, c = o_.prefill_chunk;
    int64_t end = std::min(n - n % c + c, s.prompt_len());
    if (s.snapshot_at > n)
        end = std::min(end, s.snapshot_at);
    return end - n;
}

Step Lane::next_step(RequestQueue& queue, EngineStats& stats) {
    Step st;
    st.lane = index_;
    int64_t budget = o_.max_tokens;
    bool any_prefill = false;
    // s's n new tokens join the step if its pages can be had, preempting later sequences
    auto add = [&](Seq& s, int64_t n, bool may_preempt) {
        while (!pool_.reserve(s.state.pages, s.state.n_tokens + n)) {
            if (cache_ && cache_->evict_one(true))  // cached prefixes go before sequences
                continue;
            if (!may_preempt || !preempt_one(&s, stats))
                return false;
        }
        st.batch.pos0.push_back(s.state.n_tokens);
        st.batch.adapter.push_back(
            s.out.req.adapter.empty() ? -1 : o_.adapter_ids.at(s.out.req.adapter));
        if (s.decoding()) {
            st.tokens.push_back(s.next_token);
        } else {
            const auto* p = s.out.req.tokens.data() + s.n_prefilled;
            st.tokens.insert(st.tokens.end(), p, p + n);
            any_prefill = true;
        }
        st.batch.offsets.push_back(static_cast<int64_t>(st.tokens.size()));
        st.states.push_back(&s.state);
        st.rows.push_back({&s, n});
        s.in_step = true;
        budget -= n;
        return true;
    };
    for (size_t i = 0; i < running_.size(); ++i)  // 1. decode rows (the set may shrink)
        if (running_[i]->decoding() && budget >= 1)
            add(*running_[i], 1, true);
    for (size_t i = 0; i < running_.size(); ++i) {  // 2. prefill chunks
        Seq& s = *running_[i];
        const int64_t n = chunk(s);
        if (!s.decoding() && !s.in_step && n <= budget)
            add(s, n, true);
    }
    // 3. preempted sequences, then new requests, while pages last (no preemption for these)
    while (static_cast<int>(running_.size()) < max_seqs_ && budget > 0) {
        std::unique_ptr<Seq> s;
        if (!preempted_.empty()) {
            s = std::move(preempted_.front());
            preempted_.pop_front();
            restore_prefix(*s, false, stats);
        } else if (Pending* p = queue.peek()) {
            s = std::make_unique<Seq>();
            s->out.index = p->index, s->out.sample = p->sample;
            s->out.req = std::move(p->req);
            s->images = std::move(p->images);
            s->max_new =
                s->out.req.max_new_tokens >= 0 ? s->out.req.max_new_tokens : o_.max_new_tokens;
            reset_state(*s);
            s->cacheable = cache_ != nullptr && s->out.req.images.empty();
            if (s->cacheable)
                s->hashes =
                    block_hashes(s->out.req.adapter, s->out.req.tokens, pool_.page_tokens());
            restore_prefix(*s, true, stats);
            queue.pop();
        } else {
            break;
        }
        const int64_t n = chunk(*s);
        running_.push_back(std::move(s));
        if (n > budget || !add(*running_.back(), n, false)) {
            restart(*running_.back(), stats);  // holds no pages (nor a restored prefix) while
            preempted_.push_front(std::move(running_.back()));  // it waits for room
            running_.pop_back();
            break;
        }
    }
    for (auto& s : running_)
        s->in_step = false;
    encode_images();
    splice_rows(st);
    if (st.rows.empty() && !(running_.empty() && preempted_.empty())) {
        // alone in the lane and still without room: it can never run
        const Seq& s = running_.empty() ? *preempted_.front() : *running_.front();
        HYMOE_FAIL(Exit::invalid,
                   "inference.kv_cache.pages: ",
                   pool_.capacity(),
                   " pages of ",
                   pool_.page_tokens(),
                   " tokens per pipeline lane cannot hold request ",
                   s.out.req.id,
                   " (",
                   s.prompt_len(),
                   " prompt tokens + up to ",
                   s.max_new,
                   " new); raise kv_cache.pages or page_tokens, or lower max_new_tokens");
    }
    st.all_rows = o_.prompt_logprobs && any_prefill;
    return st;
}

void Lane::encode_images() {
    if (!m_.shard.first_stage() || !m_.cfg.vision.present) {  // later stages never need pixels
        for (auto& s : running_)
            s->images = {};
        return;
    }
    std::vector<Seq*> todo;
    std::vector<model::VisionImage> images;
    std::vector<int64_t> counts;  // [todo] image tokens of each sequence
    int64_t tokens = 0;
    for (auto& s : running_) {
        if (s->images.empty())
            continue;
        todo.push_back(s.get());
        counts.push_back(0);
        for (const io::Image& im : s->images) {
            images.push_back({im.grid_h, im.grid_w, im.pixels.data()});
            counts.back() +=
                model::vision_tokens(m_.cfg.vision, im.grid_h, im.grid_w, o_.image_pool);
        }
        tokens += counts.back();
    }
    if (todo.empty())
        return;
    const int64_t d = m_.cfg.hidden_size;
    Buffer out(DType::f32, {tokens, d});  // [Σ image tokens, d]
    model::VisionStats scratch;
    model::VisionStats& stats = o_.layer_stats ? o_.layer_stats->vision : scratch;
    if (o_.device)
        o_.device->encode_images(images, o_.image_pool, out.view(), &stats);
    else
        model::vision_forward(m_.cfg, m_.vision, images, o_.image_pool, out.view(), &stats);
    int64_t row = 0;
    for (size_t i = 0; i < todo.size(); ++i) {
        todo[i]->media = Buffer(DType::f32, {counts[i], d});
        std::copy_n(out.ptr<float>() + row * d, counts[i] * d, todo[i]->media.ptr<float>());
        row += counts[i];
        todo[i]->images = {};
    }
}

void Lane::splice_rows(Step& st) const {
    const int64_t id = m_.cfg.vision.media_token_id, d = m_.cfg.hidden_size;
    std::vector<std::pair<const Seq*, int64_t>> src;  // (sequence, its image token) per row
    for (size_t r = 0; r < st.rows.size(); ++r) {
        const Seq& s = *st.rows[r].seq;
        if (s.decoding() || s.media.view().shape.empty())  // no images, or not the first stage
            continue;
        const std::vector<int64_t>& t = s.out.req.tokens;
        int64_t k = std::count(t.begin(), t.begin() + s.n_prefilled, id);  // images before it
        for (int64_t i = 0; i < st.rows[r].n; ++i)
            if (t[s.n_prefilled + i] == id) {
                st.media.rows.push_back(st.batch.offsets[r] + i);
                src.emplace_back(&s, k++);
            }
    }
    if (src.empty())
        return;
    st.media.embeds = Buffer(DType::f32, {static_cast<int64_t>(src.size()), d});
    for (size_t i = 0; i < src.size(); ++i)
        std::copy_n(src[i].first->media.ptr<float>() + src[i].second * d,
                    d,
                    st.media.embeds.ptr<float>() + static_cast<int64_t>(i) * d);
}

void Lane::retire(const FinishedSink& sink, EngineStats& stats) {
    for (auto& s : running_)
        if (s->snapshot_at > 0 && s->n_prefilled == s->snapshot_at) {  // every stage ran the step
            cache_->store(
                s->out.req.adapter, s->out.req.tokens, s->hashes, s->snapshot_at, s->state);
            s->snapshot_at = 0;
        }
    for (auto& s : running_) {
        if (s->done) {
            pool_.release(s->state.pages);
            ++stats.requests;
            sink(std::move(s->out));
        }
    }
    std::erase_if(running_, [](const std::unique_ptr<Seq>& s) { return s->done; });
}

}  // namespace hymoe::runtime
