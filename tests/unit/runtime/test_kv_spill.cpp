// Unit tests of the spill-file KV tier (hymoe/runtime/kv_spill.h): rows written in one step come
// back in later steps after their layer's slot was reused (round trip through the file, with
// eviction); fetches are issued a layer ahead, in layer order; memory holds two slots of the
// step's pages; a page outside the step or a layer not entered is refused; a folder where no file
// can be made fails naming the key; the file the GPU's file tier maps (make_spill_file) is
// unlinked, read-write and of the tier's size, its folder checked as the store's; bf16 pages round
// trip bit-exact at half the bytes; and the tiny-deepseek model (four DSA layers) paged through the
// file gives bit for bit the logits of the in-memory pool, with fp32 and with bf16 rows.
#include <cstring>
#include <filesystem>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/core/error.h"
#include "hymoe/model/kv_cache.h"
#include "hymoe/model/model.h"
#include "hymoe/runtime/kv_spill.h"

namespace {

using namespace hymoe;
using hymoe::runtime::SpillKvStore;

// Layer 0 is KDA (no rows); layers 1..3 cache 5, 3 and 7 floats a token; pages of 4 tokens.
model::KvLayout layout() {
    model::KvLayout l;
    l.page_tokens = 4;
    l.capacity = 8;
    l.width = {0, 5, 3, 7};
    return l;
}

float value(int layer, int32_t page, int64_t i) {
    return static_cast<float>(layer * 10000 + page * 100) + static_cast<float>(i) * 0.5f;
}

// Every float of `pages` in the entered `layer` set to value(), or checked against it.
void fill(SpillKvStore& s, int layer, const std::vector<int32_t>& pages) {
    const int64_t n = layout().layer_page_floats(layer);
    for (int32_t p : pages) {
        auto* rows = static_cast<float*>(s.page(layer, p, true));
        for (int64_t i = 0; i < n; ++i)
            rows[i] = value(layer, p, i);
    }
}
int64_t mismatches(SpillKvStore& s, int layer, const std::vector<int32_t>& pages) {
    const int64_t n = layout().layer_page_floats(layer);
    int64_t bad = 0;
    for (int32_t p : pages) {
        const auto* rows = static_cast<const float*>(s.page(layer, p, false));
        for (int64_t i = 0; i < n; ++i)
            bad += rows[i] != value(layer, p, i);
    }
    return bad;
}

const std::string kDir = std::filesystem::temp_directory_path().string();

}  // namespace

BOOST_AUTO_TEST_SUITE(kv_spill)

BOOST_AUTO_TEST_CASE(pages_round_trip_through_the_file_after_eviction) {
    SpillKvStore s(layout(), kDir, "kv_cache.offload_path");
    s.grow(6);
    const std::vector<int32_t> first{0, 2, 5};
    s.begin_step(first);
    for (int layer : {1, 2, 3}) {
        s.enter_layer(layer);
        fill(s, layer, first);
    }
    s.end_step();
    // layer 1's slot held layer 3 since: its rows come from the file, in another page order
    const std::vector<int32_t> second{5, 0, 2};
    s.begin_step(second);
    for (int layer : {1, 2, 3}) {
        s.enter_layer(layer);
        BOOST_TEST(mismatches(s, layer, second) == 0, "layer " << layer);
    }
    s.end_step();
    const runtime::SpillStats st = s.stats();
    const int64_t one_of_each = 4 * (5 + 3 + 7) * 4;  // bytes of a page over the three layers
    BOOST_TEST(st.bytes_written == 3 * one_of_each);  // the second step changed nothing
    BOOST_TEST(st.bytes_read == 2 * 3 * one_of_each);
    BOOST_TEST(st.file_bytes == 8 * one_of_each);
    // two slots of three pages of the widest layer
    BOOST_TEST(s.peak_resident_bytes() == 2 * 3 * 4 * 7 * 4);
}

BOOST_AUTO_TEST_CASE(a_partly_written_page_keeps_its_earlier_rows) {
    SpillKvStore s(layout(), kDir, "kv_cache.offload_path");
    s.grow(1);
    for (int step = 0; step < 4; ++step) {  // one token a step, as decode writes them
        s.begin_step({0});
        for (int layer : {1, 2, 3}) {
            s.enter_layer(layer);
            const int64_t w = layout().width[static_cast<size_t>(layer)];
            float* row = static_cast<float*>(s.page(layer, 0, true)) + step * w;
            for (int64_t i = 0; i < w; ++i)
                row[i] = value(layer, 0, step * w + i);
        }
        s.end_step();
    }
    s.begin_step({0});
    for (int layer : {1, 2, 3}) {
        s.enter_layer(layer);
        BOOST_TEST(mismatches(s, layer, {0}) == 0, "layer " << layer);
    }
    s.end_step();
}

BOOST_AUTO_TEST_CASE(fetches_run_one_layer_ahead_in_order) {
    SpillKvStore s(layout(), kDir, "kv_cache.offload_path");
    s.grow(2);
    s.begin_step({1, 0});
    BOOST_TEST(s.stats().loads == std::vector<int>({1, 2}));  // the first two, before any runs
    s.enter_layer(1);
    BOOST_TEST(s.stats().loads == std::vector<int>({1, 2}));  // 2 is already on its way
    s.enter_layer(2);
    BOOST_TEST(s.stats().loads == std::vector<int>({1, 2, 3}));  // 3 into layer 1's slot
    s.enter_layer(3);
    s.end_step();
    BOOST_TEST(s.stats().loads == std::vector<int>({1, 2, 3}));  // each layer once
}

BOOST_AUTO_TEST_CASE(rows_outside_the_step_or_the_entered_layer_are_refused) {
    SpillKvStore s(layout(), kDir, "kv_cache.offload_path");
    s.grow(3);
    s.begin_step({0, 1});
    s.enter_layer(1);
    BOOST_CHECK_THROW(s.page(1, 2, false), Error);  // page 2 is not in the step
    BOOST_CHECK_THROW(s.page(2, 0, false), Error);  // layer 2 is not the one running
    BOOST_CHECK_THROW(s.enter_layer(0), Error);     // a KDA layer has no rows
    s.end_step();
}

BOOST_AUTO_TEST_CASE(a_folder_without_room_for_the_file_names_the_key) {
    try {
        SpillKvStore s(layout(), "/proc", "inference.kv_cache.offload_path");
        BOOST_FAIL("a spill file was made in /proc");
    } catch (const Error& e) {
        BOOST_TEST(static_cast<int>(e.code()) == 2);
        BOOST_TEST(std::string(e.what()).find("inference.kv_cache.offload_path: cannot create "
                                              "a spill file in /proc") != std::string::npos,
                   e.what());
    }
}

BOOST_AUTO_TEST_CASE(a_spill_file_for_the_gpu_is_unlinked_and_of_the_tiers_size) {
    const int64_t bytes = runtime::spill_file_bytes(layout());
    BOOST_TEST(bytes == 8 * 4 * (5 + 3 + 7) * 4);  // capacity × page_tokens × widths × fp32
    BOOST_TEST(SpillKvStore(layout(), kDir, "k").stats().file_bytes == bytes);
    const int fd = runtime::make_spill_file(kDir, "k", bytes);
    struct stat st {};
    BOOST_REQUIRE(::fstat(fd, &st) == 0);
    BOOST_TEST(st.st_size == bytes);
    BOOST_TEST(st.st_nlink == 0u);  // gone with the process
    const float x = 2.5f;           // read-write
    BOOST_TEST(::pwrite(fd, &x, sizeof x, 40) == static_cast<ssize_t>(sizeof x));
    float y = 0;
    BOOST_TEST(::pread(fd, &y, sizeof y, 40) == static_cast<ssize_t>(sizeof y));
    BOOST_TEST(y == x);
    ::close(fd);
    try {
        runtime::make_spill_file("/proc", "inference.kv_cache.offload_path", bytes);
        BOOST_FAIL("a spill file was made in /proc");
    } catch (const Error& e) {
        BOOST_TEST(static_cast<int>(e.code()) == 2);
        BOOST_TEST(std::string(e.what()).find("inference.kv_cache.offload_path: cannot create "
                                              "a spill file in /proc") != std::string::npos);
    }
}

BOOST_AUTO_TEST_CASE(bf16_pages_round_trip_through_the_file_bit_exact) {
    model::KvLayout l = layout();
    l.dtype = DType::bf16;
    SpillKvStore s(l, kDir, "kv_cache.offload_path");
    s.grow(6);
    auto code = [](int layer, int32_t page, int64_t i) {  // every bit pattern but NaN's matter
        return static_cast<uint16_t>((layer * 7919 + page * 104729 + i * 40503) & 0xffff);
    };
    const std::vector<int32_t> first{0, 2, 5}, second{5, 0, 2};
    s.begin_step(first);
    for (int layer : {1, 2, 3}) {
        s.enter_layer(layer);
        for (int32_t p : first) {
            auto* rows = static_cast<uint16_t*>(s.page(layer, p, true));
            for (int64_t i = 0; i < l.layer_page_floats(layer); ++i)
                rows[i] = code(layer, p, i);
        }
    }
    s.end_step();
    s.begin_step(second);
    int64_t bad = 0;
    for (int layer : {1, 2, 3}) {
        s.enter_layer(layer);
        for (int32_t p : second) {
            const auto* rows = static_cast<const uint16_t*>(s.page(layer, p, false));
            for (int64_t i = 0; i < l.layer_page_floats(layer); ++i)
                bad += rows[i] != code(layer, p, i);
        }
    }
    s.end_step();
    BOOST_TEST(bad == 0);
    const int64_t one_of_each = 4 * (5 + 3 + 7) * 2;  // bf16 bytes of a page over the layers
    BOOST_TEST(s.stats().file_bytes == 8 * one_of_each);
    BOOST_TEST(s.stats().bytes_written == 3 * one_of_each);
    BOOST_TEST(s.peak_resident_bytes() == 2 * 3 * 4 * 7 * 2);
}

BOOST_AUTO_TEST_CASE(the_model_paged_through_the_file_equals_the_memory_pool_bit_for_bit) {
    model::Model m = model::make_model(model::preset_config("tiny-deepseek"));  // DDDD
    model::init_model_random(m, 5);
    for (DType dtype : {DType::f32, DType::bf16}) {
        auto run = [&](const model::KvStoreFactory& store) {
            model::KvPool pool(m.local, m.shard, 4, 64, store, dtype);
            std::vector<model::SequenceState> st(2);
            for (auto& s : st) {
                s = model::make_sequence_state(m);
                model::attach_kv_pool(m, s, pool);
            }
            std::vector<float> out;
            // two sequences: chunks of 7 and 5, then eight decode steps together
            for (int step = 0; step < 12; ++step) {
                const int64_t na = step < 3 ? 7 : 1, nb = step < 3 ? 5 : 1;
                std::vector<int64_t> tokens;
                for (int64_t i = 0; i < na + nb; ++i)
                    tokens.push_back((step * 31 + i * 7 + 3) % m.cfg.vocab_size);
                BOOST_REQUIRE(pool.reserve(st[0].pages, st[0].n_tokens + na));
                BOOST_REQUIRE(pool.reserve(st[1].pages, st[1].n_tokens + nb));
                Buffer logits;
                model::forward(
                    m,
                    tokens,
                    model::SeqBatch{{0, na, na + nb}, {st[0].n_tokens, st[1].n_tokens}, {}},
                    {&st[0], &st[1]},
                    logits,
                    {model::Logits::last});
                out.insert(
                    out.end(), logits.ptr<float>(), logits.ptr<float>() + logits.view().numel());
            }
            for (auto& s : st)
                pool.release(s.pages);
            return out;
        };
        const std::vector<float> memory = run({});
        const std::vector<float> file = run([](const model::KvLayout& l) {
            return std::make_unique<SpillKvStore>(l, kDir, "kv_cache.offload_path");
        });
        BOOST_REQUIRE(memory.size() == file.size());
        BOOST_TEST(std::memcmp(memory.data(), file.data(), memory.size() * sizeof(float)) == 0,
                   to_string(dtype));
    }
}

BOOST_AUTO_TEST_SUITE_END()
