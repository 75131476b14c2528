// The host plan of the GPU MoE layer over an ep group (model/moe_ep_plan.h).
#include "hymoe/model/moe_ep_plan.h"

#include <algorithm>

#include "hymoe/core/error.h"
#include "hymoe/model/shard.h"

namespace hymoe::model {

std::vector<RowRange> moe_micro_batches(int64_t n_tok, bool overlap) {
    if (!overlap)
        return {RowRange{0, n_tok}};
    const int64_t first = (n_tok + 1) / 2;
    return {RowRange{0, first}, RowRange{first, n_tok - first}};
}

std::vector<int> local_expert_index(const std::vector<int>& placement,
                                    int64_t n_exp,
                                    int ep,
                                    int ep_rank) {
    HYMOE_CHECK(ep >= 1 && n_exp % ep == 0 &&
                    (placement.empty() || static_cast<int64_t>(placement.size()) == n_exp),
                "local_expert_index: ",
                n_exp,
                " experts over ep ",
                ep,
                " with a placement of ",
                placement.size());
    std::vector<int> local(static_cast<size_t>(n_exp), -1);
    int next = 0;
    for (int64_t e = 0; e < n_exp; ++e)
        if (expert_rank_of(placement, e, n_exp, ep) == ep_rank)
            local[static_cast<size_t>(e)] = next++;
    return local;
}

EpSendPlan plan_ep_send(const Routing& r,
                        int64_t top_k,
                        const std::vector<int>& placement,
                        int64_t n_exp,
                        int ep,
                        RowRange tokens) {
    const int64_t k = top_k, end = tokens.begin + tokens.count;
    HYMOE_CHECK(
        tokens.begin >= 0 && tokens.count >= 0 && static_cast<int64_t>(r.idx.size()) >= end * k,
        "plan_ep_send: rows [",
        tokens.begin,
        ", ",
        end,
        ") of a routing of ",
        r.idx.size() / static_cast<size_t>(std::max<int64_t>(k, 1)),
        " tokens");
    auto rank_of = [&](size_t a) { return expert_rank_of(placement, r.idx[a], n_exp, ep); };
    EpSendPlan p;
    p.tokens = tokens;
    p.send_rows.assign(static_cast<size_t>(ep), 0);
    p.back_row.assign(static_cast<size_t>(tokens.count * ep), -1);
    // pass 1: which ranks each token visits (back_row marks them), rows per rank
    for (int64_t t = tokens.begin; t < end; ++t)
        for (int64_t i = 0; i < k; ++i) {
            const auto a = static_cast<size_t>(t * k + i);
            if (!r.kept[a])
                continue;
            const int dest = rank_of(a);
            int64_t& mark = p.back_row[static_cast<size_t>((t - tokens.begin) * ep + dest)];
            if (mark < 0) {
                mark = 0;
                ++p.send_rows[static_cast<size_t>(dest)];
            }
        }
    std::vector<int64_t> cursor(static_cast<size_t>(ep), 0);  // [ep] next row of each rank
    for (int d = 1; d < ep; ++d)
        cursor[static_cast<size_t>(d)] = cursor[static_cast<size_t>(d - 1)] + p.send_rows[d - 1];
    const int64_t n_send = cursor.back() + p.send_rows.back();
    p.token.assign(static_cast<size_t>(n_send), -1);
    p.ids.assign(static_cast<size_t>(n_send * k), -1);
    p.weight.assign(static_cast<size_t>(n_send * k), 0.0f);
    // pass 2: tokens ascending, so each destination's rows come in token order
    for (int64_t t = tokens.begin; t < end; ++t) {
        int64_t* rows = p.back_row.data() + (t - tokens.begin) * ep;  // [ep]
        for (int d = 0; d < ep; ++d)
            if (rows[d] >= 0) {
                rows[d] = cursor[static_cast<size_t>(d)]++;
                p.token[static_cast<size_t>(rows[d])] = t;
            }
        for (int64_t i = 0; i < k; ++i) {
            const auto a = static_cast<size_t>(t * k + i);
            if (!r.kept[a])
                continue;
            const int64_t row = rows[rank_of(a)];
            p.ids[static_cast<size_t>(row * k + i)] = static_cast<int32_t>(r.idx[a]);
            p.weight[static_cast<size_t>(row * k + i)] = r.weight[a];
        }
    }
    return p;
}

std::vector<int32_t> local_expert_ids(const std::vector<int32_t>& recv_ids,
                                      const std::vector<int>& local_index) {
    std::vector<int32_t> local(recv_ids.size(), -1);
    for (size_t a = 0; a < recv_ids.size(); ++a) {
        const int32_t id = recv_ids[a];
        if (id < 0)
            continue;
        HYMOE_CHECK(static_cast<size_t>(id) < local_index.size() &&
                        local_index[static_cast<size_t>(id)] >= 0,
                    "local_expert_ids: a row for expert ",
                    id,
                    ", not hosted on this rank");
        local[a] = local_index[static_cast<size_t>(id)];
    }
    return local;
}

}  // namespace hymoe::model
