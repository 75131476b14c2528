// The multilingual corpus of the tokenizer peer test and benchmark, and the file exchange with the
// node peer (tests/text/tiktoken_peer.cjs). Documents, each encoded alone:
//   - every Debian licence in /usr/share/common-licenses,
//   - man pages (zcat): 12 from each translated section 1 (ja, ko, ru, de, fr, pl, ...) and 80
//     English ones,
//   - /usr/share/unicode/NamesList.txt as it is,
//   - Unicode data as text: for every range of /usr/share/unicode/DerivedAge.txt assigned by
//     Unicode 13.0 or earlier (both sides agree on those properties), sample code points written
//     as words of 1 to 7 characters with spaces, digits, apostrophes and newlines between them,
//   - a hand-written set: CJK, Hangul, Arabic, Devanagari, Thai, emoji (ZWJ, flags, skin tones),
//     combining marks, contractions ('s 'LL ’re), runs of spaces, tabs and CRLF.
// Files that are not valid UTF-8 are left out. The order and content are deterministic.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "hymoe/text/utf8.h"

namespace hymoe::testing {

inline std::string read_all(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

inline std::string run_capture(const std::string& cmd) {
    std::string out;
    if (FILE* p = popen(cmd.c_str(), "r")) {
        char buf[65536];
        for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;)
            out.append(buf, n);
        pclose(p);
    }
    return out;
}

inline void append_utf8(std::string& s, uint32_t cp) {
    if (cp < 0x80) {
        s += static_cast<char>(cp);
    } else if (cp < 0x800) {
        s += static_cast<char>(0xC0 | cp >> 6), s += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        s += static_cast<char>(0xE0 | cp >> 12), s += static_cast<char>(0x80 | (cp >> 6 & 0x3F));
        s += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        s += static_cast<char>(0xF0 | cp >> 18), s += static_cast<char>(0x80 | (cp >> 12 & 0x3F));
        s += static_cast<char>(0x80 | (cp >> 6 & 0x3F)), s += static_cast<char>(0x80 | (cp & 0x3F));
    }
}

// Code points of DerivedAge.txt assigned up to Unicode 13.0, written as short words.
inline std::string unicode_sample_doc(const std::string& derived_age) {
    std::istringstream in(read_all(derived_age));
    std::string doc, word_sep[] = {" ", "  ", "\n", " 12", "'s ", "\t", ", ", "\r\n", " 2024 "};
    uint32_t k = 0;
    for (std::string line; std::getline(in, line);) {
        if (line.empty() || line[0] == '#')
            continue;
        const size_t semi = line.find(';');
        if (semi == std::string::npos)
            continue;
        const double age = std::atof(line.c_str() + semi + 1);
        if (age > 13.0)
            continue;
        const uint32_t lo = static_cast<uint32_t>(
            std::stoul(line.substr(0, line.find_first_of(".;")), nullptr, 16));
        const size_t dots = line.find("..");
        const uint32_t hi =
            dots != std::string::npos && dots < semi
                ? static_cast<uint32_t>(std::stoul(line.substr(dots + 2), nullptr, 16))
                : lo;
        const uint32_t step = std::max<uint32_t>(1, (hi - lo) / 64);
        for (uint32_t cp = lo; cp <= hi; cp += step) {
            const bool surrogate = cp >= 0xD800 && cp <= 0xDFFF;
            const bool nonchar = (cp & 0xFFFE) == 0xFFFE || (cp >= 0xFDD0 && cp <= 0xFDEF);
            if (surrogate || nonchar || cp == 0)
                continue;
            append_utf8(doc, cp);
            ++k;
            if (k % (1 + k % 7) == 0)
                doc += word_sep[k % 9];
        }
    }
    return doc;
}

inline std::vector<std::string> handwritten_docs() {
    return {
        "漢字とひらがなとカタカナ、한국어 텍스트, 中文分词测试：我们今天去北京大学。",
        std::string("Emoji: 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵") +
            " ❤️‍🔥 🧑🏿‍🚀" + " 1️⃣ ✌︎" + " 🏳️‍🌈 and text",
        "العربية: مرحبا بالعالم. हिन्दी: नमस्ते दुनिया। ไทย: สวัสดีชาวโลก",
        "Combining: e\u0301 a\u0308 n\u0303 Ǻ ḉ ṩ ὦ ᾇ Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇",
        "IT'S THE CAT'S. We'LL go, you'RE here, they've, I'm, he'd. It’s ’re 'S 'ſ",
        "   leading spaces\n\n\n   \t\t mixed \r\n\r\n trailing   \n    ",
        "numbers 1234567890 3.14159 1,000,000 ١٢٣٤ ४२ 一二三 ⅷ ½ ²³",
        "code: for (int i = 0; i < n; ++i) { x[i] += y[i] * 2; } // C++ <|not|> a//b/c",
        "Ελληνικά, русский язык, українська, ქართული, Հայերեն, עברית, ᏣᎳᎩ, ᠮᠣᠩᠭᠣᠯ",
        std::string(3000, ' ') + "x" + std::string(2000, '\n') + "y" + std::string(1500, 'a'),
    };
}

inline std::vector<std::string> build_corpus() {
    namespace fs = std::filesystem;
    std::vector<std::string> docs;
    auto add = [&](std::string s) {
        if (!s.empty() && text::utf8_first_invalid(s) == std::string::npos)
            docs.push_back(std::move(s));
    };
    auto sorted = [](const fs::path& dir) {
        std::vector<fs::path> v;
        std::error_code ec;
        for (const auto& e : fs::directory_iterator(dir, ec))
            v.push_back(e.path());
        std::sort(v.begin(), v.end());
        return v;
    };
    std::set<fs::path> seen;
    for (const auto& p : sorted("/usr/share/common-licenses"))
        if (fs::is_regular_file(p) && seen.insert(fs::canonical(p)).second)
            add(read_all(p.string()));
    const char* langs[] = {
        "ja", "ko", "ru", "de", "fr", "pl", "cs", "es", "it", "pt_BR", "sv", "tr", "sr", "hu"};
    for (const char* l : langs) {
        int n = 0;
        for (const auto& p : sorted(fs::path("/usr/share/man") / l / "man1"))
            if (p.extension() == ".gz" && n++ < 12)
                add(run_capture("zcat -f '" + p.string() + "'"));
    }
    int n = 0;
    for (const auto& p : sorted("/usr/share/man/man1"))
        if (p.extension() == ".gz" && n++ < 80)
            add(run_capture("zcat -f '" + p.string() + "'"));
    add(read_all("/usr/share/unicode/NamesList.txt"));
    if (fs::exists("/usr/share/unicode/DerivedAge.txt"))
        add(unicode_sample_doc("/usr/share/unicode/DerivedAge.txt"));
    for (auto& d : handwritten_docs())
        add(std::move(d));
    return docs;
}

// [u32 n_bytes][bytes] per document.
inline void write_docs(const std::string& path, const std::vector<std::string>& docs) {
    std::ofstream out(path, std::ios::binary);
    for (const auto& d : docs) {
        const auto n = static_cast<uint32_t>(d.size());
        out.write(reinterpret_cast<const char*>(&n), 4);
        out.write(d.data(), static_cast<std::streamsize>(d.size()));
    }
}

// [u32 n][n × u32] per document.
inline std::vector<std::vector<int32_t>> read_ids(const std::string& path) {
    const std::string b = read_all(path);
    std::vector<std::vector<int32_t>> out;
    for (size_t at = 0; at + 4 <= b.size();) {
        uint32_t n = 0;
        std::memcpy(&n, b.data() + at, 4);
        std::vector<int32_t> ids(n);
        std::memcpy(ids.data(), b.data() + at + 4, 4ull * n);
        out.push_back(std::move(ids));
        at += 4 + 4ull * n;
    }
    return out;
}

// The node peer script, run from the repository root; its exit status.
inline int run_peer(const std::string& args) {
    return std::system(("node tests/text/tiktoken_peer.cjs " + args).c_str());
}

}  // namespace hymoe::testing
