// MPI start-up and shut-down, world-level helpers, and the communicators of the rank grid.
#include "hymoe/parallel/mpi_env.h"

#include <cstdio>
#include <cstdlib>
#include <vector>

#include <mpi.h>

#include "comm_impl.h"
#include "hymoe/core/allocator.h"
#include "hymoe/parallel/comms.h"

namespace hymoe::parallel {

MpiEnv::MpiEnv(int* argc, char*** argv) {
    reuse_freed_memory();  // before MPI and the model allocate (core/allocator.h)
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS ||
        provided < MPI_THREAD_FUNNELED) {
        std::fprintf(stderr, "hymoe: MPI could not start with MPI_THREAD_FUNNELED support\n");
        std::exit(1);
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}

MpiEnv::~MpiEnv() {
    MPI_Finalize();
}

int world_rank() {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

int world_size() {
    int n = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
}

void abort_world(int code) {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort does not return; this keeps [[noreturn]] honest
}

std::string broadcast_bytes(const std::string& bytes, int root) {
    long long n = static_cast<long long>(bytes.size());
    HYMOE_MPI_CHECK(MPI_Bcast(&n, 1, MPI_LONG_LONG, root, MPI_COMM_WORLD), "size broadcast");
    std::string out = world_rank() == root ? bytes : std::string(static_cast<size_t>(n), '\0');
    HYMOE_CHECK(n <= INT32_MAX, "broadcast of ", n, " bytes");
    HYMOE_MPI_CHECK(MPI_Bcast(out.data(), static_cast<int>(n), MPI_CHAR, root, MPI_COMM_WORLD),
                    "bytes broadcast");
    return out;
}

int first_failed_rank(bool failed) {
    int r = failed ? world_rank() : world_size();
    HYMOE_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &r, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD),
                    "agreement on the first failed rank");
    return r;
}

bool all_ranks(bool ok) {
    int v = ok ? 1 : 0;
    HYMOE_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD),
                    "agreement over the world");
    return v != 0;
}

std::string mpi_version() {
    char text[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(text, &len);
    std::string s(text, static_cast<size_t>(len));
    return s.substr(0, s.find_first_of(",\n"));
}

const comm::Comm& Comms::of(Group g) const {
    return const_cast<Comms&>(*this).of(g);
}

comm::Comm& Comms::of(Group g) {
    switch (g) {
        case Group::tp:
            return tp;
        case Group::dp:
            return dp;
        case Group::pp:
            return pp;
        case Group::ep:
            return ep;
        case Group::etp:
            return etp;
        case Group::edp:
            return edp;
    }
    return world;
}

Grid make_grid(const Layout& layout) {
    Grid g;
    g.layout = layout;
    g.rank = world_rank();
    g.me = coords_of(layout, g.rank);
    MPI_Comm world;
    HYMOE_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &world), "duplicating the world communicator");
    g.comms.world = comm::Comm(std::make_shared<comm::Comm::Impl>(world, "world"));
    g.comms.self = comm::self_comm();
    for (Group kind : kGroups) {
        // colour = which group, key = position inside it: members come out in grid.h's order
        MPI_Comm sub;
        HYMOE_MPI_CHECK(MPI_Comm_split(world,
                                       group_index(layout, kind, g.rank),
                                       group_position(layout, kind, g.rank),
                                       &sub),
                        "splitting the ",
                        to_string(kind),
                        " communicator");
        g.comms.of(kind) = comm::Comm(std::make_shared<comm::Comm::Impl>(sub, to_string(kind)));
    }
    g.comms.pp_prev = g.me.pp > 0 ? g.me.pp - 1 : -1;
    g.comms.pp_next = g.me.pp + 1 < layout.pp ? g.me.pp + 1 : -1;
    return g;
}

}  // namespace hymoe::parallel
