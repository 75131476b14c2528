// make bench: tokenizer encode speed against the npm package `tiktoken` (OpenAI's tokenizer as
// WASM under node, tests/text/tiktoken_peer.cjs), measured in the same run on the same corpus
// (tests/text/corpus.h, each document encoded alone, ordinary text). For cl100k_base and
// o200k_base: MB/s of hymoe (one thread), MB/s of the peer, their ratio, best of 3 passes each.
// Reports, asserts nothing; run from the repository root (make bench does).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include "../text/corpus.h"
#include "hymoe/text/tokenizer.h"

using namespace hymoe;

int main() {
    const std::string dir = "build/bench-text";
    std::filesystem::create_directories(dir);
    const std::vector<std::string> docs = testing::build_corpus();
    size_t bytes = 0;
    for (const auto& d : docs)
        bytes += d.size();
    testing::write_docs(dir + "/corpus.docs", docs);
    if (testing::run_peer("files " + dir) != 0) {
        std::printf("tokenizer: the node peer is missing (make deps installs it)\n");
        return 1;
    }
    std::printf("tokenizer encode: %zu documents, %.2f MB, best of 3\n", docs.size(), bytes / 1e6);
    for (const std::string name : {"cl100k_base", "o200k_base"}) {
        const text::Tokenizer tok = text::load_tiktoken(dir + "/" + name + ".tiktoken", name);
        double best = 1e30;
        size_t ids = 0;
        for (int pass = 0; pass < 3; ++pass) {
            const auto t0 = std::chrono::steady_clock::now();
            ids = 0;
            for (const auto& d : docs)
                ids += tok.encode(d, false).size();
            best = std::min(
                best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
        const double ours = bytes / 1e6 / best;
        const std::string out = testing::run_capture("node tests/text/tiktoken_peer.cjs bench " +
                                                     name + " " + dir + "/corpus.docs 3");
        double peer = 0;
        std::sscanf(out.c_str(), "peer_mb_s %lf", &peer);
        std::printf("  %-12s hymoe %7.2f MB/s  npm tiktoken %7.2f MB/s  ratio %.2fx  (%zu ids)\n",
                    name.c_str(),
                    ours,
                    peer,
                    peer > 0 ? ours / peer : 0.0,
                    ids);
    }
    return 0;
}
