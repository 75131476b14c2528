// The deck's chat template against the tokenizer it will be encoded with: a special-token marker
// (<|name|>, <｜name｜>) in bos, a role's prefix or suffix or the generation prefix that the
// tokenizer lacks is a deck error, found when the tokenizer is loaded, before any request runs.
// tokenizer.chat: template: a user, assistant, user conversation is rendered and encoded, and an
// error there (a token the tokenizer lacks, a construct outside the Jinja subset) names
// tokenizer.chat.
#pragma once

#include "hymoe/deck/deck.h"
#include "hymoe/text/tokenizer.h"

namespace hymoe::deck {

// Exit::invalid naming the deck key (or tokenizer.chat, for a preset's text the deck did not
// change) and the unknown token: "DECK:L:C: tokenizer.roles.user.prefix: unknown special token
// '<|x|>' (not a token of tokenizer.path)".
void check_chat_template(const Deck& deck, const text::Tokenizer& tok);

}  // namespace hymoe::deck
