// The tokenize job: JSONL lines -> token documents with loss masks, chunked over the ranks, with
// resume and progress lines (runtime/tokenize.h).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "host_view.h"
#include "hymoe/core/error.h"
#include "hymoe/core/log.h"
#include "hymoe/core/sha256.h"
#include "hymoe/core/timer.h"
#include "hymoe/deck/chat_check.h"
#include "hymoe/io/meta.h"
#include "hymoe/io/requests.h"
#include "hymoe/parallel/mpi_env.h"
#include "hymoe/runtime/preflight.h"
#include "hymoe/runtime/tokenize.h"
#include "hymoe/text/tokenizer.h"
#include "hymoe/text/utf8.h"

namespace hymoe::runtime {

namespace fs = std::filesystem;

namespace {

// The documents of one chunk of lines.
struct Chunk {
    std::vector<int32_t> tokens;  // [T]
    std::vector<uint8_t> mask;    // [T] 1 = training target
    std::vector<int64_t> ends;    // [n] end of each document in tokens
    std::vector<int64_t> line;    // [n] its 1-based line

    void add(const std::vector<int32_t>& ids, bool target) {
        tokens.insert(tokens.end(), ids.begin(), ids.end());
        mask.insert(mask.end(), ids.size(), target ? 1 : 0);
    }
};

struct Encoder {
    const text::Tokenizer& tok;
    const deck::Deck& deck;
    int32_t eos;    // −1: none
    int64_t vocab;  // the model's: every id written must be below it

    // One line's document appended to c; throws Exit::bad_input with what is wrong.
    void encode(const std::string& s, Chunk& c) const {
        const size_t begin = c.tokens.size();
        if (const size_t at = text::utf8_first_invalid(s); at != std::string::npos)
            HYMOE_FAIL(Exit::bad_input, "invalid UTF-8 at byte ", at, " of the line");
        nlohmann::json j = nlohmann::json::parse(s, nullptr, false);
        if (j.is_discarded() || !j.is_object())
            HYMOE_FAIL(Exit::bad_input, "not a JSON object");
        auto str = [&](const char* key) -> const std::string& {
            if (!j[key].is_string())
                HYMOE_FAIL(Exit::bad_input, "\"", key, "\" must be a string");
            return j[key].get_ref<const std::string&>();
        };
        if (j.contains("text")) {
            c.add(tok.encode(str("text")), true);
            add_eos(c);
        } else if (j.contains("prompt") && j.contains("completion")) {
            c.add(tok.encode(str("prompt")), false);
            c.add(tok.encode(str("completion")), true);
            add_eos(c);
        } else if (j.contains("messages")) {
            const auto pieces = text::chat_pieces(deck.tokenizer.chat_template,
                                                  io::messages_from_json(j["messages"]));
            for (const text::ChatPiece& p : pieces)
                c.add(tok.encode(p.text), p.target);
        } else {
            HYMOE_FAIL(Exit::bad_input,
                       "expected \"text\", \"prompt\" with \"completion\", or \"messages\"");
        }
        if (c.tokens.size() == begin)
            HYMOE_FAIL(Exit::bad_input, "the line encodes to no tokens");
        const auto past = std::find_if(c.tokens.begin() + static_cast<int64_t>(begin),
                                       c.tokens.end(),
                                       [&](int32_t id) { return id >= vocab; });
        if (past != c.tokens.end())
            HYMOE_FAIL(Exit::bad_input,
                       "the tokenizer '",
                       deck.tokenizer.path,
                       "' gives token id ",
                       *past,
                       ", outside the model's vocabulary [0, ",
                       vocab,
                       ") (",
                       vocab_source(deck),
                       ")");
    }
    void add_eos(Chunk& c) const {
        if (eos >= 0)
            c.add({eos}, true);
    }
};

std::string chunk_path(const std::string& parts, int64_t k) {
    char name[32];
    std::snprintf(name, sizeof name, "chunk-%08lld.h5", static_cast<long long>(k));
    return parts + "/" + name;
}

void write_chunk(const std::string& path, const Chunk& c, const comm::Comm& self) {
    io::H5Writer w(path, self);
    w.append("/tokens", view_of(c.tokens, DType::i32));
    w.append("/loss_mask", view_of(c.mask, DType::u8));
    w.append("/ends", view_of(c.ends, DType::i64));
    w.append("/line", view_of(c.line, DType::i64));
    w.commit();
}

// Rank 0: the parts folder of this deck (another deck's removed, .partial leftovers dropped).
void prepare_parts(const std::string& parts, const std::string& sha) {
    const std::string stamp = parts + "/deck_sha256";
    std::ifstream in(stamp);
    std::string old;
    std::getline(in, old);
    if (fs::exists(parts) && old != sha) {
        log::info("removing " + parts + " (the chunks of another deck)");
        fs::remove_all(parts);
    }
    fs::create_directories(parts);
    std::ofstream(stamp) << sha << "\n";
    for (const auto& e : fs::directory_iterator(parts))
        if (e.path().extension() == ".partial")
            fs::remove(e.path());
}

// Rank 0: the chunks 0 .. n_chunks − 1 joined into the output file.
void join_chunks(const Job& job,
                 const std::string& parts,
                 int64_t n_chunks,
                 const comm::Comm& self) {
    const std::string& out = job.deck.tokenize.output;
    fs::create_directories(fs::path(out).parent_path());
    io::H5Writer w(out, self);
    io::write_meta(w, {&job.deck, job.layout, model::describe(job.model), log::utc_timestamp()});
    int64_t base = 0;
    std::vector<int64_t> offsets = {0};
    for (int64_t k = 0; k < n_chunks; ++k) {
        io::H5Reader r(chunk_path(parts, k));
        const std::vector<int64_t> t = r.ints("/tokens"), m = r.ints("/loss_mask");
        std::vector<int32_t> tokens(t.begin(), t.end());
        std::vector<uint8_t> mask(m.begin(), m.end());
        for (int64_t e : r.ints("/ends"))
            offsets.push_back(base + e);
        base += static_cast<int64_t>(t.size());
        w.append("/tokens", view_of(tokens, DType::i32));
        w.append("/loss_mask", view_of(mask, DType::u8));
        w.append("/offsets", view_of(offsets, DType::i64));
        w.append("/line", view_of(r.ints("/line"), DType::i64));
        offsets.clear();
    }
    if (n_chunks == 0) {  // an empty dataset still has every array
        w.append("/tokens", view_of(std::vector<int32_t>{}, DType::i32));
        w.append("/loss_mask", view_of(std::vector<uint8_t>{}, DType::u8));
        w.append("/offsets", view_of(offsets, DType::i64));
        w.append("/line", view_of(std::vector<int64_t>{}, DType::i64));
    }
    w.commit();
}

}  // namespace

int run_tokenize(const Job& job, const parallel::Grid& grid) {
    const deck::TokenizeSection& tk = job.deck.tokenize;
    const comm::Comm& world = grid.comms.world;
    const text::Tokenizer tok =
        text::load_tokenizer(job.deck.tokenizer.path, job.deck.tokenizer.pattern);
    log::info("tokenizer: " + tok.describe());
    deck::check_chat_template(job.deck, tok);
    const int32_t eos = tk.eos.empty() ? -1 : tok.special_id(tk.eos);
    if (!tk.eos.empty() && eos < 0)
        HYMOE_FAIL(Exit::invalid,
                   job.deck.locate("tokenize.eos"),
                   ": '",
                   tk.eos,
                   "' is not a special token of the tokenizer");
    const std::string parts = tk.output + ".parts";
    if (grid.rank == 0)
        prepare_parts(parts, sha256_hex(job.deck.resolved_yaml));
    comm::barrier(world);

    const Encoder enc{tok, job.deck, eos, job.model.vocab_size};
    const int world_n = world.size();
    const double t0 = wall_seconds();
    const double file_bytes = std::max(1.0, static_cast<double>(fs::file_size(tk.dataset)));
    std::ifstream in(tk.dataset, std::ios::binary);
    if (!in)
        HYMOE_FAIL(Exit::bad_input, tk.dataset, ": cannot open the dataset");
    Chunk chunk;
    int64_t line_no = 0, docs = 0, tokens = 0, bad = 0, resumed = 0;
    double bytes_read = 0, last_log = t0;
    std::string failure;  // the first bad line on this rank, with on_bad_request: fail
    bool skip_chunk = false;
    auto finish_chunk = [&](int64_t k) {
        if (k % world_n == grid.rank && !skip_chunk) {
            write_chunk(chunk_path(parts, k), chunk, grid.comms.self);
            docs += static_cast<int64_t>(chunk.ends.size());
            tokens += static_cast<int64_t>(chunk.tokens.size());
        }
        chunk = Chunk{};
    };
    for (std::string s; failure.empty() && std::getline(in, s);) {
        const int64_t k = line_no / tk.chunk_lines;
        if (line_no % tk.chunk_lines == 0) {
            if (line_no > 0)
                finish_chunk(k - 1);
            skip_chunk = k % world_n == grid.rank && fs::exists(chunk_path(parts, k));
            resumed += skip_chunk;
        }
        ++line_no;
        bytes_read += static_cast<double>(s.size() + 1);
        if (grid.rank == 0 && wall_seconds() - last_log > 10) {
            last_log = wall_seconds();
            const double rate = bytes_read / (last_log - t0);
            log::info(cat("progress: line ",
                          line_no,
                          ", ",
                          static_cast<int>(100 * bytes_read / file_bytes),
                          "% of ",
                          tk.dataset,
                          ", ",
                          static_cast<int>(rate / 1e6 * 10) / 10.0,
                          " MB/s read, ETA ",
                          static_cast<int64_t>((file_bytes - bytes_read) / rate),
                          " s"));
        }
        if (k % world_n != grid.rank || skip_chunk ||
            s.find_first_not_of(" \t\r") == std::string::npos)
            continue;
        try {
            if (static_cast<int64_t>(s.size()) > tk.max_line_bytes)
                HYMOE_FAIL(Exit::bad_input,
                           "the line has ",
                           s.size(),
                           " bytes, more than tokenize.max_line_bytes = ",
                           tk.max_line_bytes);
            enc.encode(s, chunk);
            chunk.ends.push_back(static_cast<int64_t>(chunk.tokens.size()));
            chunk.line.push_back(line_no);
        } catch (const Error& e) {
            chunk.tokens.resize(chunk.ends.empty() ? 0 : static_cast<size_t>(chunk.ends.back()));
            chunk.mask.resize(chunk.tokens.size());
            const std::string what = cat(tk.dataset, ":", line_no, ": ", e.what());
            if (tk.on_bad_request == "fail")
                failure = what;
            else
                log::warn(what + " (skipped)"), ++bad;
        }
    }
    if (failure.empty() && line_no > 0)
        finish_chunk((line_no - 1) / tk.chunk_lines);
    const int first = parallel::first_failed_rank(!failure.empty());
    if (first < world_n)
        HYMOE_FAIL(Exit::bad_input, parallel::broadcast_bytes(failure, first));

    const int64_t n_chunks = (line_no + tk.chunk_lines - 1) / tk.chunk_lines;
    docs = comm::all_reduce_value(docs, world), tokens = comm::all_reduce_value(tokens, world);
    bad = comm::all_reduce_value(bad, world), resumed = comm::all_reduce_value(resumed, world);
    if (grid.rank == 0) {
        join_chunks(job, parts, n_chunks, grid.comms.self);
        fs::remove_all(parts);
    }
    comm::barrier(world);
    log::info(cat("tokenize: ",
                  line_no,
                  " lines, ",
                  docs,
                  " documents and ",
                  tokens,
                  " tokens written (this run), ",
                  bad,
                  " bad lines skipped, ",
                  resumed,
                  " chunks resumed, in ",
                  static_cast<int>((wall_seconds() - t0) * 100) / 100.0,
                  " s"));
    log::info("wrote " + tk.output);
    return 0;
}

}  // namespace hymoe::runtime
