// The rank grid: two factorisations of the same ranks (MoE parallel folding, as Megatron-Core).
//
//   dense grid   world = tp × dp × pp
//                rank  = tp_rank + tp·(dp_rank + dp·pp_rank)                     (tp fastest)
//   expert grid  world = etp × ep × edp × pp,   edp = tp·dp / (etp·ep)
//                rank  = etp_rank + etp·(ep_rank + ep·(edp_rank + edp·pp_rank))  (etp fastest)
//
// Both share pp: a pipeline stage is the block of tp·dp consecutive ranks. Attention and dense
// FFNs use tp (within dp replicas); experts are sharded over ep, each split over etp, and
// replicated over edp. Everything here is pure arithmetic, testable without MPI.
#pragma once

#include <string>
#include <vector>

namespace hymoe::deck {
struct Deck;
}

namespace hymoe::parallel {

struct Layout {
    int tp = 1, dp = 1, pp = 1, ep = 1, etp = 1;
    int world() const { return tp * dp * pp; }
    int edp() const { return tp * dp / (etp * ep); }
};

// One rank's coordinate in every dimension.
struct Coords {
    int tp = 0, dp = 0, pp = 0;    // dense grid
    int etp = 0, ep = 0, edp = 0;  // expert grid (same pp)
};

// The communicator kinds; each rank belongs to exactly one group of each kind.
enum class Group { tp, dp, pp, ep, etp, edp };
constexpr Group kGroups[] = {Group::tp, Group::dp, Group::pp, Group::ep, Group::etp, Group::edp};
const char* to_string(Group g);

Coords coords_of(const Layout& layout, int rank);
int rank_of_dense(const Layout& layout, int tp, int dp, int pp);
int rank_of_expert(const Layout& layout, int etp, int ep, int edp, int pp);

int group_size(const Layout& layout, Group g);
int group_count(const Layout& layout, Group g);  // world / group_size
// Which group of kind g the rank is in (0 .. group_count-1) and its position inside it.
int group_index(const Layout& layout, Group g, int rank);
int group_position(const Layout& layout, Group g, int rank);
// World ranks of the rank's group of kind g, ordered by position.
std::vector<int> group_members(const Layout& layout, Group g, int rank);

// Checks every size and divisibility rule of the grid itself against the world size; each
// failure is one Exit::invalid sentence naming the deck key (deck.locate) and the numbers.
void check_layout(const Layout& layout, int world, const deck::Deck& deck);

// The log's grid table: one row per communicator kind (size, count, members of rank 0's group).
std::string grid_table(const Layout& layout);

}  // namespace hymoe::parallel
