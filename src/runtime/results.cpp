// The results journal and the final results.h5 (see runtime/results.h for the on-disk state).
#include "hymoe/runtime/results.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <list>
#include <map>
#include <set>
#include <tuple>

#include <yaml-cpp/yaml.h>

#include "host_view.h"
#include "hymoe/core/error.h"
#include "hymoe/core/log.h"
#include "hymoe/core/timer.h"
#include "hymoe/io/h5.h"
#include "hymoe/runtime/rerun.h"
#include "hymoe/text/tokenizer.h"
#include "hymoe/text/utf8.h"

namespace hymoe::runtime {

namespace fs = std::filesystem;

namespace {

// The generated tokens as text, through the streaming detokenizer (what a client streaming the
// output would have shown; ill-formed bytes as U+FFFD).
std::string detokenize(const text::Tokenizer& tok, const std::vector<int64_t>& tokens) {
    text::Detokenizer d(tok);
    std::string s;
    for (int64_t t : tokens)
        s += t < tok.n_vocab() ? d.push(static_cast<int32_t>(t)) : "\uFFFD";
    return s + d.finish();
}

// A finished request's text: the detokenized tokens, cut before its stop string (text_bytes).
std::string output_text(const text::Tokenizer& tok, const Finished& f) {
    if (f.text_bytes < 0)
        return detokenize(tok, f.tokens);
    std::string raw;
    for (int64_t t : f.tokens)
        raw += t < tok.n_vocab() ? tok.token_bytes(static_cast<int32_t>(t)) : "\uFFFD";
    return text::utf8_sanitize(std::string_view(raw).substr(0, static_cast<size_t>(f.text_bytes)));
}

std::string segment_name(int n) {
    std::string s = std::to_string(n);
    return "seg-" + std::string(s.size() < 6 ? 6 - s.size() : 0, '0') + s + ".h5";
}

// Segment files of parts in number order; with remove_partials, the .partial leftovers of a
// killed run are deleted (rank 0 only: another rank's leftover may be a writer's segment).
std::vector<std::pair<int, std::string>> list_segments(const std::string& parts,
                                                       bool remove_partials = false) {
    std::vector<std::pair<int, std::string>> segs;
    for (const auto& e : fs::directory_iterator(parts)) {
        const std::string name = e.path().filename().string();
        if (name.ends_with(".partial")) {
            if (remove_partials)
                fs::remove(e.path());
        } else if (name.starts_with("seg-") && name.ends_with(".h5")) {
            int n = -1;
            const char* digits = name.c_str() + 4;
            auto [end, ec] = std::from_chars(digits, name.c_str() + name.size() - 3, n);
            if (ec == std::errc() && end == name.c_str() + name.size() - 3 && n >= 0)
                segs.emplace_back(n, e.path().string());
            else
                log::warn("ignoring " + e.path().string() + " (not a results segment)");
        }
    }
    std::sort(segs.begin(), segs.end());
    return segs;
}

// One segment read back whole (a few hundred requests).
struct Segment {
    std::vector<int64_t> index, sample, line, prompt_len, n_out, greedy_token, finish;
    std::vector<int64_t> tokens, out_begin, plp_begin;  // out_begin, plp_begin: [n + 1] prefixes
    std::vector<float> logprobs, prompt_logprobs, greedy_logprob;
    std::vector<std::string> id, adapter, stop_string;  // stop_string [n] ("" none)
    std::vector<int64_t> stop_token;                    // [n] (−1 none)
    std::vector<std::string> text;    // [n] generated text, when the deck has a tokenizer
    std::vector<int64_t> top_tokens;  // [Σ n_out, N]
    std::vector<float> top_logprobs;  // [Σ n_out, N]
};

// A segment's columns agree (a journal edited, truncated by a bug or of another version is one
// Exit::bad_input naming the file, never a read past a column): [n] per-request columns, request
// indices and counts non-negative, finish codes known, the flat columns as long as the counts say.
void check_segment(const Segment& s, const std::string& path, bool prompt_logprobs, int top_n) {
    const size_t n = s.index.size();
    auto bad = [&](const std::string& what) {
        HYMOE_FAIL_ONE(Exit::bad_input,
                       path,
                       ": ",
                       what,
                       " (a damaged results journal: remove ",
                       fs::path(path).parent_path().string(),
                       " to start afresh)");
    };
    for (const auto& [name, size] : {std::pair{"/line", s.line.size()},
                                     {"/sample", s.sample.size()},
                                     {"/prompt_len", s.prompt_len.size()},
                                     {"/n_out", s.n_out.size()},
                                     {"/finish", s.finish.size()},
                                     {"/greedy_token", s.greedy_token.size()},
                                     {"/greedy_logprob", s.greedy_logprob.size()},
                                     {"/id", s.id.size()},
                                     {"/adapter", s.adapter.size()},
                                     {"/stop_string", s.stop_string.size()},
                                     {"/stop_token", s.stop_token.size()}})
        if (size != n)
            bad(cat(name, " holds ", size, " entries for ", n, " requests"));
    if (!s.text.empty() && s.text.size() != n)
        bad(cat("/text holds ", s.text.size(), " entries for ", n, " requests"));
    for (size_t i = 0; i < n; ++i)
        if (s.index[i] < 0 || s.sample[i] < 0 || s.n_out[i] < 0 || s.prompt_len[i] < 0 ||
            s.finish[i] < 0 || s.finish[i] > static_cast<int64_t>(Finish::length))
            bad(cat("request ", i, " has a negative index or count, or an unknown finish code"));
    const size_t n_tokens = static_cast<size_t>(s.out_begin[n]);
    if (s.tokens.size() != n_tokens || s.logprobs.size() != n_tokens)
        bad(cat("/tokens and /logprobs hold ",
                s.tokens.size(),
                " and ",
                s.logprobs.size(),
                " entries, /n_out sums to ",
                n_tokens));
    if (prompt_logprobs && s.prompt_logprobs.size() != static_cast<size_t>(s.plp_begin[n]))
        bad(cat(
            "/prompt_logprobs holds ", s.prompt_logprobs.size(), " entries, not ", s.plp_begin[n]));
    if (top_n > 0 && (s.top_tokens.size() != n_tokens * static_cast<size_t>(top_n) ||
                      s.top_logprobs.size() != s.top_tokens.size()))
        bad(cat("/top_tokens and /top_logprobs do not hold ", top_n, " entries per output token"));
}

// The sample and stop columns (prefix "" in a segment, "/requests" in results.h5); a file
// written before they existed reads as sample 0 and no stops.
void read_sample_stops(const io::H5Reader& r, const std::string& prefix, Segment& s) {
    s.sample = r.exists(prefix + "/sample") ? r.ints(prefix + "/sample")
                                            : std::vector<int64_t>(s.index.size(), 0);
    if (r.exists(prefix + "/stop_string")) {
        s.stop_string = r.strings(prefix + "/stop_string");
        s.stop_token = r.ints(prefix + "/stop_token");
    } else {
        s.stop_string.assign(s.index.size(), "");
        s.stop_token.assign(s.index.size(), -1);
    }
}

Segment read_segment(const std::string& path, bool prompt_logprobs, int top_n) {
    io::H5Reader r(path);
    Segment s;
    if (top_n > 0)
        s.top_tokens = r.ints("/top_tokens"), s.top_logprobs = r.floats("/top_logprobs");
    s.index = r.ints("/index"), s.line = r.ints("/line"), s.prompt_len = r.ints("/prompt_len");
    s.n_out = r.ints("/n_out"), s.finish = r.ints("/finish"), s.tokens = r.ints("/tokens");
    s.greedy_token = r.ints("/greedy_token"), s.greedy_logprob = r.floats("/greedy_logprob");
    s.logprobs = r.floats("/logprobs"), s.id = r.strings("/id"), s.adapter = r.strings("/adapter");
    if (prompt_logprobs)
        s.prompt_logprobs = r.floats("/prompt_logprobs");
    if (r.exists("/text"))
        s.text = r.strings("/text");
    read_sample_stops(r, "", s);
    s.out_begin.assign(1, 0), s.plp_begin.assign(1, 0);
    const size_t n = std::min({s.index.size(), s.n_out.size(), s.prompt_len.size()});
    for (size_t i = 0; i < n; ++i) {
        s.out_begin.push_back(s.out_begin.back() + s.n_out[i]);
        s.plp_begin.push_back(s.plp_begin.back() +
                              (prompt_logprobs ? std::max<int64_t>(s.prompt_len[i] - 1, 0) : 0));
    }
    check_segment(s, path, prompt_logprobs, top_n);
    return s;
}

// The shards of one array job, each once: their resolved decks (/meta/deck_resolved) name the
// same inference.shards, equal to the number of folders given, and every inference.shard in
// 0 .. shards − 1 once.
void check_shard_set(const std::vector<std::string>& dirs) {
    std::vector<int> seen;
    for (const std::string& dir : dirs) {
        const YAML::Node inf =
            YAML::Load(io::H5Reader(dir + "/results.h5").text("/meta/deck_resolved"))["inference"];
        const int shards = inf["shards"] ? inf["shards"].as<int>() : 1;
        const int shard = inf["shard"] ? inf["shard"].as<int>() : 0;
        if (shards != static_cast<int>(dirs.size()))
            HYMOE_FAIL(Exit::bad_input,
                       dir,
                       "/results.h5 is shard ",
                       shard,
                       " of ",
                       shards,
                       " but ",
                       dirs.size(),
                       " shard folders were given (a shard missing or extra?)");
        seen.push_back(shard);
    }
    std::sort(seen.begin(), seen.end());
    for (size_t i = 0; i < seen.size(); ++i)
        if (seen[i] != static_cast<int>(i))
            HYMOE_FAIL(Exit::bad_input,
                       "the shard folders do not hold shards 0 to ",
                       dirs.size() - 1,
                       " once each (overlapping shards)");
}

// A finished results.h5 read back whole as one segment (gather_results).
Segment read_results(const std::string& path) {
    io::H5Reader r(path);
    Segment s;
    s.index = r.ints("/requests/index"), s.line = r.ints("/requests/line");
    s.prompt_len = r.ints("/requests/prompt_len"), s.tokens = r.ints("/requests/output_tokens");
    s.logprobs = r.floats("/requests/output_logprobs");
    s.id = r.strings("/requests/id"), s.adapter = r.strings("/requests/adapter");
    s.out_begin = r.ints("/requests/output_offsets");
    if (r.exists("/requests/output_text"))
        s.text = r.strings("/requests/output_text");
    read_sample_stops(r, "/requests", s);
    for (const std::string& f : r.strings("/requests/finish_reason"))
        s.finish.push_back(static_cast<int64_t>(f == "stop" ? Finish::stop : Finish::length));
    for (size_t i = 0; i < s.index.size(); ++i)
        s.n_out.push_back(s.out_begin[i + 1] - s.out_begin[i]);
    if (r.exists("/requests/logprob_offsets")) {
        s.plp_begin = r.ints("/requests/logprob_offsets");
        s.prompt_logprobs = r.floats("/requests/prompt_logprobs");
        s.greedy_token = r.ints("/requests/greedy_token");
        s.greedy_logprob = r.floats("/requests/greedy_logprob");
    }
    if (r.exists("/requests/top_tokens")) {
        s.top_tokens = r.ints("/requests/top_tokens");
        s.top_logprobs = r.floats("/requests/top_logprobs");
    }
    if (!r.exists("/requests/logprob_offsets")) {
        s.plp_begin.assign(s.index.size() + 1, 0);
        s.greedy_token.assign(s.index.size(), -1);
        s.greedy_logprob.assign(s.index.size(), 0.0f);
    }
    return s;
}

// The final file's columns for a run of requests, appended every few thousand requests.
struct Columns {
    std::vector<std::string> id, finish, adapter, text, stop_string;
    std::vector<int64_t> index, line, prompt_len, out_end, tokens, plp_end, greedy_token;
    std::vector<int64_t> stop_token, sample;
    std::vector<float> logprobs, prompt_logprobs, greedy_logprob;
    std::vector<int64_t> top_tokens;
    std::vector<float> top_logprobs;
    std::vector<uint8_t> done;
    int top_n = 0;                    // N of top_tokens / top_logprobs rows
    int64_t n_tokens = 0, n_plp = 0;  // running ends of the flat arrays

    void add(const Segment& s, size_t i) {
        id.push_back(s.id[i]), adapter.push_back(s.adapter[i]);
        if (!s.text.empty())
            text.push_back(s.text[i]);
        finish.push_back(to_string(static_cast<Finish>(s.finish[i])));
        stop_string.push_back(s.stop_string[i]), stop_token.push_back(s.stop_token[i]);
        index.push_back(s.index[i]), sample.push_back(s.sample[i]), line.push_back(s.line[i]);
        prompt_len.push_back(s.prompt_len[i]), done.push_back(1);
        tokens.insert(
            tokens.end(), s.tokens.data() + s.out_begin[i], s.tokens.data() + s.out_begin[i + 1]);
        logprobs.insert(logprobs.end(),
                        s.logprobs.data() + s.out_begin[i],
                        s.logprobs.data() + s.out_begin[i + 1]);
        out_end.push_back(n_tokens += s.n_out[i]);
        const int64_t n = top_n;
        top_tokens.insert(top_tokens.end(),
                          s.top_tokens.begin() + s.out_begin[i] * n,
                          s.top_tokens.begin() + s.out_begin[i + 1] * n);
        top_logprobs.insert(top_logprobs.end(),
                            s.top_logprobs.begin() + s.out_begin[i] * n,
                            s.top_logprobs.begin() + s.out_begin[i + 1] * n);
        prompt_logprobs.insert(prompt_logprobs.end(),
                               s.prompt_logprobs.data() + s.plp_begin[i],
                               s.prompt_logprobs.data() + s.plp_begin[i + 1]);
        plp_end.push_back(n_plp += s.plp_begin[i + 1] - s.plp_begin[i]);
        greedy_token.push_back(s.greedy_token[i]), greedy_logprob.push_back(s.greedy_logprob[i]);
    }
    void write(io::H5Writer& w, bool with_plp) {
        w.append_strings("/requests/id", id);
        w.append("/requests/index", view_of(index, DType::i64));
        w.append("/requests/sample", view_of(sample, DType::i64));
        w.append("/requests/line", view_of(line, DType::i64));
        w.append("/requests/prompt_len", view_of(prompt_len, DType::i64));
        w.append("/requests/output_offsets", view_of(out_end, DType::i64));
        w.append("/requests/output_tokens", view_of(tokens, DType::i64));
        w.append("/requests/output_logprobs", view_of(logprobs, DType::f32));
        w.append_strings("/requests/finish_reason", finish);
        w.append_strings("/requests/stop_string", stop_string);
        w.append("/requests/stop_token", view_of(stop_token, DType::i64));
        w.append_strings("/requests/adapter", adapter);
        if (!text.empty())
            w.append_strings("/requests/output_text", text);
        w.append("/requests/done", view_of(done, DType::u8));
        if (with_plp) {
            w.append("/requests/logprob_offsets", view_of(plp_end, DType::i64));
            w.append("/requests/prompt_logprobs", view_of(prompt_logprobs, DType::f32));
            w.append("/requests/greedy_token", view_of(greedy_token, DType::i64));
            w.append("/requests/greedy_logprob", view_of(greedy_logprob, DType::f32));
        }
        if (top_n > 0) {
            const int64_t rows = static_cast<int64_t>(top_tokens.size()) / top_n;
            w.append("/requests/top_tokens",
                     Tensor{top_tokens.data(), DType::i64, Device::cpu, {rows, top_n}});
            w.append("/requests/top_logprobs",
                     Tensor{top_logprobs.data(), DType::f32, Device::cpu, {rows, top_n}});
        }
        const int64_t ends[2] = {n_tokens, n_plp};
        const int n = top_n;
        *this = Columns{};
        n_tokens = ends[0], n_plp = ends[1], top_n = n;
    }
};

// A segment written under this deck: its sha256 is one of `accepted` (this deck's, then those
// found to be this deck's), or its resolved deck differs only in keys one hymoe version lacks
// (runtime/rerun.h; logged once per sha256, which then joins `accepted`).
bool of_this_deck(const std::string& segment,
                  const std::string& resolved,
                  std::set<std::string>& accepted) {
    io::H5Reader r(segment);
    const std::string sha = r.text("/deck_sha256");
    if (accepted.contains(sha))
        return true;
    if (!r.exists("/deck_resolved"))
        return false;
    const DeckComparison c = compare_resolved_decks(r.text("/deck_resolved"), resolved);
    if (c.same) {
        accepted.insert(sha);
        if (!c.only_one.empty())
            log::info(cat(segment, version_keys_note(c)));
    }
    return c.same;
}

}  // namespace

ResultsJournal::ResultsJournal(const std::string& out_dir,
                               const std::string& resolved_deck,
                               bool prompt_logprobs,
                               int top_logprobs,
                               const JournalRanks& ranks,
                               int flush_every,
                               double flush_seconds)
    : dir_(out_dir),
      parts_(out_dir + "/results.parts"),
      resolved_(resolved_deck),
      sha_(results_deck_sha(resolved_deck)),
      prompt_logprobs_(prompt_logprobs),
      top_n_(top_logprobs),
      ranks_(ranks),
      flush_every_(flush_every),
      flush_seconds_(flush_seconds),
      last_flush_(wall_seconds()) {
    if (ranks_.world.rank() == 0) {  // drops .partial leftovers and another deck's journal
        std::set<std::string> accepted{sha_};
        if (fs::exists(parts_))
            for (const auto& [n, path] : list_segments(parts_, true))
                if (!of_this_deck(path, resolved_, accepted)) {
                    log::warn(cat(parts_, " holds results of another deck: starting afresh"));
                    fs::remove_all(parts_);
                    break;
                }
        fs::create_directories(parts_);
    }
    comm::barrier(ranks_.world);
    int last = -1;
    for (const auto& [n, path] : list_segments(parts_)) {
        const Segment s = read_segment(path, prompt_logprobs_, top_n_);  // checked whole
        for (size_t i = 0; i < s.index.size(); ++i)
            done_.push_back(
                {s.index[i], s.line[i], s.prompt_len[i], s.id[i], static_cast<int>(s.sample[i])});
        last = n;
    }
    const int w = std::max(ranks_.writer, 0), n_w = ranks_.n_writers;
    next_segment_ = (last + 1 + n_w - 1 - w) / n_w * n_w + w;  // the first ≡ w (mod W) past last
    std::sort(done_.begin(), done_.end(), [](auto& a, auto& b) {
        return std::tie(a.index, a.sample) < std::tie(b.index, b.sample);
    });
    if (!done_.empty()) {
        int64_t requests = 0;  // done_ holds a row per sample, sorted by (index, sample)
        for (size_t i = 0; i < done_.size(); ++i)
            requests += i == 0 || done_[i].index != done_[i - 1].index;
        log::info(cat("resuming: ",
                      requests,
                      " requests (",
                      done_.size(),
                      " samples) already finished in ",
                      parts_));
    }
}

void ResultsJournal::add(Finished&& f) {
    if (ranks_.writer < 0)
        return;
    buffer_.push_back(std::move(f));
    if (static_cast<int>(buffer_.size()) >= flush_every_ ||
        wall_seconds() - last_flush_ >= flush_seconds_)
        flush();
}

void ResultsJournal::flush() {
    last_flush_ = wall_seconds();
    if (buffer_.empty())
        return;
    std::sort(buffer_.begin(), buffer_.end(), [](auto& a, auto& b) {
        return std::tie(a.index, a.sample) < std::tie(b.index, b.sample);
    });
    std::vector<int64_t> index, sample, line, prompt_len, n_out, greedy_token, tokens;
    std::vector<int32_t> finish;
    std::vector<float> logprobs, plp, greedy_logprob;
    std::vector<std::string> id, adapter, text, stop_string;
    std::vector<int64_t> stop_token;
    for (const Finished& f : buffer_) {
        if (tokenizer_)
            text.push_back(output_text(*tokenizer_, f));
        stop_string.push_back(f.stop_string), stop_token.push_back(f.stop_token);
        index.push_back(f.index), line.push_back(f.req.line), id.push_back(f.req.id);
        sample.push_back(f.sample);
        prompt_len.push_back(static_cast<int64_t>(f.req.tokens.size()));
        n_out.push_back(static_cast<int64_t>(f.tokens.size()));
        finish.push_back(static_cast<int32_t>(f.finish)), adapter.push_back(f.req.adapter);
        tokens.insert(tokens.end(), f.tokens.begin(), f.tokens.end());
        logprobs.insert(logprobs.end(), f.logprobs.begin(), f.logprobs.end());
        plp.insert(plp.end(), f.prompt_logprobs.begin(), f.prompt_logprobs.end());
        greedy_token.push_back(f.greedy_token), greedy_logprob.push_back(f.greedy_logprob);
    }
    io::H5Writer w(parts_ + "/" + segment_name(next_segment_), ranks_.self);
    next_segment_ += ranks_.n_writers;
    w.text("/deck_sha256", sha_);
    w.text("/deck_resolved", resolved_);
    w.array("/index", view_of(index, DType::i64));
    w.array("/sample", view_of(sample, DType::i64));
    w.array("/line", view_of(line, DType::i64));
    w.array("/prompt_len", view_of(prompt_len, DType::i64));
    w.array("/n_out", view_of(n_out, DType::i64));
    w.array("/finish", view_of(finish, DType::i32));
    w.array("/tokens", view_of(tokens, DType::i64));
    w.array("/logprobs", view_of(logprobs, DType::f32));
    w.array("/greedy_token", view_of(greedy_token, DType::i64));
    w.array("/greedy_logprob", view_of(greedy_logprob, DType::f32));
    w.strings("/id", id);
    w.strings("/adapter", adapter);
    w.strings("/stop_string", stop_string);
    w.array("/stop_token", view_of(stop_token, DType::i64));
    if (tokenizer_)
        w.strings("/text", text);
    if (prompt_logprobs_)
        w.array("/prompt_logprobs", view_of(plp, DType::f32));
    if (top_n_ > 0) {
        std::vector<int64_t> top_tokens;
        std::vector<float> top_logprobs;
        for (const Finished& f : buffer_) {
            top_tokens.insert(top_tokens.end(), f.top_tokens.begin(), f.top_tokens.end());
            top_logprobs.insert(top_logprobs.end(), f.top_logprobs.begin(), f.top_logprobs.end());
        }
        w.array("/top_tokens", view_of(top_tokens, DType::i64));
        w.array("/top_logprobs", view_of(top_logprobs, DType::f32));
    }
    w.commit();
    buffer_.clear();
}

int64_t ResultsJournal::finish(const io::RunMeta& meta) {
    flush();
    comm::barrier(ranks_.world);  // every writer's last segment is on disk
    return comm::broadcast_value(ranks_.world.rank() == 0 ? merge(meta) : 0, 0, ranks_.world);
}

int64_t ResultsJournal::merge(const io::RunMeta& meta) {
    const auto segs = list_segments(parts_);
    std::vector<std::tuple<int64_t, int64_t, uint64_t>>
        where;  // (index, sample, segment << 32 | row)
    for (size_t k = 0; k < segs.size(); ++k) {
        const io::H5Reader r(segs[k].second);
        const std::vector<int64_t> index = r.ints("/index");
        const std::vector<int64_t> sample =
            r.exists("/sample") ? r.ints("/sample") : std::vector<int64_t>(index.size(), 0);
        for (size_t row = 0; row < index.size() && row < sample.size(); ++row)
            where.emplace_back(index[row], sample[row], uint64_t{k} << 32 | row);
    }
    std::sort(where.begin(), where.end());  // a row written twice: the later segment's is kept
    io::H5Writer w(dir_ + "/results.h5", ranks_.self);
    io::write_meta(w, meta);
    Columns cols;
    cols.out_end.push_back(0), cols.plp_end.push_back(0);  // offsets [N + 1] start at 0
    cols.top_n = top_n_;
    std::map<size_t, Segment> cache;  // a few segments, oldest read evicted
    std::list<size_t> recent;
    int64_t n = 0;
    for (size_t i = 0; i < where.size(); ++i) {
        const auto [index, sample, loc] = where[i];
        if (i + 1 < where.size() && std::get<0>(where[i + 1]) == index &&
            std::get<1>(where[i + 1]) == sample)
            continue;
        const size_t k = loc >> 32, row = loc & 0xffffffffu;
        if (!cache.count(k)) {
            if (cache.size() >= 8) {
                cache.erase(recent.front());
                recent.pop_front();
            }
            cache[k] = read_segment(segs[k].second, prompt_logprobs_, top_n_);
            recent.push_back(k);
        }
        cols.add(cache[k], row);
        if (++n % 4096 == 0)
            cols.write(w, prompt_logprobs_);
    }
    cols.write(w, prompt_logprobs_);
    w.commit();
    fs::remove_all(parts_);
    return n;
}

int64_t gather_results(const std::string& out_dir, const std::vector<std::string>& shard_dirs) {
    std::vector<Segment> shards;
    std::vector<std::tuple<int64_t, int64_t, size_t, size_t>> order;  // (index, sample, shard, row)
    bool with_plp = false;
    int top_n = 0;
    for (size_t k = 0; k < shard_dirs.size(); ++k) {
        const std::string path = shard_dirs[k] + "/results.h5";
        if (!fs::exists(path))
            HYMOE_FAIL(Exit::bad_input, path, ": no such file (has that shard finished?)");
        shards.push_back(read_results(path));
        const io::H5Reader r(path);
        const bool plp = r.exists("/requests/logprob_offsets");
        const int n = r.exists("/requests/top_tokens")
                          ? static_cast<int>(r.shape("/requests/top_tokens").at(1))
                          : 0;
        if (k > 0 && (plp != with_plp || n != top_n))
            HYMOE_FAIL(Exit::bad_input,
                       path,
                       ": its prompt logprobs or top logprobs differ from ",
                       shard_dirs[0],
                       "/results.h5 (shards of different decks?)");
        with_plp = plp, top_n = n;
        for (size_t row = 0; row < shards[k].index.size(); ++row)
            order.emplace_back(shards[k].index[row], shards[k].sample[row], k, row);
    }
    check_shard_set(shard_dirs);
    std::sort(order.begin(), order.end());
    for (size_t i = 1; i < order.size(); ++i)
        if (std::get<0>(order[i]) == std::get<0>(order[i - 1]) &&
            std::get<1>(order[i]) == std::get<1>(order[i - 1]))
            HYMOE_FAIL(Exit::bad_input,
                       "request ",
                       std::get<0>(order[i]),
                       " is in both ",
                       shard_dirs[std::get<2>(order[i - 1])],
                       " and ",
                       shard_dirs[std::get<2>(order[i])],
                       " (overlapping shards)");
    fs::create_directories(out_dir);
    const comm::Comm self = comm::self_comm();
    io::H5Writer w(out_dir + "/results.h5", self);
    w.copy(shard_dirs[0] + "/results.h5", "/meta");
    w.strings("/meta/gathered_from", shard_dirs);
    Columns cols;
    cols.out_end.push_back(0), cols.plp_end.push_back(0);
    cols.top_n = top_n;
    int64_t n = 0;
    for (const auto& [index, sample, k, row] : order) {
        cols.add(shards[k], row);
        if (++n % 4096 == 0)
            cols.write(w, with_plp);
    }
    cols.write(w, with_plp);
    w.commit();
    log::info(cat("gathered ",
                  n,
                  " requests from ",
                  shard_dirs.size(),
                  " shards into ",
                  out_dir,
                  "/results.h5"));
    return n;
}

}  // namespace hymoe::runtime
