// Helpers shared by the test suites: MPI preconditions and shared verdicts (a check every rank
// agrees on, so that no rank stops early and leaves the others in a collective), and paths.
#pragma once

#include <string>

#include <boost/test/unit_test.hpp>
#include <mpi.h>

namespace hymoe::testing {

inline int world_rank() {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}
inline int world_size() {
    int n = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
}
// True on every rank iff ok is true on every rank.
inline bool all_ranks(bool ok) {
    int v = ok ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    return v != 0;
}
// Precondition: the test needs a world of at least n ranks (skipped, with a reason, otherwise).
struct min_ranks {
    int n;
    boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id) const {
        boost::test_tools::assertion_result r(world_size() >= n);
        r.message() << "needs at least " << n << " ranks";
        return r;
    }
};

}  // namespace hymoe::testing
