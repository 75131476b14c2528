// Training checkpoints (io/checkpoint.h) at np 1, 2, 4, 8: tensors split along dim 0, dim 1,
// unevenly, whole (one writer picked) and held by one rank only, saved and loaded back at the same
// split and at others (whole, along the other dim, the ranks reversed) with their values checked
// against the formula they were made from; keep and latest; and the load failures (a flipped byte,
// a truncated file, a shape mismatch, a missing tensor, a missing manifest) as collective exit-4
// errors naming the tensor and the file. With HYMOE_CKPT_DRILL=DIR set, `writer_loop` saves
// steps into DIR without end: the e2e tier kills it with SIGKILL during a write (kill drill).
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <hdf5.h>

#include "../testing.h"
#include "hymoe/core/error.h"
#include "hymoe/io/checkpoint.h"
#include "hymoe/parallel/comms.h"

namespace fs = std::filesystem;
using namespace hymoe;
using hymoe::testing::all_ranks;

namespace {

// The global value of element i of tensor `id` (exact in f32, and in bf16 for the bf16 tensor).
double value(int id, int64_t i) {
    return id == 1 ? static_cast<double>(i % 200 - 100) : id * 100000.0 + static_cast<double>(i);
}

struct Spec {
    std::string name;
    int id;
    DType dtype;
    Shape shape;  // global
};

// The slice [begin, begin + rows) along dim of spec's global tensor, filled from value().
Buffer make_slice(const Spec& s, int dim, int64_t begin, int64_t rows) {
    Shape local = s.shape;
    if (dim >= 0)
        local[dim] = rows;
    Buffer b(s.dtype, local);
    const int64_t n = shape_numel(local);
    for (int64_t i = 0; i < n; ++i) {
        int64_t rem = i, g = 0, stride = 1;  // the global flat index of local element i
        Shape idx(local.size());
        for (size_t k = local.size(); k-- > 0;)
            idx[k] = rem % local[k], rem /= local[k];
        if (dim >= 0)
            idx[dim] += begin;
        for (size_t k = local.size(); k-- > 0;)
            g += idx[k] * stride, stride *= s.shape[k];
        const double v = value(s.id, g);
        if (s.dtype == DType::f32)
            b.ptr<float>()[i] = static_cast<float>(v);
        else if (s.dtype == DType::bf16)
            b.ptr<uint16_t>()[i] = float_to_bf16(static_cast<float>(v));
        else
            b.ptr<int64_t>()[i] = static_cast<int64_t>(v);
    }
    return b;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
    return a.shape == b.shape && a.dtype == b.dtype &&
           std::equal(static_cast<const char*>(a.data),
                      static_cast<const char*>(a.data) + a.bytes(),
                      static_cast<const char*>(b.data));
}

struct Fixture {
    int n = hymoe::testing::world_size();
    parallel::Grid g = parallel::make_grid(parallel::Layout{n, 1, 1, 1, 1});
    int r = g.rank;
    std::string root =
        (fs::temp_directory_path() /
         ("hymoe_ckpt_" + std::to_string(comm::broadcast_value(getpid(), 0, g.comms.world))))
            .string();
    std::vector<Spec> specs = {
        {"a", 0, DType::f32, {4 * n, 24}},           // split along dim 0
        {"b", 1, DType::bf16, {5, 3 * n}},           // split along dim 1
        {"opt/c", 2, DType::f32, {7}},               // whole, held by all
        {"d", 3, DType::i64, {3 + 2 * (n - 1), 2}},  // uneven split along dim 0
        {"e", 4, DType::f32, {3, 3}},                // whole, held by the last rank only
        {"f", 5, DType::f32, {2, 3, 4 * n}},         // split along its last dim
        {"s", 6, DType::i64, {}},                    // a scalar
    };
    std::vector<Buffer> held;

    Fixture() {
        if (r == 0)
            fs::remove_all(root);
        comm::barrier(g.comms.world);
    }
    ~Fixture() {
        comm::barrier(g.comms.world);
        if (r == 0)
            fs::remove_all(root);
    }
    // This rank's entries as a trainer at this layout holds them.
    std::vector<io::CkptEntry> entries() {
        held.clear();
        std::vector<io::CkptEntry> out;
        auto add = [&](const Spec& s, int dim, int64_t begin, int64_t rows, bool writer) {
            held.push_back(make_slice(s, dim, begin, rows));
            const std::string file = s.name == "e" ? "last.h5" : "";  // a file one rank writes
            out.push_back(
                {s.name, held.back().view(), dim, begin, dim < 0 ? 0 : s.shape[dim], writer, file});
        };
        held.reserve(8);
        add(specs[0], 0, 4 * r, 4, true);
        add(specs[1], 1, 3 * r, 3, true);
        add(specs[2], -1, 0, 0, r == n - 1);  // the last rank writes it
        add(specs[3], 0, r == 0 ? 0 : 3 + 2 * (r - 1), r == 0 ? 3 : 2, true);
        if (r == n - 1)
            add(specs[4], -1, 0, 0, true);
        add(specs[5], 2, 4 * r, 4, true);
        add(specs[6], -1, 0, 0, r == 0);
        return out;
    }
};

// Entries of the specs to load into: every tensor at (dim, begin, rows) with the given dtype.
struct Target {
    std::vector<Buffer> bufs;
    std::vector<io::CkptEntry> entries;
    void add(const Spec& s, int dim, int64_t begin, int64_t rows, DType dtype) {
        Shape local = s.shape;
        if (dim >= 0)
            local[dim] = rows;
        bufs.emplace_back(dtype, local);
        entries.push_back(
            {s.name, bufs.back().view(), dim, begin, dim < 0 ? 0 : s.shape[dim], true, ""});
    }
};

// Whether load threw a collective Exit::checkpoint error containing every one of `words`.
bool fails_naming(const std::function<void()>& load, const std::vector<std::string>& words) {
    try {
        load();
    } catch (const Error& e) {
        bool ok = e.code() == Exit::checkpoint && e.scope() == Scope::collective;
        for (const std::string& w : words)
            ok = ok && std::string(e.what()).find(w) != std::string::npos;
        if (!ok)
            BOOST_TEST_MESSAGE(e.what());
        return ok;
    }
    return false;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(checkpoint)

BOOST_FIXTURE_TEST_CASE(round_trip_at_the_same_layout_is_bit_exact, Fixture) {
    std::vector<io::CkptEntry> saved = entries();
    io::save_checkpoint(g.comms.world, root, 3, saved, R"({"step": 3, "rng": [1, 2]})", 2);
    const std::string dir = io::latest_checkpoint(root);
    bool ok = dir == root + "/step_3" && fs::exists(dir + "/tensors.h5") &&
              fs::exists(dir + "/last.h5") && !fs::exists(root + "/step_3.partial");
    Target t;
    t.add(specs[0], 0, 4 * r, 4, DType::f32);
    t.add(specs[1], 1, 3 * r, 3, DType::bf16);
    t.add(specs[2], -1, 0, 0, DType::f32);
    t.add(specs[3], 0, r == 0 ? 0 : 3 + 2 * (r - 1), r == 0 ? 3 : 2, DType::i64);
    if (r == n - 1)
        t.add(specs[4], -1, 0, 0, DType::f32);
    t.add(specs[5], 2, 4 * r, 4, DType::f32);
    t.add(specs[6], -1, 0, 0, DType::i64);
    std::string state;
    io::load_checkpoint(g.comms.world, dir, t.entries, state);
    ok = ok && state == R"({"step": 3, "rng": [1, 2]})";
    for (size_t i = 0; i < t.entries.size(); ++i)
        ok = ok && same_bytes(t.entries[i].local, saved[i].local);
    BOOST_TEST(all_ranks(ok));
}

BOOST_FIXTURE_TEST_CASE(load_at_other_splits_gives_the_same_values, Fixture) {
    io::save_checkpoint(g.comms.world, root, 1, entries(), "{}", 0);
    const int q = n - 1 - r;  // ranks reversed
    Target t;
    t.add(specs[0], 1, 24 / n * q, 24 / n, DType::f32);  // saved along dim 0, read along dim 1
    t.add(specs[0], 0, 4 * q, 4, DType::f32);
    t.add(specs[1], -1, 0, 0, DType::f32);  // bf16 widened, whole
    t.add(specs[3], -1, 0, 0, DType::i64);
    t.add(specs[4], -1, 0, 0, DType::f32);     // every rank reads what one rank saved
    t.add(specs[2], 0, 0, 3, DType::f32);      // saved whole, read in part
    t.add(specs[5], 0, q % 2, 1, DType::f32);  // saved along dim 2, read along dim 0
    t.add(specs[6], -1, 0, 0, DType::i64);
    std::string state;
    io::load_checkpoint(g.comms.world, root + "/step_1", t.entries, state);
    std::vector<Buffer> want;
    want.push_back(make_slice(specs[0], 1, 24 / n * q, 24 / n));
    want.push_back(make_slice(specs[0], 0, 4 * q, 4));
    Buffer b_bits = make_slice(specs[1], -1, 0, 0);
    want.emplace_back(DType::f32, specs[1].shape);
    for (int64_t i = 0; i < shape_numel(specs[1].shape); ++i)
        want.back().ptr<float>()[i] = bf16_to_float(b_bits.ptr<uint16_t>()[i]);
    want.push_back(make_slice(specs[3], -1, 0, 0));
    want.push_back(make_slice(specs[4], -1, 0, 0));
    want.push_back(make_slice(specs[2], 0, 0, 3));
    want.push_back(make_slice(specs[5], 0, q % 2, 1));
    want.push_back(make_slice(specs[6], -1, 0, 0));
    bool ok = true;
    for (size_t i = 0; i < want.size(); ++i)
        ok = ok && same_bytes(t.entries[i].local, want[i].view());
    BOOST_TEST(all_ranks(ok));
}

BOOST_FIXTURE_TEST_CASE(keep_prunes_and_latest_finds_the_newest_complete, Fixture) {
    for (int64_t step : {10, 20, 30})
        io::save_checkpoint(g.comms.world, root, step, entries(), "{}", 2);
    bool ok = !fs::exists(root + "/step_10") && fs::exists(root + "/step_20") &&
              io::latest_checkpoint(root) == root + "/step_30";
    comm::barrier(g.comms.world);
    if (r == 0) {  // an interrupted write of step 40, and `latest` naming a step that is gone
        fs::create_directories(root + "/step_40.partial");
        std::ofstream(root + "/step_40.partial/tensors.h5.partial") << "half";
        std::ofstream(root + "/latest") << "step_40\n";
    }
    comm::barrier(g.comms.world);
    ok = ok && io::latest_checkpoint(root) == root + "/step_30";
    comm::barrier(g.comms.world);
    if (r == 0)
        fs::remove(root + "/latest");
    comm::barrier(g.comms.world);
    ok = ok && io::latest_checkpoint(root) == root + "/step_30" &&
         io::latest_checkpoint(root + "/nothing") == "";
    io::save_checkpoint(g.comms.world, root, 50, entries(), "{}", 2);  // clears step_40.partial
    ok = ok && !fs::exists(root + "/step_40.partial") && !fs::exists(root + "/step_20") &&
         io::latest_checkpoint(root) == root + "/step_50";
    BOOST_TEST(all_ranks(ok));
}

// `best` names the step it was last pointed at; `keep` never prunes that one, and prunes it as any
// other once `best` moves on.
BOOST_FIXTURE_TEST_CASE(the_best_checkpoint_outlives_keep, Fixture) {
    auto best = [&] {
        std::string named;
        std::ifstream(root + "/best") >> named;
        return named;
    };
    io::save_checkpoint(g.comms.world, root, 10, entries(), "{}", 2, true);
    for (int64_t step : {20, 30, 40})
        io::save_checkpoint(g.comms.world, root, step, entries(), "{}", 2);
    bool ok = best() == "step_10" && fs::exists(root + "/step_10/manifest.json") &&
              !fs::exists(root + "/step_20") && fs::exists(root + "/step_30") &&
              io::latest_checkpoint(root) == root + "/step_40";
    io::save_checkpoint(g.comms.world, root, 50, entries(), "{}", 2, true);
    io::save_checkpoint(g.comms.world, root, 60, entries(), "{}", 2);
    ok = ok && best() == "step_50" && !fs::exists(root + "/step_10") &&
         fs::exists(root + "/step_50") && io::latest_checkpoint(root) == root + "/step_60";
    io::save_checkpoint(g.comms.world, root, 70, entries(), "{}", 2);
    io::save_checkpoint(g.comms.world, root, 80, entries(), "{}", 2);
    ok = ok && fs::exists(root + "/step_50/manifest.json") && !fs::exists(root + "/step_60");
    BOOST_TEST(all_ranks(ok));
}

BOOST_FIXTURE_TEST_CASE(damaged_or_mismatched_checkpoints_fail_with_exit_4, Fixture) {
    io::save_checkpoint(g.comms.world, root, 1, entries(), "{}", 0);
    const std::string dir = root + "/step_1", file = dir + "/tensors.h5";
    std::string state;
    auto load = [&](const Spec& s, Shape shape) {
        return [&, s, shape] {
            Target t;
            Spec changed = s;
            changed.shape = shape;
            t.add(changed, -1, 0, 0, s.dtype);
            io::load_checkpoint(g.comms.world, dir, t.entries, state);
        };
    };
    BOOST_TEST(all_ranks(fails_naming(load(specs[0], {4 * n, 25}), {"tensor a", file})));
    BOOST_TEST(all_ranks(fails_naming(load({"zz", 9, DType::f32, {1}}, {1}), {"zz", dir})));

    comm::barrier(g.comms.world);
    if (r == 0) {  // flip one byte of the data of "d"
        hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
        hid_t d = H5Dopen2(f, "/d", H5P_DEFAULT);
        const haddr_t at = H5Dget_offset(d);
        H5Dclose(d);
        H5Fclose(f);
        std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
        io.seekg(static_cast<std::streamoff>(at + 9));
        char c = 0;
        io.get(c);
        io.seekp(static_cast<std::streamoff>(at + 9));
        io.put(static_cast<char>(c ^ 0x10));
    }
    comm::barrier(g.comms.world);
    BOOST_TEST(
        all_ranks(fails_naming(load(specs[3], specs[3].shape), {"tensor d", file, "checksum"})));
    BOOST_TEST(all_ranks(fails_naming(load(specs[0], specs[0].shape), {}) == false));

    comm::barrier(g.comms.world);
    if (r == 0)
        fs::resize_file(file, fs::file_size(file) / 2);
    comm::barrier(g.comms.world);
    BOOST_TEST(all_ranks(fails_naming(load(specs[0], specs[0].shape), {"tensor a", file})));

    comm::barrier(g.comms.world);
    if (r == 0)
        fs::remove(dir + "/manifest.json");
    comm::barrier(g.comms.world);
    BOOST_TEST(all_ranks(fails_naming(load(specs[0], specs[0].shape), {dir + "/manifest.json"})));
}

// The kill drill's writer (tests/e2e/test_checkpoint_drills.cpp): only with HYMOE_CKPT_DRILL set.
BOOST_AUTO_TEST_CASE(writer_loop) {
    const char* dir = std::getenv("HYMOE_CKPT_DRILL");
    if (!dir)
        return;
    const int64_t n = 4 << 20;  // 16 MiB per step, the value of element 0 is the step
    Buffer big(DType::f32, {n});
    for (int64_t step = 1;; ++step) {
        std::fill_n(big.ptr<float>(), n, static_cast<float>(step));
        io::save_checkpoint(comm::self_comm(),
                            dir,
                            step,
                            {{"w", big.view(), -1, 0, 0, true, ""}},
                            "{\"step\": " + std::to_string(step) + "}",
                            2);
    }
}

BOOST_AUTO_TEST_SUITE_END()
