// Unit tests of the prefix cache's logic (runtime/prefix_cache.h) on the tiny preset's shapes, no
// forward: the block-hash chain (prefixes, adapters, partial blocks), the boundary rule, store and
// restore (shared pages with their references, KDA states copied bit for bit, the attention
// caches advanced), hash collisions caught by the stored tokens, least-recently-used eviction
// under max_bytes, branch points among recent prompts, and the pool's accounting as sequences
// holding a cached prefix finish or are preempted.
#include <cstring>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/model/model.h"
#include "hymoe/runtime/prefix_cache.h"

namespace {

using namespace hymoe;
using runtime::PrefixCache;

constexpr int kPage = 4;

const model::Model& tiny() {
    static const model::Model m = model::make_model(model::preset_config("tiny"));
    return m;
}

// tokens 0..n−1 offset by `salt` from token `from` on (a prompt sharing [0, from) with salt 0)
std::vector<int64_t> prompt(int64_t n, int64_t from = 0, int64_t salt = 0) {
    std::vector<int64_t> t(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
        t[static_cast<size_t>(i)] = 3 + (i * 7 + (i >= from ? salt : 0)) % 200;
    return t;
}

// A sequence in `pool` that has run its first n tokens: pages reserved, KDA states filled with a
// pattern of `seed`.
model::SequenceState ran(model::KvPool& pool, int64_t n, float seed) {
    model::SequenceState s = model::make_sequence_state(tiny());
    model::attach_kv_pool(tiny(), s, pool);
    BOOST_REQUIRE(pool.reserve(s.pages, n));
    for (model::KdaState& k : s.kda)
        for (Buffer* b : {&k.S, &k.q_tail, &k.k_tail, &k.v_tail})
            for (int64_t i = 0; !b->view().shape.empty() && i < b->view().numel(); ++i)
                b->ptr<float>()[i] = seed + 0.25f * static_cast<float>(i % 97);
    for (model::AttnCache& c : s.attn)
        if (c.pool != nullptr)
            c.n = n;
    s.n_tokens = n;
    return s;
}

model::SequenceState fresh(model::KvPool& pool) {
    model::SequenceState s = model::make_sequence_state(tiny());
    model::attach_kv_pool(tiny(), s, pool);
    return s;
}

bool same_kda(const model::SequenceState& a, const model::SequenceState& b) {
    for (size_t l = 0; l < a.kda.size(); ++l)
        for (auto f : {&model::KdaState::S,
                       &model::KdaState::q_tail,
                       &model::KdaState::k_tail,
                       &model::KdaState::v_tail}) {
            const Buffer &x = a.kda[l].*f, &y = b.kda[l].*f;
            if (x.view().shape != y.view().shape ||
                (!x.view().shape.empty() &&
                 std::memcmp(x.ptr<float>(), y.ptr<float>(), x.view().numel() * 4) != 0))
                return false;
        }
    return true;
}

int64_t kda_layers() {
    int64_t n = 0;
    for (const auto& l : tiny().cfg.layers)
        n += l.mixer == model::Mixer::kda ? 1 : 0;
    return n;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(prefix_cache)

BOOST_AUTO_TEST_CASE(block_hashes_chain_whole_blocks_and_the_adapter) {
    const auto a = runtime::block_hashes("", prompt(14), kPage);
    BOOST_TEST(a.size() == 3u);  // 14 tokens: 3 whole blocks, the partial one is not hashed
    const auto b = runtime::block_hashes("", prompt(16, 9, 5), kPage);  // differs from token 9
    BOOST_TEST(b.size() == 4u);
    BOOST_TEST(a[0] == b[0]);
    BOOST_TEST(a[1] == b[1]);
    BOOST_TEST(a[2] != b[2]);  // block [8, 12) holds token 9
    const auto c = runtime::block_hashes("legal", prompt(14), kPage);
    for (size_t i = 0; i < a.size(); ++i)
        BOOST_TEST(a[i] != c[i]);  // another adapter: other keys for every block
    // the chain: equal block contents at different places still hash differently
    const std::vector<int64_t> same(8, 5);
    const auto d = runtime::block_hashes("", same, kPage);
    BOOST_TEST(d[0] != d[1]);
}

BOOST_AUTO_TEST_CASE(boundaries_keep_the_uncached_runs_calls) {
    using runtime::prefix_boundary;
    // prefill_chunk 2048, pages of 64: multiples of 256 inside the first call
    BOOST_TEST(prefix_boundary(512, 600, 64, 2048));
    BOOST_TEST(!prefix_boundary(576, 700, 64, 2048));  // offset 576: not a multiple of 256
    BOOST_TEST(!prefix_boundary(512, 512, 64, 2048));  // the whole prompt: nothing to prefill
    BOOST_TEST(!prefix_boundary(512, 513, 64, 2048));  // a one-token call after it
    BOOST_TEST(!prefix_boundary(0, 600, 64, 2048));
    BOOST_TEST(!prefix_boundary(500, 600, 50, 2048));  // not a multiple of 256
    // a boundary of the uncached run's calls is always one (if whole pages)
    BOOST_TEST(prefix_boundary(96, 97, 16, 96));
    BOOST_TEST(prefix_boundary(480, 600, 16, 96));
    BOOST_TEST(!prefix_boundary(512, 600, 16, 96));  // offset 32 inside its call of 96
    BOOST_TEST(!prefix_boundary(6, 12, 4, 6));       // a call boundary inside a page: never
}

BOOST_AUTO_TEST_CASE(store_and_restore_share_pages_and_copy_states) {
    model::KvPool pool(tiny().local, tiny().shard, kPage, 16);
    PrefixCache cache(pool, kPage, int64_t{1} << 30);
    const std::vector<int64_t> a_tok = prompt(12);
    const auto a_hash = runtime::block_hashes("", a_tok, kPage);
    model::SequenceState a = ran(pool, 8, 1.5f);
    cache.store("", a_tok, a_hash, 8, a);
    BOOST_TEST(cache.stats().entries == 1);
    BOOST_TEST(cache.stats().pages == 2);
    BOOST_TEST(pool.refs(a.pages[0]) == 2);
    BOOST_TEST(pool.refs(a.pages[1]) == 2);
    const std::vector<int32_t> shared(a.pages.begin(), a.pages.begin() + 2);
    model::SequenceState a_copy = ran(pool, 0, 1.5f);  // the states a held at token 8
    pool.release(a.pages);                             // a finishes: the cache keeps its pages
    BOOST_TEST(pool.refs(shared[0]) == 1);
    BOOST_TEST(pool.free_pages() == 16 - 2);

    const std::vector<int64_t> b_tok = prompt(10, 8, 9);  // shares the first 8 tokens
    const auto b_hash = runtime::block_hashes("", b_tok, kPage);
    model::SequenceState b = fresh(pool);
    BOOST_TEST(cache.restore("", b_tok, b_hash, b) == 8);
    BOOST_TEST(b.pages == shared, boost::test_tools::per_element());
    BOOST_TEST(pool.refs(shared[0]) == 2);
    BOOST_TEST(b.n_tokens == 8);
    for (const model::AttnCache& c : b.attn)
        BOOST_TEST(c.n == (c.pool ? 8 : 0));
    BOOST_TEST(kda_layers() > 0);
    BOOST_TEST(same_kda(b, a_copy));
    BOOST_TEST(pool.reserve(b.pages, 10));  // its own page after the shared ones
    BOOST_TEST(b.pages.size() == 3u);
    BOOST_TEST(pool.refs(b.pages[2]) == 1);

    model::SequenceState c = fresh(pool);  // another adapter: no hit
    BOOST_TEST(cache.restore("legal", b_tok, runtime::block_hashes("legal", b_tok, kPage), c) == 0);
    BOOST_TEST(c.pages.empty());
    BOOST_TEST(
        cache.restore("", std::vector<int64_t>(a_tok.begin(), a_tok.begin() + 8), a_hash, c) ==
        0);  // the whole prompt cached: its last token is still prefilled
    std::vector<int64_t> forged = b_tok;  // a's hashes over other tokens: a "collision"
    forged[1] += 1;
    BOOST_TEST(cache.restore("", forged, b_hash, c) == 0);
    BOOST_TEST(c.n_tokens == 0);

    BOOST_TEST(cache.evict_one());  // the entry goes; b still holds the pages
    BOOST_TEST(cache.stats().entries == 0);
    BOOST_TEST(pool.refs(shared[0]) == 1);
    BOOST_TEST(pool.free_pages() == 16 - 3);
    pool.release(b.pages);  // the last user: every page free again
    BOOST_TEST(pool.free_pages() == 16);
    BOOST_TEST(!cache.evict_one());
}

BOOST_AUTO_TEST_CASE(eviction_is_least_recently_used_within_max_bytes) {
    model::KvPool pool(tiny().local, tiny().shard, kPage, 32);
    // one entry of 4 tokens: the tokens' bytes + every KDA layer's state
    model::SequenceState probe = ran(pool, 4, 0);
    PrefixCache sizing(pool, kPage, int64_t{1} << 30);
    sizing.store("", prompt(8), runtime::block_hashes("", prompt(8), kPage), 4, probe);
    const int64_t entry = sizing.stats().bytes;
    BOOST_TEST(entry > 4 * 8);
    sizing.evict_one();
    pool.release(probe.pages);

    PrefixCache cache(pool, kPage, 2 * entry);  // room for two
    std::vector<std::vector<int64_t>> toks;
    for (int64_t k = 0; k < 3; ++k) {  // three prompts differing from token 0
        toks.push_back(prompt(8, 0, 11 * (k + 1)));
        model::SequenceState s = ran(pool, 4, static_cast<float>(k));
        if (k == 2) {  // touch prompt 0 first: prompt 1 is now the least recently used
            model::SequenceState t = fresh(pool);
            BOOST_TEST(cache.restore("", toks[0], runtime::block_hashes("", toks[0], kPage), t) ==
                       4);
            pool.release(t.pages);
        }
        cache.store("", toks.back(), runtime::block_hashes("", toks.back(), kPage), 4, s);
        pool.release(s.pages);
    }
    BOOST_TEST(cache.stats().entries == 2);
    BOOST_TEST(cache.stats().evicted == 1);
    BOOST_TEST(cache.stats().bytes == 2 * entry);
    BOOST_TEST(cache.stats().peak_bytes == 2 * entry);
    BOOST_TEST(pool.free_pages() == 32 - 2);  // the evicted entry's page went back
    for (int64_t k : {0, 1, 2}) {
        model::SequenceState t = fresh(pool);
        const int64_t got =
            cache.restore("", toks[k], runtime::block_hashes("", toks[k], kPage), t);
        BOOST_TEST(got == (k == 1 ? 0 : 4));
        pool.release(t.pages);
    }
    PrefixCache tiny_cache(pool, kPage, entry - 1);  // a snapshot larger than max_bytes: skipped
    model::SequenceState s = ran(pool, 4, 0);
    tiny_cache.store("", toks[0], runtime::block_hashes("", toks[0], kPage), 4, s);
    BOOST_TEST(tiny_cache.stats().entries == 0);
    pool.release(s.pages);
}

BOOST_AUTO_TEST_CASE(snapshots_go_to_branch_points_of_recent_prompts) {
    model::KvPool pool(tiny().local, tiny().shard, kPage, 32);
    PrefixCache cache(pool, kPage, int64_t{1} << 30, 3);  // remembers the last 3 prompts
    auto point = [&](const std::vector<int64_t>& t, int64_t restored = 0) {
        return cache.snapshot_point(t, runtime::block_hashes("", t, kPage), restored);
    };
    BOOST_TEST(point(prompt(14)) == 0);             // the first of its family
    BOOST_TEST(point(prompt(15, 10, 3)) == 8);      // shares 10 tokens: 2 whole blocks
    BOOST_TEST(point(prompt(13, 13, 3), 8) == 12);  // shares 3 blocks, 8 already restored
    BOOST_TEST(point(prompt(12, 9, 1), 8) == 0);    // shares 2 blocks, restored 8: nothing new
    BOOST_TEST(point(prompt(8)) == 4);  // a prompt of 2 blocks: the last token is prefilled
    // a stored prefix is not stored again
    const std::vector<int64_t> t = prompt(16, 12, 5);
    model::SequenceState s = ran(pool, 12, 0);
    cache.store("", t, runtime::block_hashes("", t, kPage), 12, s);
    pool.release(s.pages);
    BOOST_TEST(point(prompt(16, 14, 7)) == 8);  // shares 12 (cached already): the next one down
    // out of the recent window: forgotten
    for (int64_t salt : {50, 60, 70})
        point(prompt(8, 0, salt));
    BOOST_TEST(point(prompt(16, 14, 9)) == 0);
}

BOOST_AUTO_TEST_CASE(pool_accounting_holds_when_a_restored_sequence_is_preempted) {
    model::KvPool pool(tiny().local, tiny().shard, kPage, 6);
    PrefixCache cache(pool, kPage, int64_t{1} << 30);
    const std::vector<int64_t> t = prompt(20);
    const auto h = runtime::block_hashes("", t, kPage);
    model::SequenceState a = ran(pool, 8, 2);
    cache.store("", t, h, 8, a);
    pool.release(a.pages);
    for (int round = 0; round < 3; ++round) {  // restore, grow, preempt (release), again
        model::SequenceState b = fresh(pool);
        BOOST_TEST(cache.restore("", t, h, b) == 8);
        BOOST_TEST(pool.reserve(b.pages, 20));  // 3 more pages
        BOOST_TEST(pool.free_pages() == 6 - 5);
        BOOST_TEST(!pool.reserve(b.pages, 28));  // 2 more do not fit
        pool.release(b.pages);
        BOOST_TEST(pool.free_pages() == 6 - 2);
    }
    model::SequenceState big = fresh(pool);  // room only once the entry goes (the lane's order)
    while (!pool.reserve(big.pages, 24))
        BOOST_REQUIRE(cache.evict_one());
    BOOST_TEST(pool.free_pages() == 0);
    pool.release(big.pages);
    BOOST_TEST(pool.free_pages() == 6);
}

BOOST_AUTO_TEST_SUITE_END()
