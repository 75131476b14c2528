// The routed experts on grouped rows (moe_experts.h): group the computed slots by expert
// (backend/moe_groups.h), run each expert once on its group (dense_ffn_forward), then sum each
// row's weighted slots in slot order (the CPU form of backend/ops_moe.h's combine).
#include "moe_experts.h"

#include <algorithm>
#include <cstring>

#include "hymoe/backend/moe_groups.h"
#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_moe.h"
#include "hymoe/core/error.h"

namespace hymoe::model::detail {

namespace {

// The expert groups of the slots (backend/moe_groups.h): expert e owns grouped rows
// [offset[e], offset[e+1]), its rows ascending; every computed slot's expert hosted here.
using Groups = backend::MoeGroups;

Groups group_by_expert(const MoeWeights& w, const RowSlots& s) {
    const auto n_exp = static_cast<int64_t>(w.experts.size());
    for (int64_t a = 0; a < s.n * s.k; ++a) {
        const int32_t e = s.expert[a];
        HYMOE_CHECK(e < n_exp &&
                        (e < 0 || w.experts[static_cast<size_t>(e)].up_proj.view().data != nullptr),
                    "expert ",
                    e,
                    " reached a rank that does not host it");
    }
    return backend::moe_group_rows(s.expert, s.n, s.k, n_exp);
}

// The groups' row map [n·k] as a host tensor for the CPU forms of backend/ops_moe.h.
Tensor row_map(const Groups& g) {
    return Tensor{const_cast<int64_t*>(g.row.data()),
                  DType::i64,
                  Device::cpu,
                  {static_cast<int64_t>(g.row.size())}};
}

// f(e, begin, rows) for each expert with rows, then poll(); counts the rows per expert.
template <typename F>
void for_each_expert(const Groups& g,
                     const std::function<void()>& poll,
                     std::vector<int64_t>& tokens_per_expert,
                     F&& f) {
    for (size_t e = 0; e + 1 < g.offset.size(); ++e) {
        const int64_t begin = g.offset[e], rows = g.offset[e + 1] - begin;
        if (rows == 0)
            continue;
        tokens_per_expert[e] += rows;
        f(e, begin, rows);
        poll();
    }
}

// out [n, w] row t = Σ over its computed slots in slot order of weight_i · grouped row.
void sum_slots(const Groups& g, const RowSlots& s, const Tensor& grouped, Tensor& out) {
    ops::moe_combine(grouped, row_map(g), s.weight, s.k, out);
}

}  // namespace

void experts_forward(const MoeWeights& w,
                     ExpertAct act,
                     const RowSlots& slots,
                     const Tensor& in,
                     Tensor& out,
                     const std::function<void()>& poll,
                     std::vector<int64_t>& tokens_per_expert) {
    const Groups g = group_by_expert(w, slots);
    const int64_t width = in.dim(1), n_assign = g.offset.back();
    std::vector<int64_t> token(static_cast<size_t>(n_assign));  // [n_assign] each grouped row's
    for (int64_t a = 0; a < slots.n * slots.k; ++a)             //   row of `in`
        if (g.row[static_cast<size_t>(a)] >= 0)
            token[static_cast<size_t>(g.row[static_cast<size_t>(a)])] = a / slots.k;
    int64_t most = 0;  // the largest group
    for (size_t e = 0; e + 1 < g.offset.size(); ++e)
        most = std::max(most, g.offset[e + 1] - g.offset[e]);
    // One expert's input rows at a time (in cache for its GEMMs), the outputs of all of them.
    Buffer in_e(DType::f32, {most, width}, uninit);       // [most, w]
    Buffer out_g(DType::f32, {n_assign, width}, uninit);  // [n_assign, w] rows grouped by expert
    std::vector<int> adapter_g;                           // [n_assign] each grouped row's adapter
    if (slots.adapter) {
        adapter_g.resize(static_cast<size_t>(n_assign));
        for (int64_t a = 0; a < slots.n * slots.k; ++a)
            if (g.row[static_cast<size_t>(a)] >= 0)
                adapter_g[static_cast<size_t>(g.row[static_cast<size_t>(a)])] =
                    slots.adapter[a / slots.k];
    }
    const auto row_bytes = static_cast<size_t>(width) * sizeof(float);
    for_each_expert(g, poll, tokens_per_expert, [&](size_t e, int64_t begin, int64_t rows) {
        for (int64_t r = 0; r < rows; ++r)
            std::memcpy(in_e.ptr<float>() + r * width,
                        in.ptr<float>() + token[static_cast<size_t>(begin + r)] * width,
                        row_bytes);
        Tensor out_rows = out_g.view().rows(begin, rows);
        SeqBatch row_batch;
        if (slots.adapter)
            row_batch = single_rows(
                std::vector<int>(adapter_g.begin() + begin, adapter_g.begin() + begin + rows));
        dense_ffn_forward(backend::cpu_ctx(),
                          w.experts[e],
                          act,
                          in_e.view().rows(0, rows),
                          out_rows,
                          slots.adapter ? &row_batch : nullptr);
    });
    sum_slots(g, slots, out_g.view(), out);
}

}  // namespace hymoe::model::detail
