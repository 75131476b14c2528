// The prefix cache of an engine lane: block-hash chains, entries of shared KV pages + KDA state
// snapshots, LRU eviction, branch points among recent prompts (runtime/prefix_cache.h).
#include "hymoe/runtime/prefix_cache.h"

#include <algorithm>
#include <cstring>

#include "hymoe/core/error.h"

namespace hymoe::runtime {

namespace {

// splitmix64's finaliser: a 64-bit mix with full avalanche.
uint64_t mix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

int64_t buffer_bytes_of(const Buffer& b) {  // 0 for an empty buffer (no shape)
    if (b.view().shape.empty())
        return 0;
    return b.view().numel() * static_cast<int64_t>(dtype_size(b.view().dtype));
}

Buffer copy_of(const Buffer& b) {
    if (b.view().shape.empty())
        return Buffer();
    Buffer out(b.view().dtype, b.view().shape);
    std::memcpy(out.ptr<char>(), b.ptr<char>(), static_cast<size_t>(buffer_bytes_of(b)));
    return out;
}

void copy_into(const Buffer& from, Buffer& to) {
    HYMOE_CHECK(from.view().shape == to.view().shape, "prefix cache: a KDA state of another shape");
    std::memcpy(to.ptr<char>(), from.ptr<char>(), static_cast<size_t>(buffer_bytes_of(from)));
}

}  // namespace

bool prefix_boundary(int64_t n, int64_t prompt_len, int page_tokens, int prefill_chunk) {
    if (n <= 0 || n >= prompt_len || n % page_tokens != 0)
        return false;
    const int64_t offset = n % prefill_chunk;  // in the uncached run's call holding token n
    const int64_t call_end = std::min<int64_t>(n - offset + prefill_chunk, prompt_len);
    return offset == 0 || (offset % model::kPrefillAlign == 0 && call_end - n >= 2);
}

std::vector<uint64_t> block_hashes(const std::string& adapter,
                                   const std::vector<int64_t>& tokens,
                                   int block) {
    uint64_t h = mix(0x68796D6F65ull);  // "hymoe"
    for (unsigned char c : adapter)
        h = mix(h ^ c);
    h = mix(h ^ adapter.size());
    std::vector<uint64_t> out;
    const size_t n_blocks = tokens.size() / static_cast<size_t>(block);
    out.reserve(n_blocks);
    for (size_t b = 0; b < n_blocks; ++b) {
        for (size_t t = b * block; t < (b + 1) * block; ++t)
            h = mix(h ^ static_cast<uint64_t>(tokens[t]));
        out.push_back(h);
    }
    return out;
}

PrefixCache::PrefixCache(model::KvPool& pool,
                         int prefill_chunk,
                         int64_t max_bytes,
                         int recent,
                         model::DeviceModel* device)
    : pool_(pool),
      device_(device),
      prefill_chunk_(prefill_chunk),
      max_bytes_(max_bytes),
      recent_cap_(static_cast<size_t>(recent)) {}

PrefixCache::~PrefixCache() {
    while (!entries_.empty())
        drop(entries_.begin());
}

int64_t PrefixCache::restore(const std::string& adapter,
                             const std::vector<int64_t>& tokens,
                             const std::vector<uint64_t>& hashes,
                             model::SequenceState& s) {
    HYMOE_CHECK(s.n_tokens == 0 && s.pages.empty(), "prefix cache: restoring into a used state");
    const int pt = pool_.page_tokens();
    for (auto b = static_cast<int64_t>(hashes.size()); b >= 1; --b) {
        const int64_t n = b * pt;
        if (!prefix_boundary(n, static_cast<int64_t>(tokens.size()), pt, prefill_chunk_))
            continue;
        auto it = entries_.find(hashes[static_cast<size_t>(b - 1)]);
        if (it == entries_.end())
            continue;
        Entry& e = it->second;
        if (e.adapter != adapter || !std::equal(e.tokens.begin(), e.tokens.end(), tokens.begin()))
            continue;  // a hash collision
        pool_.share(s.pages, e.pages);
        if (device_ != nullptr)
            device_->load_kda_states(e.device_kda, s);
        for (size_t l = 0; l < e.kda.size(); ++l)
            if (!e.kda[l].S.view().shape.empty()) {
                copy_into(e.kda[l].S, s.kda[l].S);
                copy_into(e.kda[l].q_tail, s.kda[l].q_tail);
                copy_into(e.kda[l].k_tail, s.kda[l].k_tail);
                copy_into(e.kda[l].v_tail, s.kda[l].v_tail);
            }
        for (model::AttnCache& c : s.attn)
            if (c.pool != nullptr)
                c.n = n;
        s.n_tokens = n;
        e.used = ++clock_;
        return n;
    }
    return 0;
}

int64_t PrefixCache::snapshot_point(const std::vector<int64_t>& tokens,
                                    const std::vector<uint64_t>& hashes,
                                    int64_t restored) {
    int64_t shared = 0;  // blocks shared with a recent prompt
    for (auto b = static_cast<int64_t>(hashes.size()); b >= 1 && shared == 0; --b)
        if (seen_.count(hashes[static_cast<size_t>(b - 1)]) > 0)
            shared = b;
    int64_t point = 0;
    const int pt = pool_.page_tokens();
    for (int64_t b = shared; b >= 1 && point == 0; --b) {
        const int64_t n = b * pt;
        if (n <= restored)
            break;
        if (prefix_boundary(n, static_cast<int64_t>(tokens.size()), pt, prefill_chunk_) &&
            entries_.count(hashes[static_cast<size_t>(b - 1)]) == 0)
            point = n;
    }
    recent_.push_back(hashes);
    for (uint64_t h : hashes)
        ++seen_[h];
    if (recent_.size() > recent_cap_) {
        for (uint64_t h : recent_.front())
            if (--seen_[h] == 0)
                seen_.erase(h);
        recent_.pop_front();
    }
    return point;
}

void PrefixCache::store(const std::string& adapter,
                        const std::vector<int64_t>& tokens,
                        const std::vector<uint64_t>& hashes,
                        int64_t n,
                        const model::SequenceState& s) {
    const int pt = pool_.page_tokens();
    HYMOE_CHECK(
        n > 0 && n % pt == 0 && s.n_tokens == n && n / pt <= static_cast<int64_t>(hashes.size()),
        "prefix cache: storing ",
        n,
        " tokens of a state holding ",
        s.n_tokens);
    const uint64_t key = hashes[static_cast<size_t>(n / pt - 1)];
    if (entries_.count(key) > 0)
        return;
    Entry e;
    e.adapter = adapter;
    e.tokens.assign(tokens.begin(), tokens.begin() + n);
    e.bytes = n * static_cast<int64_t>(sizeof(int64_t));
    if (device_ != nullptr) {  // the states are the device's: their host copy is the snapshot
        e.device_kda = device_->save_kda_states(s);
        e.bytes += buffer_bytes_of(e.device_kda);
    } else {
        e.kda.resize(s.kda.size());
        for (size_t l = 0; l < s.kda.size(); ++l) {
            const model::KdaState& k = s.kda[l];
            e.bytes += buffer_bytes_of(k.S) + buffer_bytes_of(k.q_tail) +
                       buffer_bytes_of(k.k_tail) + buffer_bytes_of(k.v_tail);
        }
    }
    if (e.bytes > max_bytes_)
        return;
    while (stats_.bytes + e.bytes > max_bytes_ && evict_one()) {
    }
    for (size_t l = 0; l < e.kda.size(); ++l) {
        const model::KdaState& k = s.kda[l];
        e.kda[l] = {copy_of(k.S), copy_of(k.q_tail), copy_of(k.k_tail), copy_of(k.v_tail)};
    }
    pool_.share(e.pages, std::vector<int32_t>(s.pages.begin(), s.pages.begin() + n / pt));
    e.used = ++clock_;
    stats_.bytes += e.bytes;
    stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.bytes);
    stats_.pages += static_cast<int64_t>(e.pages.size());
    ++stats_.stored;
    ++stats_.entries;
    entries_.emplace(key, std::move(e));
}

bool PrefixCache::evict_one(bool for_pages) {
    auto lru = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
        const std::vector<int32_t>& p = it->second.pages;
        if (for_pages &&
            std::none_of(p.begin(), p.end(), [&](int32_t page) { return pool_.refs(page) == 1; }))
            continue;  // every page also in a running sequence's table: dropping frees none
        if (lru == entries_.end() || it->second.used < lru->second.used)
            lru = it;
    }
    if (lru == entries_.end())
        return false;
    drop(lru);
    ++stats_.evicted;
    return true;
}

void PrefixCache::drop(std::unordered_map<uint64_t, Entry>::iterator it) {
    stats_.bytes -= it->second.bytes;
    stats_.pages -= static_cast<int64_t>(it->second.pages.size());
    --stats_.entries;
    pool_.release(it->second.pages);
    entries_.erase(it);
}

}  // namespace hymoe::runtime
