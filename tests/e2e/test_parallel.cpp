// Parallel inference equals the one-rank run, through the real binary. On the tiny model of each
// family (tiny-kimi, tiny-deepseek, and tiny-hymoe.json: the `tiny` preset as KGKG / -ELE, so KDA,
// gated DSA, MoE and LatentMoE), the decks of tests/decks/parallel/ run greedy generation plus
// prompt scoring of 12 requests at np 1 (once per family), then at tp2, ep2, ep4, etp2·ep2, pp2,
// dp2, tp2·ep2, tp2·pp2 and ep2·pp2·dp2 (np 8), each (family, layout) its own test case. Every
// /requests dataset of each results.h5 must equal the np-1 reference: integers and strings (ids,
// index, tokens, greedy tokens, finish reasons) exactly, floats (output, prompt and greedy
// log-probabilities) to |a − b| ≤ 1e-5·max(1, |b|), since partial sums over shards and other
// batchings round differently. --log_level=message prints the worst difference of every layout;
// a failure prints it with the first mismatch of each dataset and keeps the run's folder,
// tests/decks/parallel/out/FAMILY/LAYOUT. The comparison is itself checked on np-1 runs of other
// batchings and on perturbed copies of the reference. Layouts that cannot work exit 2 with one
// line naming the deck key and write nothing.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <ostream>
#include <set>
#include <sstream>

#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>
#include <hdf5.h>

#include "hymoe/io/h5.h"
#include "run_binary.h"

namespace fs = std::filesystem;
namespace data = boost::unit_test::data;
using hymoe::testing::run_hymoe;

namespace {

const std::string kDir = "tests/decks/parallel/";
constexpr double kRelTol = 1e-5;  // |a − b| ≤ kRelTol·max(1, |b|)

// A family: its deck tests/decks/parallel/<name>.yaml (the model, seed and workload).
const std::vector<std::string> kFamilies = {"kimi", "deepseek", "hymoe"};

struct Layout {
    std::string name;
    int tp = 1, dp = 1, pp = 1, ep = 1, etp = 1;
    int world() const { return tp * dp * pp; }
    std::string sets() const {
        std::string s;
        for (auto [key, v] :
             {std::pair{"tp", tp}, {"dp", dp}, {"pp", pp}, {"ep", ep}, {"etp", etp}})
            if (v != 1)
                s += " --set parallel." + std::string(key) + "=" + std::to_string(v);
        return s;
    }
};
std::ostream& operator<<(std::ostream& os, const Layout& l) {
    return os << l.name << " (np " << l.world() << ":" << l.sets() << ")";
}

// world = tp·dp·pp; the expert grid (etp·ep) folds into the tp·dp ranks of one stage.
const std::vector<Layout> kLayouts = {
    {.name = "tp2", .tp = 2},
    {.name = "ep2", .dp = 2, .ep = 2},
    {.name = "ep4", .dp = 4, .ep = 4},
    {.name = "etp2-ep2", .tp = 2, .dp = 2, .ep = 2, .etp = 2},
    {.name = "pp2", .pp = 2},
    {.name = "dp2", .dp = 2},
    {.name = "tp2-ep2", .tp = 2, .ep = 2},
    {.name = "tp2-pp2", .tp = 2, .pp = 2},
    {.name = "ep2-pp2-dp2", .tp = 2, .dp = 2, .pp = 2, .ep = 2},
};

// Every dataset of /requests, read whole, by type class.
struct Results {
    std::map<std::string, std::vector<std::string>> strings;
    std::map<std::string, std::vector<int64_t>> ints;
    std::map<std::string, std::vector<float>> floats;
    std::set<std::string> names() const {
        std::set<std::string> n;
        for (const auto& [k, v] : strings)
            n.insert(k);
        for (const auto& [k, v] : ints)
            n.insert(k);
        for (const auto& [k, v] : floats)
            n.insert(k);
        return n;
    }
};

herr_t collect_name(hid_t, const char* name, const H5L_info_t*, void* out) {
    static_cast<std::vector<std::string>*>(out)->push_back(name);
    return 0;
}

Results read_requests(const std::string& path) {
    using hymoe::io::H5Id;
    std::vector<std::string> names;
    std::map<std::string, H5T_class_t> classes;
    {
        H5Id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose, "open " + path);
        H5Id group(H5Gopen2(file.get(), "/requests", H5P_DEFAULT), H5Gclose, "open /requests");
        hsize_t at = 0;
        H5Literate(group.get(), H5_INDEX_NAME, H5_ITER_INC, &at, collect_name, &names);
        for (const std::string& n : names) {
            H5Id set(H5Dopen2(group.get(), n.c_str(), H5P_DEFAULT), H5Dclose, "open " + n);
            H5Id type(H5Dget_type(set.get()), H5Tclose, "type of " + n);
            classes[n] = H5Tget_class(type.get());
        }
    }
    hymoe::io::H5Reader h5(path);
    Results r;
    for (const std::string& n : names) {
        const std::string full = "/requests/" + n;
        if (classes[n] == H5T_FLOAT)
            r.floats[n] = h5.floats(full);
        else if (classes[n] == H5T_INTEGER)
            r.ints[n] = h5.ints(full);
        else
            r.strings[n] = h5.strings(full);
    }
    return r;
}

// What differs between a run and the reference: every mismatch (the first per dataset), and the
// largest relative difference of any float, where it is.
struct Diff {
    std::vector<std::string> problems;
    double worst = 0;
    std::string worst_at = "-";
    std::string summary() const {
        std::ostringstream s;
        s << "worst relative difference " << worst << " at " << worst_at;
        for (const std::string& p : problems)
            s << "\n  " << p;
        return s.str();
    }
};

template <typename T>
std::string show(const T& v) {
    std::ostringstream s;
    s.precision(9);
    s << v;
    return s.str();
}

// Exact comparison of one dataset: sizes, then the first element that differs.
template <typename T>
void compare_exact(const std::string& name,
                   const std::vector<T>& got,
                   const std::vector<T>& ref,
                   Diff& d) {
    if (got.size() != ref.size()) {
        d.problems.push_back(name + ": " + std::to_string(got.size()) + " elements, np 1 has " +
                             std::to_string(ref.size()));
        return;
    }
    for (size_t i = 0; i < got.size(); ++i)
        if (got[i] != ref[i]) {
            d.problems.push_back(name + "[" + std::to_string(i) + "] = " + show(got[i]) +
                                 ", np 1 has " + show(ref[i]));
            return;
        }
}

Diff compare(const Results& got, const Results& ref) {
    Diff d;
    if (got.names() != ref.names()) {
        std::string a, b;
        for (const std::string& n : got.names())
            a += " " + n;
        for (const std::string& n : ref.names())
            b += " " + n;
        d.problems.push_back("datasets differ:" + a + "; np 1 has:" + b);
    }
    for (const auto& [name, r] : ref.strings)
        if (got.strings.count(name))
            compare_exact(name, got.strings.at(name), r, d);
    for (const auto& [name, r] : ref.ints)
        if (got.ints.count(name))
            compare_exact(name, got.ints.at(name), r, d);
    for (const auto& [name, r] : ref.floats) {
        if (!got.floats.count(name))
            continue;
        const std::vector<float>& g = got.floats.at(name);
        if (g.size() != r.size()) {
            d.problems.push_back(name + ": " + std::to_string(g.size()) + " elements, np 1 has " +
                                 std::to_string(r.size()));
            continue;
        }
        size_t bad = 0;
        for (size_t i = 0; i < g.size(); ++i) {
            const double a = g[i], b = r[i];
            double rel = std::abs(a - b) / std::max(1.0, std::abs(b));
            if (std::isnan(rel))
                rel = INFINITY;
            if (rel > kRelTol && bad++ == 0)
                d.problems.push_back(name + "[" + std::to_string(i) + "] = " + show(a) +
                                     ", np 1 has " + show(b) + " (relative difference " +
                                     show(rel) + ")");
            if (rel > d.worst) {
                d.worst = rel;
                d.worst_at = name + "[" + std::to_string(i) + "]";
            }
        }
        if (bad > 1)
            d.problems.push_back(name + ": " + std::to_string(bad) + " of " +
                                 std::to_string(g.size()) + " values beyond " + show(kRelTol));
    }
    return d;
}

// The np-1 results of each family, run once. tests/decks/parallel/out/ goes when the test binary
// ends, unless a run failed or differed: then it stays, with the references, for a look.
struct References {
    std::map<std::string, Results> results;
    bool keep = false;
    ~References() {
        std::error_code ec;
        if (!keep)
            fs::remove_all(kDir + "out", ec);
    }
};
References& references() {
    static References r;
    return r;
}

std::string deck(const std::string& family) {
    return kDir + family + ".yaml";
}

// Runs the family's deck into out/<family>/<name> (relative to the deck) and reads its results.
// Fails the calling test (and returns false) when the run fails or writes no results.h5.
bool run_and_read(const std::string& family,
                  const std::string& name,
                  int np,
                  const std::string& sets,
                  Results& out) {
    const std::string dir = kDir + "out/" + family + "/" + name;
    fs::remove_all(dir);  // never resume a journal of an earlier run
    auto r = run_hymoe(deck(family) + " --set job.output=out/" + family + "/" + name + sets, np);
    BOOST_TEST(r.code == 0,
               family << " " << name << " at np " << np << ": exit code " << r.code << "; stderr:\n"
                      << r.err);
    if (r.code != 0) {
        references().keep = true;
        return false;
    }
    BOOST_TEST(fs::exists(dir + "/results.h5"), dir + "/results.h5 is missing");
    if (!fs::exists(dir + "/results.h5")) {
        references().keep = true;
        return false;
    }
    out = read_requests(dir + "/results.h5");
    return true;
}

const Results* reference(const std::string& family) {
    References& refs = references();
    if (!refs.results.count(family)) {
        Results r;
        if (!run_and_read(family, "np1", 1, "", r))
            return nullptr;
        refs.results[family] = std::move(r);
    }
    return &refs.results.at(family);
}

struct BadLayout {
    std::string what, sets, key;
    int np;
};
std::ostream& operator<<(std::ostream& os, const BadLayout& b) {
    return os << b.what << " (np " << b.np << ":" << b.sets << ")";
}
const std::vector<BadLayout> kBadLayouts = {
    {"ep exceeds the routed experts",
     " --set model.config=few-experts.json --set parallel.dp=4 --set parallel.ep=4",
     "parallel.ep",
     4},
    {"etp does not divide tp", " --set parallel.dp=2 --set parallel.etp=2", "parallel.etp", 2},
};

std::set<std::string> listing(const std::string& dir) {
    std::set<std::string> names;
    for (const auto& e : fs::recursive_directory_iterator(dir))
        names.insert(e.path().string());
    return names;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(parallel_infer)

// The reference itself: 12 requests, every prompt scored, every request generated to its limit
// (4, or its own 0, 1 or 6) unless it stopped at eos, so the layouts below compare real work.
BOOST_DATA_TEST_CASE(np1_reference_scores_and_generates, data::make(kFamilies), family) {
    const Results* ref = reference(family);
    BOOST_REQUIRE(ref);
    BOOST_REQUIRE(ref->ints.count("prompt_len") && ref->floats.count("prompt_logprobs"));
    BOOST_REQUIRE(ref->ints.count("greedy_token") && ref->floats.count("greedy_logprob"));
    const auto& len = ref->ints.at("prompt_len");
    const auto& out = ref->ints.at("output_offsets");
    const auto& finish = ref->strings.at("finish_reason");
    BOOST_REQUIRE_EQUAL(len.size(), 12u);
    int64_t prompt = 0;
    for (int64_t l : len)
        prompt += l - 1;
    BOOST_TEST(ref->floats.at("prompt_logprobs").size() == static_cast<size_t>(prompt));
    const int64_t own[12] = {4, 4, 0, 4, 4, 1, 4, 4, 4, 4, 6, 4};  // requests.jsonl
    for (size_t i = 0; i < 12; ++i)
        BOOST_TEST((out[i + 1] - out[i] == own[i] || finish[i] == "stop"), "request " << i);
    BOOST_TEST(out.back() >= 30);
    const auto& lp = ref->floats.at("prompt_logprobs");
    BOOST_TEST(std::all_of(lp.begin(), lp.end(), [](float v) { return v < 0.0f; }));
}

BOOST_DATA_TEST_CASE(layout_equals_the_one_rank_run,
                     data::make(kFamilies) * data::make(kLayouts),
                     family,
                     layout) {
    const Results* ref = reference(family);
    BOOST_REQUIRE_MESSAGE(ref, family << ": the np-1 reference run failed");
    Results got;
    BOOST_REQUIRE(run_and_read(family, layout.name, layout.world(), layout.sets(), got));
    const std::string dir = kDir + "out/" + family + "/" + layout.name;
    const std::vector<int64_t> grid =
        hymoe::io::H5Reader(dir + "/results.h5").ints("/meta/grid_tp_dp_pp_ep_etp_edp");
    const int edp = layout.tp * layout.dp / (layout.etp * layout.ep);
    BOOST_TEST(
        grid == std::vector<int64_t>({layout.tp, layout.dp, layout.pp, layout.ep, layout.etp, edp}),
        boost::test_tools::per_element());
    const Diff d = compare(got, *ref);
    BOOST_TEST_MESSAGE(family << " " << layout << ": " << d.summary());
    BOOST_TEST(d.problems.empty(),
               family << " " << layout << " vs np 1 (" << dir << "): " << d.summary());
    if (d.problems.empty())
        fs::remove_all(dir);
    else
        references().keep = true;
}

// The comparison itself, on np-1 runs: another batching (one sequence at a time; all 12 at once)
// passes, since tokens never depend on the batch and logprobs agree to rounding; perturbed
// copies of the reference fail where they were changed.
BOOST_AUTO_TEST_CASE(another_batching_passes_and_perturbations_fail) {
    const Results* ref = reference("hymoe");
    BOOST_REQUIRE(ref);
    for (const char* sets :
         {" --set inference.batch.max_seqs=1",
          " --set inference.batch.max_seqs=12 --set inference.batch.max_tokens=96"}) {
        Results got;
        BOOST_REQUIRE(run_and_read("hymoe", "batching", 1, sets, got));
        const Diff d = compare(got, *ref);
        BOOST_TEST(d.problems.empty(), sets << ": " << d.summary());
        BOOST_TEST(d.worst <= kRelTol);
    }
    fs::remove_all(kDir + "out/hymoe/batching");

    BOOST_TEST(compare(*ref, *ref).problems.empty());
    BOOST_TEST(compare(*ref, *ref).worst == 0.0);
    Results x = *ref;  // within the tolerance: passes, and is the worst difference
    x.floats["prompt_logprobs"][7] *= 1.0f + 4e-6f;
    Diff d = compare(x, *ref);
    BOOST_TEST(d.problems.empty(), d.summary());
    BOOST_TEST(d.worst_at == "prompt_logprobs[7]");
    BOOST_TEST(d.worst > 3e-6);
    x = *ref;  // beyond it
    x.floats["output_logprobs"][3] *= 1.0f + 3e-5f;
    d = compare(x, *ref);
    BOOST_TEST_REQUIRE(d.problems.size() == 1u, d.summary());
    BOOST_TEST(d.problems[0].rfind("output_logprobs[3] = ", 0) == 0, d.problems[0]);
    x = *ref;
    x.floats["greedy_logprob"][0] = std::nanf("");
    BOOST_TEST(compare(x, *ref).problems.size() == 1u);
    x = *ref;  // a token
    x.ints["output_tokens"][5] += 1;
    d = compare(x, *ref);
    BOOST_TEST_REQUIRE(d.problems.size() == 1u, d.summary());
    BOOST_TEST(d.problems[0].rfind("output_tokens[5] = ", 0) == 0, d.problems[0]);
    x = *ref;
    x.ints["greedy_token"][11] += 1;
    BOOST_TEST(compare(x, *ref).problems.size() == 1u);
    x = *ref;  // an id, a missing element, a missing dataset
    x.strings["id"][2] = "other";
    BOOST_TEST(compare(x, *ref).problems.size() == 1u);
    x = *ref;
    x.floats["prompt_logprobs"].pop_back();
    BOOST_TEST(compare(x, *ref).problems.size() == 1u);
    x = *ref;
    x.ints.erase("index");
    BOOST_TEST(compare(x, *ref).problems.size() == 1u);
}

// A layout that cannot work for the model: exit 2, one stderr line that names the deck key
// (through its --set argument), nothing written. few-experts.json has 2 routed experts.
BOOST_DATA_TEST_CASE(a_layout_that_cannot_work_exits_2_naming_the_key,
                     data::make(kBadLayouts),
                     bad) {
    const std::set<std::string> before = listing(kDir);
    auto r = run_hymoe(deck("hymoe") + " --set job.output=out/bad" + bad.sets, bad.np);
    BOOST_TEST(r.code == 2);
    const auto lines = r.err_lines();
    BOOST_TEST_REQUIRE(lines.size() == 1u, "stderr:\n" << r.err);
    BOOST_TEST(lines[0].find(": " + bad.key + ": ") != std::string::npos, lines[0]);
    BOOST_TEST(!fs::exists(kDir + "out/bad"));
    BOOST_TEST((listing(kDir) == before));
}

BOOST_AUTO_TEST_SUITE_END()
