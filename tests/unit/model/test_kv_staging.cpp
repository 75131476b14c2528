// Unit tests of a step's pages in the slots of a host KV tier (hymoe/model/kv_staging.h): a
// worked batch (decode, whole prompt and chunk together), page boundaries, random batches
// against a per-token reference (every token before pos0 is fetched to its slot, every new token
// written back from it, no other page moved, runs maximal), coalescing, and the refusals (a page
// in two tables, a page out of range, a table short of the keys). Then the whole tier emulated
// on the host: KvTierLayout's copies between host rows and two slots, in the GPU store's order
// (fetch the first two attention layers; after each layer write back, fetch the one after next),
// with a kernel's reads and appends through the slot-index block tables, over 60 random steps of
// prefill chunks, decodes, finished and preempted sequences and reused pages: every row read is
// the one appended, and the host holds every row after each step.
#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>
#include <set>
#include <utility>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/core/error.h"
#include "hymoe/core/rng.h"
#include "hymoe/model/kv_staging.h"

namespace {

using namespace hymoe;
using namespace hymoe::model;

// A batch from (pos0, length) per sequence.
SeqBatch batch_of(const std::vector<std::pair<int64_t, int64_t>>& seqs) {
    SeqBatch b{{0}, {}, {}};
    for (const auto& [pos0, length] : seqs) {
        b.pos0.push_back(pos0);
        b.offsets.push_back(b.offsets.back() + length);
    }
    return b;
}

// The (slot, page) pairs a list of runs covers, in order.
std::vector<std::pair<int32_t, int32_t>> pairs_of(const std::vector<PageRun>& runs) {
    std::vector<std::pair<int32_t, int32_t>> p;
    for (const PageRun& r : runs)
        for (int32_t i = 0; i < r.count; ++i)
            p.emplace_back(r.slot + i, r.page + i);
    return p;
}

bool refused(const std::vector<int32_t>& table, int max_pages, const SeqBatch& b, int64_t cap) {
    try {
        stage_kv_pages(table, max_pages, b, 4, cap);
    } catch (const Error&) {
        return true;
    }
    return false;
}

// `pages` pages of `floats` floats from src (pitch src_pitch) to dst (pitch dst_pitch), as
// cudaMemcpy2D does.
void copy_pages(float* dst,
                int64_t dst_pitch,
                const float* src,
                int64_t src_pitch,
                int64_t floats,
                int64_t pages) {
    for (int64_t i = 0; i < pages; ++i)
        std::memcpy(dst + i * dst_pitch, src + i * src_pitch, static_cast<size_t>(floats) * 4);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(kv_staging)

BOOST_AUTO_TEST_CASE(a_worked_step) {
    // pages of 4 tokens: a decode row at 5, a 9-token prompt, a 4-token chunk after 8 tokens
    const SeqBatch b = batch_of({{5, 1}, {0, 9}, {8, 4}});
    const std::vector<int32_t> table = {7, 8, 9, 2, 3, 4, 5, -1, 10, 11, 12, 13};
    const KvStaging k = stage_kv_pages(table, 4, b, 4, 16);
    BOOST_TEST(k.pages == (std::vector<int32_t>{7, 8, 3, 4, 5, 10, 11, 12}),
               boost::test_tools::per_element());
    BOOST_TEST(k.table == (std::vector<int32_t>{0, 1, -1, -1, 2, 3, 4, -1, 5, 6, 7, -1}),
               boost::test_tools::per_element());
    BOOST_TEST((k.fetch == std::vector<PageRun>{{0, 7, 2}, {5, 10, 2}}));
    BOOST_TEST((k.write == std::vector<PageRun>{{1, 8, 1}, {2, 3, 3}, {7, 12, 1}}));
}

BOOST_AUTO_TEST_CASE(page_boundaries) {
    const std::vector<int32_t> table = {0, 1, 2, 3};
    struct Case {
        int64_t pos0, length;
        std::vector<PageRun> fetch, write;
    };
    const std::vector<Case> cases = {
        {8, 4, {{0, 0, 2}}, {{2, 2, 1}}},  // a chunk starting a page: that page is not fetched
        {7, 1, {{0, 0, 2}}, {{1, 1, 1}}},  // the last row of a page
        {7, 2, {{0, 0, 2}}, {{1, 1, 2}}},  // across a boundary
        {0, 16, {}, {{0, 0, 4}}},          // a whole prompt: nothing fetched
        {4, 12, {{0, 0, 1}}, {{1, 1, 3}}},
    };
    for (const Case& c : cases) {
        BOOST_TEST_CONTEXT("pos0 " << c.pos0 << ", length " << c.length) {
            const KvStaging k = stage_kv_pages(table, 4, batch_of({{c.pos0, c.length}}), 4, 4);
            BOOST_TEST((k.fetch == c.fetch));
            BOOST_TEST((k.write == c.write));
        }
    }
}

BOOST_AUTO_TEST_CASE(random_steps_move_exactly_the_pages_of_their_tokens) {
    Philox rng(5, 0, 0);
    const int pt = 4, max_pages = 12;
    const int64_t capacity = 200;
    for (int trial = 0; trial < 200; ++trial) {
        // pool pages: a shuffled list cut into runs of consecutive ids, dealt to the sequences
        std::vector<int32_t> pool(static_cast<size_t>(capacity));
        std::iota(pool.begin(), pool.end(), 0);
        for (size_t i = pool.size() - 1; i > 0; i -= std::min<size_t>(i, 1 + rng.next_u32() % 5))
            std::swap(pool[i], pool[rng.next_u32() % (i + 1)]);
        const int n_seq = 1 + static_cast<int>(rng.next_u32() % 6);
        std::vector<std::pair<int64_t, int64_t>> seqs;
        std::vector<int32_t> table(static_cast<size_t>(n_seq * max_pages), -1);
        size_t next = 0;
        for (int q = 0; q < n_seq; ++q) {
            const int64_t pos0 = rng.next_u32() % 30;
            const int64_t length = 1 + rng.next_u32() % (max_pages * pt - pos0 - 1);
            seqs.emplace_back(pos0, length);
            const int64_t held = (pos0 + length + pt - 1) / pt + rng.next_u32() % 2;  // one spare
            for (int64_t j = 0; j < std::min<int64_t>(held, max_pages); ++j)
                table[static_cast<size_t>(q * max_pages + j)] = pool[next++];
        }
        const SeqBatch b = batch_of(seqs);
        const KvStaging k = stage_kv_pages(table, max_pages, b, pt, capacity);
        // reference: the (slot, page) pairs each token needs fetched or written
        std::set<std::pair<int32_t, int32_t>> want_fetch, want_write;
        for (int q = 0; q < n_seq; ++q) {
            const auto [pos0, length] = seqs[static_cast<size_t>(q)];
            for (int64_t t = 0; t < pos0 + length; ++t) {
                const auto at = static_cast<size_t>(q * max_pages + t / pt);
                const int32_t slot = k.table[at];
                BOOST_REQUIRE(slot >= 0);
                BOOST_TEST(k.pages[static_cast<size_t>(slot)] == table[at]);
                (t < pos0 ? want_fetch : want_write).emplace(slot, table[at]);
            }
            for (int64_t j = (pos0 + length + pt - 1) / pt; j < max_pages; ++j)
                BOOST_TEST(k.table[static_cast<size_t>(q * max_pages + j)] == -1);
        }
        const auto fetch = pairs_of(k.fetch), write = pairs_of(k.write);
        BOOST_TEST((std::set(fetch.begin(), fetch.end()) == want_fetch));
        BOOST_TEST((std::set(write.begin(), write.end()) == want_write));
        BOOST_TEST(fetch.size() == want_fetch.size());
        BOOST_TEST(write.size() == want_write.size());
        BOOST_TEST(std::set(k.pages.begin(), k.pages.end()).size() == k.pages.size());
        for (const auto* runs : {&k.fetch, &k.write})
            for (size_t r = 1; r < runs->size(); ++r) {  // maximal: no run continues the last
                const PageRun &a = (*runs)[r - 1], &c = (*runs)[r];
                BOOST_TEST(c.slot >= a.slot + a.count);
                BOOST_TEST(!(c.slot == a.slot + a.count && c.page == a.page + a.count));
            }
    }
}

BOOST_AUTO_TEST_CASE(runs_coalesce_only_where_both_sides_step_by_one) {
    BOOST_TEST(page_runs({}).empty());
    BOOST_TEST((page_runs({{0, 5}, {1, 6}, {2, 8}, {3, 9}, {5, 10}}) ==
                std::vector<PageRun>{{0, 5, 2}, {2, 8, 2}, {5, 10, 1}}));
    BOOST_TEST((page_runs({{0, 5}, {1, 4}}) == std::vector<PageRun>{{0, 5, 1}, {1, 4, 1}}));
}

BOOST_AUTO_TEST_CASE(bad_tables_are_refused) {
    const SeqBatch two = batch_of({{0, 5}, {0, 3}});
    BOOST_TEST(!refused({0, 1, 2, -1}, 2, two, 4));
    BOOST_TEST(refused({0, 1, 1, -1}, 2, two, 4));   // page 1 in both tables
    BOOST_TEST(refused({0, 0, 2, -1}, 2, two, 4));   // twice in one table
    BOOST_TEST(refused({0, 1, 4, -1}, 2, two, 4));   // beyond capacity
    BOOST_TEST(refused({0, -1, 2, -1}, 2, two, 4));  // short of sequence 0's 5 keys
    BOOST_TEST(refused({0, 1, 2}, 2, two, 4));       // a table of the wrong size
}

BOOST_AUTO_TEST_CASE(the_tier_emulated_on_the_host_keeps_every_row) {
    KvLayout layout;  // KDA, DSA-wide, KDA, MLA-narrow, DSA-wide: slots 0, 1, 0 in turn
    layout.page_tokens = 4;
    layout.capacity = 24;
    layout.width = {0, 6, 0, 4, 6};
    const KvTierLayout at(layout);
    BOOST_TEST(at.n_slots == 2);
    BOOST_TEST(at.slot_page_floats == 24);
    BOOST_TEST((at.slot_offset == std::vector<int64_t>{0, 0, 0, 24 * 24, 0}));
    BOOST_TEST((at.host_offset == std::vector<int64_t>{0, 0, 24 * 24, 24 * 24, 24 * 40}));
    const int pt = layout.page_tokens, max_pages = 6;
    std::vector<float> host(static_cast<size_t>(at.host_floats), -7.0f);
    std::vector<float> slots(static_cast<size_t>(at.n_slots * at.slot_floats), -9.0f);
    struct Seq {
        std::vector<int32_t> pages;
        int64_t n = 0;                                               // tokens cached
        std::map<std::pair<int, int64_t>, std::vector<float>> rows;  // (layer, token) → row
    };
    std::vector<Seq> seqs(4);
    std::vector<int32_t> free_pages(static_cast<size_t>(layout.capacity));
    std::iota(free_pages.rbegin(), free_pages.rend(), 0);  // LIFO: page 0 first
    Philox rng(17, 0, 0);
    auto value = [&] { return static_cast<float>(rng.next_u32() % 100000); };
    auto release = [&](Seq& s) {
        free_pages.insert(free_pages.end(), s.pages.rbegin(), s.pages.rend());
        s = Seq{};
    };
    int64_t fetched = 0, written = 0;
    for (int step = 0; step < 60; ++step) {
        SeqBatch b{{0}, {}, {}};
        std::vector<Seq*> in_step;
        for (Seq& s : seqs) {
            if (rng.next_u32() % 8 == 0) {  // finished or preempted: its pages go back
                release(s);
                continue;
            }
            const int64_t room = max_pages * pt - s.n;
            if (room < 1) {
                release(s);
                continue;
            }
            const int64_t len =
                std::min<int64_t>(room, rng.next_u32() % 2 ? 1 : 1 + rng.next_u32() % 9);
            const auto need = static_cast<size_t>((s.n + len + pt - 1) / pt);
            if (need - std::min(need, s.pages.size()) > free_pages.size())
                continue;  // no room this step
            while (s.pages.size() < need) {
                s.pages.push_back(free_pages.back());
                free_pages.pop_back();
            }
            b.pos0.push_back(s.n);
            b.offsets.push_back(b.offsets.back() + len);
            in_step.push_back(&s);
        }
        if (in_step.empty())
            continue;
        std::vector<int32_t> table(in_step.size() * max_pages, -1);
        for (size_t q = 0; q < in_step.size(); ++q)
            std::copy(in_step[q]->pages.begin(),
                      in_step[q]->pages.end(),
                      table.begin() + static_cast<int64_t>(q) * max_pages);
        const KvStaging k = stage_kv_pages(table, max_pages, b, pt, layout.capacity);
        auto fetch = [&](int layer) {
            for (const KvTierLayout::Copy& c : at.copies(layer, k.fetch)) {
                copy_pages(slots.data() + c.slot,
                           at.slot_page_floats,
                           host.data() + c.host,
                           layout.layer_page_floats(layer),
                           layout.layer_page_floats(layer),
                           c.pages);
                fetched += c.pages;
            }
        };
        for (int a = 0; a < at.n_slots; ++a)
            fetch(at.attention[static_cast<size_t>(a)]);
        for (int layer : at.attention) {
            const int64_t w = layout.width[static_cast<size_t>(layer)];
            auto row = [&](size_t q, int64_t t) {  // a kernel's address through the block table
                const int32_t slot = k.table[q * max_pages + static_cast<size_t>(t / pt)];
                return slots.data() + at.slot_offset[static_cast<size_t>(layer)] +
                       slot * at.slot_page_floats + (t % pt) * w;
            };
            for (size_t q = 0; q < in_step.size(); ++q) {
                Seq& s = *in_step[q];
                for (int64_t t = 0; t < b.pos0[q]; ++t) {  // attention reads the cached rows
                    const std::vector<float>& want = s.rows.at({layer, t});
                    BOOST_REQUIRE(std::equal(want.begin(), want.end(), row(q, t)));
                }
                for (int64_t t = b.pos0[q]; t < b.pos0[q] + b.length(q); ++t) {  // appends
                    std::vector<float>& r = s.rows[{layer, t}];
                    for (int64_t c = 0; c < w; ++c)
                        r.push_back(value());
                    std::copy(r.begin(), r.end(), row(q, t));
                }
            }
            for (const KvTierLayout::Copy& c : at.copies(layer, k.write)) {
                copy_pages(host.data() + c.host,
                           layout.layer_page_floats(layer),
                           slots.data() + c.slot,
                           at.slot_page_floats,
                           layout.layer_page_floats(layer),
                           c.pages);
                written += c.pages;
            }
            const auto after_next = static_cast<size_t>(at.rank[static_cast<size_t>(layer)] + 2);
            if (after_next < at.attention.size())
                fetch(at.attention[after_next]);
        }
        for (size_t q = 0; q < in_step.size(); ++q)
            in_step[q]->n += b.length(static_cast<int64_t>(q));
        for (const Seq& s : seqs)  // the host holds every row of every sequence
            for (const auto& [key, want] : s.rows) {
                const auto [layer, t] = key;
                const float* got =
                    host.data() + at.host_offset[static_cast<size_t>(layer)] +
                    s.pages[static_cast<size_t>(t / pt)] * layout.layer_page_floats(layer) +
                    (t % pt) * layout.width[static_cast<size_t>(layer)];
                BOOST_REQUIRE(std::equal(want.begin(), want.end(), got));
            }
    }
    BOOST_TEST_MESSAGE("emulated tier: " << fetched << " pages fetched, " << written
                                         << " written back");
    BOOST_TEST(fetched > 100);
    BOOST_TEST(written > 100);
}

BOOST_AUTO_TEST_SUITE_END()
