// Reruns of a finished infer job. A results.h5 in job.output is the deck's finished output when
// its /meta/deck_resolved is the same resolved deck (job.overwrite left out of the comparison)
// and, when the deck profiles, profile.h5 is there too (a run killed while writing it reruns);
// then the rerun does nothing: "already complete" on stdout, exit 0, no file in job.output
// touched (not results.h5, not the log). A results.h5 of another deck (a key or a --set changed)
// is refused with one Exit::invalid sentence naming job.output, so finished results are never
// replaced by accident; job.overwrite: true reruns either way and replaces results.h5 at the end.
// An interrupted run (results.parts/, no results.h5 of this deck) resumes as before.
// Another hymoe version may resolve the same deck with keys added or dropped (a new key and its
// default): a key that only one of the two resolved decks holds does not make another deck, a
// value that differs does; the keys that differed are logged.
#pragma once

#include <string>
#include <vector>

#include "hymoe/runtime/job.h"

namespace hymoe::runtime {

// The sha256 that names a deck's results: of the resolved deck without job.overwrite (so that
// setting it neither restarts a journal nor makes the finished file another deck's).
std::string results_deck_sha(const std::string& resolved_yaml);

// Two resolved decks (job.overwrite left out): `same` when every key both hold has one value;
// `only_one` lists, as dotted paths, the keys only one of them holds (another version's).
struct DeckComparison {
    bool same = false;
    std::vector<std::string> only_one;
};
DeckComparison compare_resolved_decks(const std::string& written, const std::string& now);
// " was written under a resolved deck that differs ... only in keys ...: a.b, c" (for the log).
std::string version_keys_note(const DeckComparison& c);
// Collective (rank 0 reads, every rank gets the verdict). True when job.output already holds
// this deck's finished results.h5 and job.overwrite is false; throws Exit::invalid when it holds
// another deck's and job.overwrite is false.
bool infer_already_complete(const Job& job);

}  // namespace hymoe::runtime
