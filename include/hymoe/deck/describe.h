// The deck reference, printed from the schema table the parser validates with (src/deck/schema.h):
// `hymoe --describe-deck [SECTION]`; docs/reference/deck.md is this text for the whole deck
// (`make docs` writes it, the docs test tier fails when the committed file differs).
#pragma once

#include <string>

namespace hymoe::deck {

// Markdown: for "" the whole reference (an introduction, then one table per top-level section);
// for a section path ("inference", "finetune.lora") that section's table. An unknown section is
// an Exit::invalid error naming the sections.
std::string describe_deck(const std::string& section);

}  // namespace hymoe::deck
