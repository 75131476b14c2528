// The Boost.Test main shared by every suite. It prints, as the very last line, "N passed, N failed,
// N skipped" (Boost's own closing lines go to stderr and are not what CI reads). Built with
// -DTEST_WITH_MPI for the mpi suite: MPI_Init/Finalize wrap the framework, every rank runs every
// test, a test fails if it failed on any rank (MPI_Allreduce MAX), only rank 0 prints, and all
// ranks return the same exit code. Tests assert on shared verdicts (tests/testing.h: all_ranks) so
// that a failure on one rank never leaves the others waiting in a collective.
#define BOOST_TEST_MODULE hymoe
#define BOOST_TEST_NO_MAIN
#define BOOST_TEST_DYN_LINK
#include <boost/test/results_collector.hpp>
#include <boost/test/tree/traverse.hpp>
#include <boost/test/tree/visitor.hpp>
#include <boost/test/unit_test.hpp>
#ifdef TEST_WITH_MPI
#include <mpi.h>
#endif

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

namespace {

namespace utf = boost::unit_test;

enum Outcome { passed = 0, skipped = 1, failed = 2 };

struct Outcomes {
    std::vector<int>
        status;  // [n_test_case] Outcome, in test-tree order (same order on every rank)
    std::vector<std::string> names;
    bool collected = false;
};
Outcomes& outcomes() {
    static Outcomes o;
    return o;
}

struct OutcomeVisitor : utf::test_tree_visitor {
    void visit(const utf::test_case& tc) override {
        const utf::test_results& r = utf::results_collector.results(tc.p_id);
        int s = failed;
        if (!tc.is_enabled() || (r.p_skipped && !r.p_timed_out))
            s = skipped;  // filtered out by --run_test, disabled, or its precondition failed
        else if (r.passed())
            s = passed;
        outcomes().status.push_back(s);
        outcomes().names.push_back(tc.full_name());
    }
};

// Its destructor runs inside the framework's test_finish(), while the results still exist.
struct OutcomeCollector {
    ~OutcomeCollector() {
        OutcomeVisitor v;
        utf::traverse_test_tree(utf::framework::master_test_suite(), v, true);
        outcomes().collected = true;
    }
};

}  // namespace

BOOST_TEST_GLOBAL_CONFIGURATION(OutcomeCollector);

int main(int argc, char** argv) {
    int rank = 0;
    std::vector<char*> args(argv, argv + argc);
#ifdef TEST_WITH_MPI
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    static char no_report[] = "--report_level=no";  // Boost's report is per rank: ours replaces it
    args.push_back(no_report);
    static char no_log[] = "--log_level=nothing";
    bool log_level_given = false;
    for (int i = 1; i < argc; ++i)
        log_level_given = log_level_given || std::string(argv[i]).rfind("--log_level", 0) == 0;
    if (rank != 0 && !log_level_given)
        args.push_back(no_log);  // one readable log: rank 0's (failures are still named below)
#endif
    args.push_back(nullptr);
    int rc = utf::unit_test_main(&init_unit_test, static_cast<int>(args.size()) - 1, args.data());
    std::vector<int> status = outcomes().status;
#ifdef TEST_WITH_MPI
    int n = static_cast<int>(status.size()), n_max = 0, n_min = 0;
    MPI_Allreduce(&n, &n_max, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(&n, &n_min, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (n_max != n_min) {
        if (rank == 0)
            std::printf("test trees differ between ranks\n");
        status.assign(n_max, failed);
    } else {
        MPI_Allreduce(MPI_IN_PLACE, status.data(), n, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    }
    MPI_Allreduce(MPI_IN_PLACE, &rc, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
#endif
    int n_passed = 0, n_failed = 0, n_skipped = 0;
    for (size_t i = 0; i < status.size(); ++i) {
        (status[i] == passed ? n_passed : status[i] == skipped ? n_skipped : n_failed)++;
        if (status[i] == failed && rank == 0 && i < outcomes().names.size())
            std::printf("FAILED test case: %s\n", outcomes().names[i].c_str());
    }
    std::cout.flush();
    std::cerr.flush();
    if (rank == 0 && outcomes().collected) {
        std::printf("%d passed, %d failed, %d skipped\n", n_passed, n_failed, n_skipped);
        std::fflush(stdout);
    }
#ifdef TEST_WITH_MPI
    MPI_Finalize();
#endif
    return rc;
}
