// publish_dir (io/durable.h): a finished folder replaces an older one whole, or appears where
// there was none; the temporary name is gone afterwards and the old contents are not mixed in.
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

#include <boost/test/unit_test.hpp>

#include "hymoe/core/error.h"
#include "hymoe/io/durable.h"

namespace fs = std::filesystem;

namespace {

struct Scratch {
    fs::path root = fs::temp_directory_path() / ("hymoe_durable_" + std::to_string(::getpid()));
    Scratch() { fs::create_directories(root); }
    ~Scratch() { fs::remove_all(root); }
};

void write(const fs::path& p, const std::string& text) {
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
}

std::string read(const fs::path& p) {
    std::ifstream in(p);
    return {std::istreambuf_iterator<char>(in), {}};
}

}  // namespace

BOOST_AUTO_TEST_SUITE(durable)

BOOST_AUTO_TEST_CASE(publish_where_there_was_none) {
    const Scratch s;
    write(s.root / "a.partial" / "x.json", "new");
    hymoe::io::publish_dir((s.root / "a.partial").string(), (s.root / "a").string());
    BOOST_TEST(read(s.root / "a" / "x.json") == "new");
    BOOST_TEST(!fs::exists(s.root / "a.partial"));
}

BOOST_AUTO_TEST_CASE(publish_replaces_the_old_folder_whole) {
    const Scratch s;
    write(s.root / "a" / "x.json", "old");
    write(s.root / "a" / "only_old.json", "old");
    write(s.root / "a.partial" / "x.json", "new");
    hymoe::io::publish_dir((s.root / "a.partial").string(), (s.root / "a").string());
    BOOST_TEST(read(s.root / "a" / "x.json") == "new");
    BOOST_TEST(!fs::exists(s.root / "a" / "only_old.json"));
    BOOST_TEST(!fs::exists(s.root / "a.partial"));
    BOOST_TEST(!fs::exists(s.root / "a.old"));
}

BOOST_AUTO_TEST_CASE(a_missing_folder_is_an_internal_error_naming_it) {
    const Scratch s;
    try {
        hymoe::io::publish_dir((s.root / "nothing").string(), (s.root / "a").string());
        BOOST_FAIL("publishing a missing folder succeeded");
    } catch (const hymoe::Error& e) {
        BOOST_TEST(std::string(e.what()).find("nothing") != std::string::npos);
        BOOST_TEST(static_cast<int>(e.code()) == static_cast<int>(hymoe::Exit::internal));
    }
}

BOOST_AUTO_TEST_SUITE_END()
