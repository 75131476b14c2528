// The per-micro-batch phases of the expert-parallel MoE layer (moe_dispatch.h): dispatch layout,
// count and metadata exchange, payload all-to-all, grouped hosted experts, reverse all-to-all and
// the owner's sum. Row order is fixed on both sides (owner: destination, then token; expert:
// source, then token), so each token's arithmetic never depends on message arrival.
#include "moe_dispatch.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "hymoe/core/error.h"

namespace hymoe::model::detail {

namespace {

int64_t total(const std::vector<int64_t>& rows) {
    int64_t n = 0;
    for (int64_t r : rows)
        n += r;
    return n;
}

// Row offsets of a count vector: [n + 1].
std::vector<int64_t> offsets_of(const std::vector<int64_t>& rows) {
    std::vector<int64_t> at(rows.size() + 1, 0);
    for (size_t i = 0; i < rows.size(); ++i)
        at[i + 1] = at[i] + rows[i];
    return at;
}

// comm::all_to_all_v, or a copy in a group of one.
void exchange(const Tensor& in,
              const std::vector<int64_t>& send_rows,
              Tensor& out,
              const std::vector<int64_t>& recv_rows,
              const comm::Comm* ep) {
    if (ep)
        comm::all_to_all_v(in, send_rows, out, recv_rows, *ep);
    else
        std::memcpy(out.data, in.data, in.bytes());
}

comm::Request exchange_start(const Tensor& in,
                             const std::vector<int64_t>& send_rows,
                             Tensor& out,
                             const std::vector<int64_t>& recv_rows,
                             const comm::Comm* ep) {
    if (ep)
        return comm::all_to_all_v_start(in, send_rows, out, recv_rows, *ep);
    std::memcpy(out.data, in.data, in.bytes());
    return comm::Request();
}

}  // namespace

void plan_batch(const Routing& r,
                int64_t top_k,
                const ExpertHosting& hosting,
                const Tensor& payload /*[n_own, w]*/,
                MoeBatch& b) {
    const int64_t k = top_k, width = payload.dim(1), end = b.first + b.n_tok;
    // Pass 1: rows per destination (a token once per distinct rank among its kept experts).
    b.send_rows.assign(static_cast<size_t>(hosting.ep), 0);
    std::vector<int64_t> seen(static_cast<size_t>(hosting.ep), -1);  // [ep] last token counted
    for (int64_t t = b.first; t < end; ++t)
        for (int64_t i = 0; i < k; ++i) {
            const auto a = static_cast<size_t>(t * k + i);
            const auto dest = static_cast<size_t>(hosting.rank_of(r.idx[a]));
            if (r.kept[a] && seen[dest] != t) {
                seen[dest] = t;
                ++b.send_rows[dest];
            }
        }
    const int64_t n_send = total(b.send_rows);
    b.send = Buffer(DType::f32, {n_send, width});
    b.send_ids = Buffer(DType::i32, {n_send, k});
    b.send_weight = Buffer(DType::f32, {n_send, k});
    b.token.assign(static_cast<size_t>(n_send), -1);
    std::fill(b.send_ids.ptr<int32_t>(), b.send_ids.ptr<int32_t>() + n_send * k, -1);

    // Pass 2: tokens ascending, so each destination's rows come in token order.
    std::vector<int64_t> cursor = offsets_of(b.send_rows);             // [ep + 1]
    std::vector<int64_t> row_of(static_cast<size_t>(hosting.ep), -1);  // [ep] this token's row
    const auto row_bytes = static_cast<size_t>(width) * sizeof(float);
    for (int64_t t = b.first; t < end; ++t) {
        for (int64_t i = 0; i < k; ++i) {
            const auto a = static_cast<size_t>(t * k + i);
            if (!r.kept[a])
                continue;
            const auto dest = static_cast<size_t>(hosting.rank_of(r.idx[a]));
            int64_t row = row_of[dest];
            if (row < 0) {
                row = row_of[dest] = cursor[dest]++;
                b.token[static_cast<size_t>(row)] = t;
                std::memcpy(
                    b.send.ptr<float>() + row * width, payload.ptr<float>() + t * width, row_bytes);
            }
            b.send_ids.ptr<int32_t>()[row * k + i] = static_cast<int32_t>(r.idx[a]);
            b.send_weight.ptr<float>()[row * k + i] = r.weight[a];
        }
        for (int64_t i = 0; i < k; ++i)  // reset only the entries this token touched
            row_of[static_cast<size_t>(hosting.rank_of(r.idx[static_cast<size_t>(t * k + i)]))] =
                -1;
    }
}

void exchange_metadata(MoeBatch& b, const comm::Comm* ep) {
    b.recv_rows = ep ? comm::exchange_counts(b.send_rows, *ep) : b.send_rows;
    const int64_t n_recv = total(b.recv_rows), n_send = b.send.view().dim(0);
    const int64_t width = b.send.view().dim(1), k = b.send_ids.view().dim(1);
    b.recv = Buffer(DType::f32, {n_recv, width});
    b.recv_ids = Buffer(DType::i32, {n_recv, k});
    b.recv_weight = Buffer(DType::f32, {n_recv, k});
    b.partial = Buffer(DType::f32, {n_recv, width});
    b.back = Buffer(DType::f32, {n_send, width});
    exchange(b.send_ids.view(), b.send_rows, b.recv_ids.view(), b.recv_rows, ep);
    exchange(b.send_weight.view(), b.send_rows, b.recv_weight.view(), b.recv_rows, ep);
}

void start_dispatch(MoeBatch& b, const comm::Comm* ep) {
    b.dispatch = exchange_start(b.send.view(), b.send_rows, b.recv.view(), b.recv_rows, ep);
}

void run_experts(const MoeWeights& local,
                 ExpertAct act,
                 const ExpertHosting& hosting,
                 MoeBatch& b,
                 const std::function<void()>& poll,
                 std::vector<int64_t>& tokens_per_expert) {
    const Tensor& recv = b.recv.view();
    const int64_t n_recv = recv.dim(0), width = recv.dim(1), k = b.recv_ids.view().dim(1);
    const auto n_exp = static_cast<int64_t>(local.experts.size());
    const int32_t* ids = b.recv_ids.ptr<int32_t>();  // [n_recv, k]
    // Group the (row, slot) assignments by expert, rows ascending within each.
    std::vector<int64_t> count(static_cast<size_t>(n_exp), 0);  // [E]
    for (int64_t a = 0; a < n_recv * k; ++a)
        if (ids[a] >= 0) {
            HYMOE_CHECK(ids[a] < n_exp && hosting.rank_of(ids[a]) == hosting.ep_rank,
                        "expert ",
                        ids[a],
                        " reached ep rank ",
                        hosting.ep_rank);
            ++count[static_cast<size_t>(ids[a])];
        }
    std::vector<int64_t> offset = offsets_of(count);  // [E + 1]
    std::vector<int64_t> cursor(offset.begin(), offset.end() - 1);
    std::vector<int64_t> grouped(static_cast<size_t>(n_recv * k), -1);  // [n_recv, k] row in `in`
    Buffer in(DType::f32, {offset.back(), width});   // [n_assign, w] rows grouped by expert
    Buffer out(DType::f32, {offset.back(), width});  // [n_assign, w] expert outputs, same rows
    const auto row_bytes = static_cast<size_t>(width) * sizeof(float);
    for (int64_t a = 0; a < n_recv * k; ++a)
        if (ids[a] >= 0) {
            const int64_t row = cursor[static_cast<size_t>(ids[a])]++;
            grouped[static_cast<size_t>(a)] = row;
            std::memcpy(
                in.ptr<float>() + row * width, recv.ptr<float>() + a / k * width, row_bytes);
        }
    for (int64_t e = 0; e < n_exp; ++e) {
        const int64_t begin = offset[static_cast<size_t>(e)];
        const int64_t rows = offset[static_cast<size_t>(e) + 1] - begin;
        if (rows == 0)
            continue;
        tokens_per_expert[static_cast<size_t>(e)] += rows;
        const DenseFfnWeights& w = local.experts[static_cast<size_t>(e)];
        HYMOE_CHECK(w.up_proj.view().data != nullptr,
                    "expert ",
                    e,
                    " is not loaded on ep rank ",
                    hosting.ep_rank);
        Tensor out_rows = out.view().rows(begin, rows);
        dense_ffn_forward(w, act, in.view().rows(begin, rows), out_rows);
        poll();
    }
    // Per row: Σ over its hosted slots in slot order, fp32.
    const float* weight = b.recv_weight.ptr<float>();  // [n_recv, k]
    for (int64_t t = 0; t < n_recv; ++t) {
        float* y = b.partial.ptr<float>() + t * width;
        std::fill(y, y + width, 0.0f);
        for (int64_t i = 0; i < k; ++i) {
            const int64_t row = grouped[static_cast<size_t>(t * k + i)];
            if (row < 0)
                continue;
            const float wt = weight[t * k + i];
            const float* o = out.ptr<float>() + row * width;
            for (int64_t j = 0; j < width; ++j)
                y[j] += wt * o[j];
        }
    }
}

void start_combine(MoeBatch& b, const comm::Comm* ep) {
    b.combine = exchange_start(b.partial.view(), b.recv_rows, b.back.view(), b.send_rows, ep);
}

void add_partials(const MoeBatch& b, Tensor& acc /*[n_own, w]*/) {
    const int64_t width = acc.dim(1);
    // back is ordered by source rank (= the destination order the rows were sent in), so
    // walking it forward adds each token's partials in ascending source rank.
    for (size_t row = 0; row < b.token.size(); ++row) {
        const float* p = b.back.ptr<float>() + static_cast<int64_t>(row) * width;
        float* y = acc.ptr<float>() + b.token[row] * width;
        for (int64_t j = 0; j < width; ++j)
            y[j] += p[j];
    }
}

}  // namespace hymoe::model::detail
