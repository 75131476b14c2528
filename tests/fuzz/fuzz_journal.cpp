// Fuzz target: the results journal of a killed infer run (runtime/results.h), read back on the
// rerun. HDF5 itself is not what is fuzzed: the input drives the *contents* of one or two
// well-formed segment files (column lengths, offsets, ids, finish codes, the deck sha256 and
// resolved deck: this deck's, another version's with a key added, another deck's), as a torn,
// edited or foreign journal would hold them. The journal is opened as a resume, then
// merged into results.h5: both must succeed or throw one hymoe::Error.
#include <filesystem>
#include <fuzzer/FuzzedDataProvider.h>

#include <mpi.h>

#include "fuzz.h"
#include "hymoe/deck/deck.h"
#include "hymoe/io/h5.h"
#include "hymoe/runtime/rerun.h"
#include "hymoe/runtime/results.h"

namespace {

using namespace hymoe;

constexpr const char* kDeck = "job: {kind: infer, name: fuzz}\n";

template <typename T>
std::vector<T> column(FuzzedDataProvider& in, T lo, T hi) {
    std::vector<T> v(in.ConsumeIntegralInRange<size_t>(0, 6));
    for (T& x : v)
        x = in.ConsumeIntegralInRange<T>(lo, hi);
    return v;
}

template <typename T>
Tensor view_of(std::vector<T>& v, DType dtype) {
    return Tensor{v.data(), dtype, Device::cpu, {static_cast<int64_t>(v.size())}};
}

void write_segment(FuzzedDataProvider& in, const std::string& path, const comm::Comm& self) {
    io::H5Writer w(path, self);
    switch (in.ConsumeIntegralInRange(0, 3)) {
        case 0:
            w.text("/deck_sha256", runtime::results_deck_sha(kDeck));
            break;
        case 1:  // another hymoe version: a key added
            w.text("/deck_sha256", "other");
            w.text("/deck_resolved", "job: {kind: infer, name: fuzz, added: 1}\n");
            break;
        case 2:
            w.text("/deck_sha256", "other");
            w.text("/deck_resolved", "job: {kind: infer, name: another}\n");
            break;
        default:
            w.text("/deck_sha256", "other");
    }
    // Request indices stay below 2^16: a real journal's are below its dataset's line count.
    auto index = column<int64_t>(in, -1, 1 << 16), line = column<int64_t>(in, -1, 1 << 17);
    auto prompt_len = column<int64_t>(in, -1, 8), n_out = column<int64_t>(in, -1, 8);
    auto greedy = column<int64_t>(in, -1, 8), tokens = column<int64_t>(in, -1, 8);
    auto finish = column<int32_t>(in, -1, 2);
    std::vector<float> logprobs(in.ConsumeIntegralInRange<size_t>(0, 12), -1.0f);
    std::vector<float> greedy_logprob(in.ConsumeIntegralInRange<size_t>(0, 6), -0.5f);
    w.array("/index", view_of(index, DType::i64));
    w.array("/line", view_of(line, DType::i64));
    w.array("/prompt_len", view_of(prompt_len, DType::i64));
    w.array("/n_out", view_of(n_out, DType::i64));
    w.array("/finish", view_of(finish, DType::i32));
    w.array("/tokens", view_of(tokens, DType::i64));
    w.array("/logprobs", view_of(logprobs, DType::f32));
    w.array("/greedy_token", view_of(greedy, DType::i64));
    w.array("/greedy_logprob", view_of(greedy_logprob, DType::f32));
    std::vector<std::string> id(in.ConsumeIntegralInRange<size_t>(0, 6)), adapter(id.size());
    for (std::string& s : id)
        s = in.ConsumeRandomLengthString(8);
    if (in.ConsumeBool())
        adapter.resize(in.ConsumeIntegralInRange<size_t>(0, 6));
    w.strings("/id", id);
    w.strings("/adapter", adapter);
    w.commit();
}

const comm::Comm* g_self = nullptr;  // MPI_COMM_SELF duplicated, made with MPI

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
    MPI_Init(argc, argv);
    g_self = new comm::Comm(comm::self_comm());  // lives to exit, as MPI does
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const comm::Comm& world = *g_self;
    const comm::Comm& self = *g_self;
    static const deck::Deck deck = [] {
        const uint8_t line[] = "{\"tokens\": [1]}\n";
        fuzz::write_file("requests.jsonl", line, sizeof(line) - 1);
        return deck::parse_deck(
            "job: {kind: infer, name: fuzz}\nmodel: {preset: tiny, init: random}\n"
            "inference: {dataset: requests.jsonl}\n",
            fuzz::scratch_dir() + "/deck.yaml",
            {});
    }();
    FuzzedDataProvider in(data, size);
    const std::string out = fuzz::scratch_dir() + "/out";
    std::filesystem::remove_all(out);
    std::filesystem::create_directories(out + "/results.parts");
    for (int k = in.ConsumeIntegralInRange(1, 2), s = 0; s < k; ++s)
        fuzz::guarded(
            [&] { write_segment(in, cat(out, "/results.parts/seg-00000", s, ".h5"), self); });
    return fuzz::guarded([&] {
        runtime::ResultsJournal journal(out, kDeck, false, 0, {world, self, 0, 1});
        io::RunMeta meta;
        meta.deck = &deck;
        journal.finish(meta);
    });
}
