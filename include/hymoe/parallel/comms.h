// The communicators of one rank, built from the pure grid arithmetic in grid.h: world, tp, dp,
// pp (with the previous and next pipeline stage), ep, etp and edp, and self (this rank alone, for
// files one rank writes). Passed explicitly, never global.
#pragma once

#include "hymoe/parallel/comm.h"
#include "hymoe/parallel/grid.h"

namespace hymoe::parallel {

struct Comms {
    comm::Comm world, tp, dp, pp, ep, etp, edp, self;
    int pp_prev = -1, pp_next = -1;  // ranks in pp of the neighbouring stages (-1 at the ends)
    const comm::Comm& of(Group g) const;
    comm::Comm& of(Group g);
};

struct Grid {
    Layout layout;
    int rank = 0;  // world rank
    Coords me;
    Comms comms;
};

// Collective over the world: splits it into every group kind. Call after check_layout().
Grid make_grid(const Layout& layout);

}  // namespace hymoe::parallel
