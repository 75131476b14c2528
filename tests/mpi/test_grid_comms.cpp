// The MPI communicators of the grid at every layout the world size allows: each communicator's
// size, the rank's position in it, and its members (gathered over it) equal the pure grid math.
#include <vector>

#include <boost/test/unit_test.hpp>

#include "../testing.h"
#include "hymoe/parallel/comms.h"

using hymoe::parallel::Group;
using hymoe::parallel::Layout;
using hymoe::testing::all_ranks;
using hymoe::testing::world_size;

namespace {

// Every (tp, dp, pp, ep, etp) with tp·dp·pp = world and ep·etp dividing tp·dp.
std::vector<Layout> layouts_for(int world) {
    std::vector<Layout> out;
    for (int tp = 1; tp <= world; ++tp)
        for (int dp = 1; tp * dp <= world; ++dp)
            for (int ep = 1; ep <= tp * dp; ++ep)
                for (int etp = 1; ep * etp <= tp * dp; ++etp)
                    if (world % (tp * dp) == 0 && (tp * dp) % (ep * etp) == 0)
                        out.push_back(Layout{tp, dp, world / (tp * dp), ep, etp});
    return out;
}

bool members_match(const hymoe::comm::Comm& c, const std::vector<int>& expect, int rank) {
    hymoe::Buffer mine(hymoe::DType::i32, {1});
    *mine.ptr<int32_t>() = rank;
    hymoe::Buffer all(hymoe::DType::i32, {c.size()});
    hymoe::comm::all_gather(mine.view(), all.view(), c);
    return std::vector<int>(all.ptr<int32_t>(), all.ptr<int32_t>() + c.size()) == expect;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(grid_comms)

BOOST_AUTO_TEST_CASE(every_layout_of_this_world) {
    const int world = world_size();
    std::vector<Layout> layouts = layouts_for(world);
    BOOST_TEST(!layouts.empty());
    for (const Layout& l : layouts) {
        hymoe::parallel::Grid g = hymoe::parallel::make_grid(l);
        bool ok = g.comms.world.size() == world;
        for (Group kind : hymoe::parallel::kGroups) {
            const hymoe::comm::Comm& c = g.comms.of(kind);
            ok = ok && c.size() == hymoe::parallel::group_size(l, kind);
            ok = ok && c.rank() == hymoe::parallel::group_position(l, kind, g.rank);
            ok = members_match(c, hymoe::parallel::group_members(l, kind, g.rank), g.rank) && ok;
        }
        ok = ok && g.comms.pp_prev == (g.me.pp > 0 ? g.me.pp - 1 : -1);
        BOOST_TEST_INFO("tp" << l.tp << " dp" << l.dp << " pp" << l.pp << " ep" << l.ep << " etp"
                             << l.etp);
        BOOST_TEST(all_ranks(ok));
    }
}

BOOST_AUTO_TEST_SUITE_END()
