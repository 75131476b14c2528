// Grid arithmetic without MPI: coordinates and group membership for 30+ layouts up to 64 ranks,
// checked against an independent enumeration of both grids and against hand-written groups.
#include <algorithm>
#include <array>
#include <set>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/parallel/grid.h"

using hymoe::parallel::Coords;
using hymoe::parallel::Group;
using hymoe::parallel::kGroups;
using hymoe::parallel::Layout;

namespace {

// Every (tp, dp, pp, ep, etp) with world ≤ 64 that the grid accepts, thinned to a fixed sample.
std::vector<Layout> sample_layouts() {
    std::vector<Layout> all;
    for (int tp : {1, 2, 4, 8})
        for (int dp : {1, 2, 3, 4, 8})
            for (int pp : {1, 2, 4})
                for (int ep : {1, 2, 4, 8})
                    for (int etp : {1, 2, 4})
                        if (tp * dp * pp <= 64 && (tp * dp) % (ep * etp) == 0)
                            all.push_back(Layout{tp, dp, pp, ep, etp});
    return all;
}

// Coordinates by walking the grids in rank order: dense (pp, dp, tp) and expert (pp, edp, ep,
// etp), innermost fastest. Independent of grid.cpp's division arithmetic.
std::vector<Coords> enumerate(const Layout& l) {
    std::vector<Coords> c(l.world());
    int r = 0;
    for (int pp = 0; pp < l.pp; ++pp)
        for (int dp = 0; dp < l.dp; ++dp)
            for (int tp = 0; tp < l.tp; ++tp, ++r)
                c[r].tp = tp, c[r].dp = dp, c[r].pp = pp;
    r = 0;
    for (int pp = 0; pp < l.pp; ++pp)
        for (int edp = 0; edp < l.edp(); ++edp)
            for (int ep = 0; ep < l.ep; ++ep)
                for (int etp = 0; etp < l.etp; ++etp, ++r)
                    c[r].edp = edp, c[r].ep = ep, c[r].etp = etp;
    return c;
}

int coord(const Coords& c, Group g) {
    switch (g) {
        case Group::tp:
            return c.tp;
        case Group::dp:
            return c.dp;
        case Group::pp:
            return c.pp;
        case Group::ep:
            return c.ep;
        case Group::etp:
            return c.etp;
        case Group::edp:
            return c.edp;
    }
    return -1;
}

// Members of a group share every coordinate of their grid except the group's own one.
bool same_group(const Coords& a, const Coords& b, Group g) {
    bool dense = g == Group::tp || g == Group::dp || g == Group::pp;
    std::array<Group, 3> dims = {Group::tp, Group::dp, Group::pp};
    std::array<Group, 4> edims = {Group::etp, Group::ep, Group::edp, Group::pp};
    if (dense)
        return std::all_of(dims.begin(), dims.end(), [&](Group d) {
            return d == g || coord(a, d) == coord(b, d);
        });
    return std::all_of(
        edims.begin(), edims.end(), [&](Group d) { return d == g || coord(a, d) == coord(b, d); });
}

}  // namespace

BOOST_AUTO_TEST_SUITE(grid)

BOOST_AUTO_TEST_CASE(at_least_25_layouts_match_the_enumeration) {
    std::vector<Layout> layouts = sample_layouts();
    BOOST_TEST(layouts.size() >= 25u);
    for (const Layout& l : layouts) {
        std::vector<Coords> expect = enumerate(l);
        for (int r = 0; r < l.world(); ++r) {
            Coords c = hymoe::parallel::coords_of(l, r);
            BOOST_TEST_INFO("layout tp" << l.tp << " dp" << l.dp << " pp" << l.pp << " ep" << l.ep
                                        << " etp" << l.etp << " rank " << r);
            BOOST_TEST((c.tp == expect[r].tp && c.dp == expect[r].dp && c.pp == expect[r].pp));
            BOOST_TEST((c.etp == expect[r].etp && c.ep == expect[r].ep && c.edp == expect[r].edp));
            BOOST_TEST(hymoe::parallel::rank_of_dense(l, c.tp, c.dp, c.pp) == r);
            BOOST_TEST(hymoe::parallel::rank_of_expert(l, c.etp, c.ep, c.edp, c.pp) == r);
        }
    }
}

BOOST_AUTO_TEST_CASE(groups_partition_the_world) {
    for (const Layout& l : sample_layouts()) {
        std::vector<Coords> expect = enumerate(l);
        for (Group g : kGroups) {
            std::vector<int> seen(l.world(), 0);
            std::set<int> indices;
            for (int r = 0; r < l.world(); ++r) {
                std::vector<int> m = hymoe::parallel::group_members(l, g, r);
                BOOST_TEST_INFO("tp" << l.tp << " dp" << l.dp << " pp" << l.pp << " ep" << l.ep
                                     << " etp" << l.etp << " " << to_string(g) << " rank " << r);
                BOOST_TEST(static_cast<int>(m.size()) == hymoe::parallel::group_size(l, g));
                int pos = hymoe::parallel::group_position(l, g, r);
                BOOST_TEST(m.at(pos) == r);
                int index = hymoe::parallel::group_index(l, g, r);
                BOOST_TEST((index >= 0 && index < hymoe::parallel::group_count(l, g)));
                indices.insert(index);
                for (size_t i = 0; i < m.size(); ++i) {
                    BOOST_TEST(same_group(expect[m[i]], expect[r], g));
                    BOOST_TEST(coord(expect[m[i]], g) == static_cast<int>(i));
                    BOOST_TEST(hymoe::parallel::group_index(l, g, m[i]) == index);
                }
                if (pos == 0)
                    for (int x : m)
                        ++seen[x];
            }
            BOOST_TEST(static_cast<int>(indices.size()) == hymoe::parallel::group_count(l, g));
            BOOST_TEST(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
        }
    }
}

BOOST_AUTO_TEST_CASE(hand_checked_groups_tp2_dp2_pp2_ep2) {
    Layout l{2, 2, 2, 2, 1};  // world 8, edp = 2
    using hymoe::parallel::group_members;
    BOOST_TEST(group_members(l, Group::tp, 5) == (std::vector<int>{4, 5}));
    BOOST_TEST(group_members(l, Group::dp, 5) == (std::vector<int>{5, 7}));
    BOOST_TEST(group_members(l, Group::pp, 5) == (std::vector<int>{1, 5}));
    BOOST_TEST(group_members(l, Group::ep, 5) == (std::vector<int>{4, 5}));
    BOOST_TEST(group_members(l, Group::edp, 5) == (std::vector<int>{5, 7}));
    BOOST_TEST(group_members(l, Group::etp, 5) == (std::vector<int>{5}));
}

BOOST_AUTO_TEST_CASE(hand_checked_groups_tp4_dp2_ep4_etp2) {
    Layout l{4, 2, 1, 4, 2};  // world 8, edp = 1: ep·etp spans the stage
    using hymoe::parallel::group_members;
    BOOST_TEST(group_members(l, Group::tp, 6) == (std::vector<int>{4, 5, 6, 7}));
    BOOST_TEST(group_members(l, Group::dp, 6) == (std::vector<int>{2, 6}));
    BOOST_TEST(group_members(l, Group::etp, 6) == (std::vector<int>{6, 7}));
    BOOST_TEST(group_members(l, Group::ep, 6) == (std::vector<int>{0, 2, 4, 6}));
    BOOST_TEST(group_members(l, Group::edp, 6) == (std::vector<int>{6}));
}

BOOST_AUTO_TEST_CASE(hand_checked_groups_tp2_dp4_pp2_ep4_etp1) {
    Layout l{2, 4, 2, 4, 1};  // world 16, edp = 2
    using hymoe::parallel::group_members;
    BOOST_TEST(group_members(l, Group::ep, 13) == (std::vector<int>{12, 13, 14, 15}));
    BOOST_TEST(group_members(l, Group::edp, 13) == (std::vector<int>{9, 13}));
    BOOST_TEST(group_members(l, Group::dp, 13) == (std::vector<int>{9, 11, 13, 15}));
    BOOST_TEST(group_members(l, Group::pp, 13) == (std::vector<int>{5, 13}));
}

BOOST_AUTO_TEST_CASE(grid_table_lists_every_kind) {
    std::string t = hymoe::parallel::grid_table(Layout{2, 2, 2, 2, 1});
    for (const char* kind : {"tp", "dp", "pp", "ep", "etp", "edp"})
        BOOST_TEST(t.find(std::string("\n  ") + kind + " ") != std::string::npos);
    BOOST_TEST(t.find("world 8 = tp 2 x dp 2 x pp 2") != std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()
