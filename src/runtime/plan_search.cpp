// The layout search of runtime/plan.h: enumerate (tp, pp, dp, ep, etp) for a GPU count, reject
// each layout by its binding constraint (a model rule of runtime/job.h, then memory) and rank the
// ones that fit by the plan's time per token. Also plan_job, the plan of a job's deck.
#include <algorithm>
#include <cstdio>
#include <map>
#include <tuple>

#include "hymoe/core/error.h"
#include "hymoe/runtime/job.h"
#include "hymoe/runtime/plan.h"

namespace hymoe::runtime {

namespace {

std::vector<int> divisors(int n) {
    std::vector<int> out;
    for (int i = 1; i <= n; ++i)
        if (n % i == 0)
            out.push_back(i);
    return out;
}

std::string gibibytes(double bytes) {  // memory is in GiB (2^30 bytes) everywhere
    char s[32];
    std::snprintf(s, sizeof s, "%.1f", bytes / (1 << 30));
    return s;
}

// The capacity as the deck wrote it ("141", "80.5").
bool ranks_before(const LayoutCandidate& a, const LayoutCandidate& b) {
    if (a.seconds_per_token != b.seconds_per_token)
        return a.seconds_per_token < b.seconds_per_token;
    if (a.peak_bytes != b.peak_bytes)
        return a.peak_bytes < b.peak_bytes;
    const parallel::Layout &x = a.layout, &y = b.layout;
    return std::tie(x.tp, x.pp, x.ep, x.etp) < std::tie(y.tp, y.pp, y.ep, y.etp);
}

}  // namespace

LayoutSearch search_layouts(const model::ModelConfig& m, const deck::Deck& deck, int gpus) {
    LayoutSearch s;
    s.gpus = gpus;
    const int gpn = deck.hardware.gpus_per_node;
    const bool moe = count_layers(m, model::Ffn::moe) + count_layers(m, model::Ffn::latent_moe) > 0;
    std::map<std::string, int> count;
    for (int tp : divisors(gpus)) {
        if (tp > gpn)  // a tp group stays inside a node
            continue;
        for (int pp : divisors(gpus / tp)) {
            const int dp = gpus / (tp * pp), stage = tp * dp;
            for (int ep : moe ? divisors(stage) : std::vector<int>{1}) {
                for (int etp : moe ? divisors(stage / ep) : std::vector<int>{1}) {
                    if (etp > gpn)
                        continue;
                    LayoutCandidate c;
                    c.layout = parallel::Layout{tp, dp, pp, ep, etp};
                    if (std::optional<LayoutProblem> p = model_layout_problem(m, c.layout)) {
                        c.rule = p->rule;
                        c.reason = p->key + ": " + p->what;
                    } else {
                        Plan plan = make_plan(m, c.layout, deck);
                        c.fits = plan.fits;
                        c.peak_bytes = plan.peak_bytes;
                        c.seconds_per_token = plan.seconds_per_token;
                        c.prefill_seconds = plan.prefill.total;  // 0 when not planned
                        c.decode_seconds = plan.decode.total;
                        c.train_seconds = plan.train.total;
                        c.dominant = plan.dominant;
                        if (!c.fits) {
                            c.rule = "memory > " + gibibytes(plan.capacity_bytes) + " GiB";
                            c.reason = "memory " + gibibytes(plan.peak_bytes) + " GiB > " +
                                       gibibytes(plan.capacity_bytes) + " GiB";
                        }
                    }
                    if (c.fits) {
                        s.fitting.push_back(c);
                    } else {
                        ++count[c.rule];
                        s.rejected.push_back(c);
                    }
                }
            }
        }
    }
    std::stable_sort(s.fitting.begin(), s.fitting.end(), ranks_before);
    s.reasons.assign(count.begin(), count.end());
    std::stable_sort(s.reasons.begin(), s.reasons.end(), [](const auto& a, const auto& b) {
        return a.second > b.second;
    });
    if (!s.fitting.empty())
        s.best = make_plan(m, s.fitting.front().layout, deck);
    return s;
}

JobPlan plan_job(const Job& job) {
    JobPlan jp{make_plan(job.model, job.layout, job.deck), std::nullopt};
    if (job.deck.plan.gpus > 0)
        jp.search = search_layouts(job.model, job.deck, job.deck.plan.gpus);
    return jp;
}

}  // namespace hymoe::runtime
