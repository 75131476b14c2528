// The lora job's best-evaluation and early-stopping bookkeeping (runtime/eval_watch.h) on series
// worked by hand: step 0 ignored, the strict minimum as best (the first of ties), the count reset
// only by an improvement of more than min_delta (HF's EarlyStoppingCallback), NaN never a best,
// and a replayed prefix equal to the live state.
#include <cmath>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/runtime/eval_watch.h"

using hymoe::runtime::EvalWatch;

BOOST_AUTO_TEST_SUITE(eval_watch)

BOOST_AUTO_TEST_CASE(best_is_the_first_strict_minimum_after_step_0) {
    EvalWatch w;
    BOOST_TEST(!w.add(0, 0.1));  // the base model: no best, not counted
    BOOST_TEST(w.best_step == -1);
    BOOST_TEST(w.add(5, 2.0));
    BOOST_TEST(w.add(10, 1.5));
    BOOST_TEST(!w.add(15, 1.5));  // a tie keeps the first
    BOOST_TEST(!w.add(20, 1.7));
    BOOST_TEST(w.best_step == 10);
    BOOST_TEST(w.best == 1.5);
    BOOST_TEST(w.stale == 2);
    BOOST_TEST(!w.should_stop());  // patience 0: never
    BOOST_TEST(!w.add(25, std::nan("")));
    BOOST_TEST(w.best_step == 10);
}

BOOST_AUTO_TEST_CASE(patience_counts_evaluations_without_an_improvement_above_min_delta) {
    EvalWatch w{2, 0.1};
    const std::vector<double> v = {3.0, 2.0, 1.95, 1.96, 1.5, 1.45, 1.44};
    // 1.95 is a best but within min_delta of 2.0 (stale 1); 1.96 makes 2: stop; 1.5 resets it
    std::vector<bool> best, stop;
    for (size_t i = 0; i < v.size(); ++i) {
        best.push_back(w.add(10 * static_cast<int64_t>(i + 1), v[i]));
        stop.push_back(w.should_stop());
    }
    BOOST_TEST(best == (std::vector<bool>{true, true, true, false, true, true, true}));
    BOOST_TEST(stop == (std::vector<bool>{false, false, false, true, false, false, true}));
    BOOST_TEST(w.best_step == 70);
    BOOST_TEST(w.stale == 2);
}

BOOST_AUTO_TEST_CASE(a_replayed_history_gives_the_live_state) {
    const std::vector<double> v = {0.9, 4.0, 3.0, 3.5, 2.9, 2.95, 3.1};
    EvalWatch live{3, 0.05};
    for (size_t i = 0; i < v.size(); ++i) {
        live.add(3 * static_cast<int64_t>(i), v[i]);
        EvalWatch again{3, 0.05};
        for (size_t j = 0; j <= i; ++j)
            again.add(3 * static_cast<int64_t>(j), v[j]);
        BOOST_TEST(again.best_step == live.best_step);
        BOOST_TEST(again.stale == live.stale);
    }
    BOOST_TEST(live.best_step == 12);  // 2.9 at the fifth evaluation (step 12)
    BOOST_TEST(live.stale == 2);
}

BOOST_AUTO_TEST_SUITE_END()
