// Parallel HDF5: a collective write through MPI-IO (each rank its rows) plus /meta, committed
// atomically (nothing under the real name before commit), then read back serially.
#include <filesystem>

#include <boost/test/unit_test.hpp>

#include "../testing.h"
#include "hymoe/core/sha256.h"
#include "hymoe/deck/deck.h"
#include "hymoe/io/h5.h"
#include "hymoe/io/meta.h"
#include "hymoe/parallel/comms.h"

namespace fs = std::filesystem;
using hymoe::testing::all_ranks;

BOOST_AUTO_TEST_SUITE(h5)

BOOST_AUTO_TEST_CASE(collective_rows_and_meta_round_trip) {
    const int n = hymoe::testing::world_size();
    auto g = hymoe::parallel::make_grid(hymoe::parallel::Layout{n, 1, 1, 1, 1});
    std::string dir = (fs::temp_directory_path() / "hymoe_h5_test").string();
    std::string path = dir + "/x.h5";
    if (g.rank == 0) {
        fs::remove_all(dir);
        fs::create_directories(dir);
    }
    hymoe::comm::barrier(g.comms.world);
    hymoe::deck::Deck deck = hymoe::deck::parse_deck(
        "job: {kind: plan}\nmodel: {preset: tiny}\n", dir + "/deck.yaml", {});
    {
        hymoe::io::H5Writer file(path, g.comms.world);
        hymoe::io::write_meta(file, {&deck, g.layout, "tiny model", "2026-01-01T00:00:00Z"});
        hymoe::Buffer rows(hymoe::DType::f32, {2, 3});  // rank r writes rows 2r, 2r+1
        for (int k = 0; k < 6; ++k)
            rows.ptr<float>()[k] = static_cast<float>(100 * g.rank + k);
        file.rows("/data/x", rows.view(), 2 * g.rank, 2 * n);
        file.attr("/data/x", "unit", "none");
        BOOST_TEST(all_ranks(!fs::exists(path) && fs::exists(path + ".partial")));
        file.commit();
    }
    bool ok = fs::exists(path) && !fs::exists(path + ".partial");
    hymoe::comm::barrier(g.comms.world);  // every rank has looked before rank 0 cleans up
    if (g.rank == 0) {
        hymoe::io::H5Reader r(path);
        ok = ok && r.shape("/data/x") == hymoe::Shape({2 * n, 3});
        std::vector<float> x = r.floats("/data/x");
        for (int s = 0; s < n; ++s)
            for (int k = 0; k < 6; ++k)
                ok = ok && x[6 * s + k] == static_cast<float>(100 * s + k);
        ok = ok && r.attr("/data/x", "unit") == "none";
        ok = ok && r.text("/meta/deck") == deck.text;
        ok = ok && r.text("/meta/deck_sha256") == hymoe::sha256_hex(deck.text);
        ok = ok && r.text("/meta/deck_resolved") == deck.resolved_yaml;
        ok = ok && r.text("/meta/model") == "tiny model";
        std::vector<int64_t> dims = r.ints("/meta/grid_tp_dp_pp_ep_etp_edp");
        ok = ok && dims == std::vector<int64_t>({n, 1, 1, 1, 1, n});
        ok = ok && !r.text("/meta/build/git_sha").empty();
        fs::remove_all(dir);
    }
    BOOST_TEST(all_ranks(ok));
}

BOOST_AUTO_TEST_SUITE_END()
