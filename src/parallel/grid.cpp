// Rank-grid arithmetic (formulas in grid.h) and the layout checks that need only the world size.
#include "hymoe/parallel/grid.h"

#include <cstdio>

#include "hymoe/core/error.h"
#include "hymoe/deck/deck.h"

namespace hymoe::parallel {

const char* to_string(Group g) {
    switch (g) {
        case Group::tp:
            return "tp";
        case Group::dp:
            return "dp";
        case Group::pp:
            return "pp";
        case Group::ep:
            return "ep";
        case Group::etp:
            return "etp";
        case Group::edp:
            return "edp";
    }
    return "?";
}

Coords coords_of(const Layout& l, int rank) {
    Coords c;
    int stage_size = l.tp * l.dp;
    c.pp = rank / stage_size;
    int local = rank % stage_size;  // position inside the pipeline stage
    c.tp = local % l.tp;
    c.dp = local / l.tp;
    c.etp = local % l.etp;
    c.ep = (local / l.etp) % l.ep;
    c.edp = local / (l.etp * l.ep);
    return c;
}

int rank_of_dense(const Layout& l, int tp, int dp, int pp) {
    return tp + l.tp * (dp + l.dp * pp);
}

int rank_of_expert(const Layout& l, int etp, int ep, int edp, int pp) {
    return etp + l.etp * (ep + l.ep * (edp + l.edp() * pp));
}

int group_size(const Layout& l, Group g) {
    switch (g) {
        case Group::tp:
            return l.tp;
        case Group::dp:
            return l.dp;
        case Group::pp:
            return l.pp;
        case Group::ep:
            return l.ep;
        case Group::etp:
            return l.etp;
        case Group::edp:
            return l.edp();
    }
    return 0;
}

int group_count(const Layout& l, Group g) {
    return l.world() / group_size(l, g);
}

int group_position(const Layout& l, Group g, int rank) {
    Coords c = coords_of(l, rank);
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
    return 0;
}

// The member at position 0 identifies the group; groups are numbered by their first member's
// rank order, so indices are dense in [0, group_count).
int group_index(const Layout& l, Group g, int rank) {
    Coords c = coords_of(l, rank);
    switch (g) {
        case Group::tp:
            return c.dp + l.dp * c.pp;
        case Group::dp:
            return c.tp + l.tp * c.pp;
        case Group::pp:
            return c.tp + l.tp * c.dp;
        case Group::ep:
            return c.etp + l.etp * (c.edp + l.edp() * c.pp);
        case Group::etp:
            return c.ep + l.ep * (c.edp + l.edp() * c.pp);
        case Group::edp:
            return c.etp + l.etp * (c.ep + l.ep * c.pp);
    }
    return 0;
}

std::vector<int> group_members(const Layout& l, Group g, int rank) {
    Coords c = coords_of(l, rank);
    std::vector<int> m;
    for (int i = 0; i < group_size(l, g); ++i) {
        switch (g) {
            case Group::tp:
                m.push_back(rank_of_dense(l, i, c.dp, c.pp));
                break;
            case Group::dp:
                m.push_back(rank_of_dense(l, c.tp, i, c.pp));
                break;
            case Group::pp:
                m.push_back(rank_of_dense(l, c.tp, c.dp, i));
                break;
            case Group::ep:
                m.push_back(rank_of_expert(l, c.etp, i, c.edp, c.pp));
                break;
            case Group::etp:
                m.push_back(rank_of_expert(l, i, c.ep, c.edp, c.pp));
                break;
            case Group::edp:
                m.push_back(rank_of_expert(l, c.etp, c.ep, i, c.pp));
                break;
        }
    }
    return m;
}

void check_layout(const Layout& l, int world, const deck::Deck& deck) {
    if (l.world() != world)
        HYMOE_FAIL(Exit::invalid,
                   deck.locate("parallel"),
                   ": tp·dp·pp = ",
                   l.tp,
                   "·",
                   l.dp,
                   "·",
                   l.pp,
                   " = ",
                   l.world(),
                   " but the job runs on ",
                   world,
                   world == 1 ? " rank" : " ranks",
                   " (launch with mpirun -np ",
                   l.world(),
                   " or change the layout)");
    int stage = l.tp * l.dp;
    if (stage % (l.etp * l.ep) != 0)
        HYMOE_FAIL(Exit::invalid,
                   deck.locate("parallel.ep"),
                   ": etp·ep = ",
                   l.etp,
                   "·",
                   l.ep,
                   " = ",
                   l.etp * l.ep,
                   " does not divide tp·dp = ",
                   stage,
                   " (the expert grid folds into the ranks of one pipeline stage)");
}

std::string grid_table(const Layout& l) {
    std::string out = "grid: world " + std::to_string(l.world()) + " = tp " + std::to_string(l.tp) +
                      " x dp " + std::to_string(l.dp) + " x pp " + std::to_string(l.pp) +
                      "; experts: etp " + std::to_string(l.etp) + " x ep " + std::to_string(l.ep) +
                      " x edp " + std::to_string(l.edp()) + " x pp " + std::to_string(l.pp) + "\n";
    char line[160];
    std::snprintf(line,
                  sizeof line,
                  "  %-5s %6s %6s  %s\n",
                  "comm",
                  "size",
                  "count",
                  "members of rank 0's group");
    out += line;
    for (Group g : kGroups) {
        std::string members;
        for (int r : group_members(l, g, 0))
            members += (members.empty() ? "" : " ") + std::to_string(r);
        if (members.size() > 80)
            members = members.substr(0, members.rfind(' ', 76)) + " ...";
        std::snprintf(line,
                      sizeof line,
                      "  %-5s %6d %6d  %s\n",
                      to_string(g),
                      group_size(l, g),
                      group_count(l, g),
                      members.c_str());
        out += line;
    }
    return out;
}

}  // namespace hymoe::parallel
