// The results journal of a killed infer run opened again (runtime/results.h), on every rank with
// rank 0 writing: under the same resolved deck its requests are done; under a newer hymoe's
// resolved deck of the same job (a key added, runtime/rerun.h) they are still done; under another
// deck (a value changed) the journal is removed and nothing is done.
#include <filesystem>
#include <string>

#include <boost/test/unit_test.hpp>

#include "../testing.h"
#include "hymoe/parallel/comms.h"
#include "hymoe/runtime/engine.h"
#include "hymoe/runtime/results.h"

namespace fs = std::filesystem;
namespace rt = hymoe::runtime;
using hymoe::testing::all_ranks;

BOOST_AUTO_TEST_SUITE(results_journal)

BOOST_AUTO_TEST_CASE(a_journal_resumes_across_versions_but_not_decks) {
    const int n = hymoe::testing::world_size();
    auto g = hymoe::parallel::make_grid(hymoe::parallel::Layout{1, n, 1, 1, 1});
    const std::string dir = (fs::temp_directory_path() / "hymoe_journal_test").string();
    if (g.rank == 0)
        fs::remove_all(dir);
    hymoe::comm::barrier(g.comms.world);
    const rt::JournalRanks ranks{g.comms.world, g.comms.self, g.rank == 0 ? 0 : -1, 1};
    const std::string deck = "job: {kind: infer, name: j}\ninference: {max_new_tokens: 4}\n";
    const std::string newer = deck + "profile: {layers: false}\n";
    const std::string other = "job: {kind: infer, name: j}\ninference: {max_new_tokens: 5}\n";
    {
        rt::ResultsJournal first(dir, deck, false, 0, ranks);
        rt::Finished f;
        f.req.id = "a", f.req.line = 1, f.req.tokens = {5, 6};
        f.tokens = {7, 8}, f.logprobs = {-0.5f, -0.25f};
        first.add(std::move(f));
        first.flush();  // the run is killed here: no finish()
    }
    hymoe::comm::barrier(g.comms.world);
    BOOST_TEST(all_ranks(rt::ResultsJournal(dir, deck, false, 0, ranks).done().size() == 1u));
    hymoe::comm::barrier(g.comms.world);
    BOOST_TEST(all_ranks(rt::ResultsJournal(dir, newer, false, 0, ranks).done().size() == 1u));
    hymoe::comm::barrier(g.comms.world);
    BOOST_TEST(all_ranks(rt::ResultsJournal(dir, other, false, 0, ranks).done().empty()));
    hymoe::comm::barrier(g.comms.world);
    if (g.rank == 0)
        fs::remove_all(dir);
}

BOOST_AUTO_TEST_SUITE_END()
