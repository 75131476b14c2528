// The pipeline of the expert-parallel MoE layer (moe_dispatch.h): dispatch layout, count and
// metadata exchange, payload all-to-all, the expert stage, reverse all-to-all and the owner stage,
// for one or two micro-batches. Row order is fixed on both sides (owner: destination, then
// token; expert: source, then token), so each token's arithmetic never depends on message
// arrival. The rows move by ops on the pipeline's Ctx (backend/ops_rows.h, ops_moe.h); the plan
// and the metadata are host vectors.
#include "moe_dispatch.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "hymoe/backend/ops_attention.h"
#include "hymoe/backend/ops_moe.h"
#include "hymoe/backend/ops_rows.h"
#include "hymoe/core/timer.h"
#include "moe_grouped.h"

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

// comm::all_to_all_v of host metadata, or a copy in a group of one.
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

// Owner side: the rows of owned tokens [b.first, b.first + b.n_tok) of payload [n_own, w_in]
// under routing r (of the owned rows): each token once per distinct ep rank hosting a kept expert,
// gathered on ctx's device into b.send (in scratch).
void plan_batch(const backend::Ctx& ctx,
                backend::Scratch& scratch,
                const Routing& r,
                int64_t top_k,
                const ExpertHosting& hosting,
                const Tensor& payload /*[n_own, w]*/,
                const int* row_adapter /*[n_own] or null*/,
                MoeBatch& b) {
    const int64_t k = top_k, width = payload.dim(1), end = b.first + b.n_tok, ep = hosting.ep;
    // Pass 1: rows per destination (a token once per distinct rank among its kept experts).
    b.send_rows.assign(static_cast<size_t>(ep), 0);
    std::vector<int64_t> seen(static_cast<size_t>(ep), -1);  // [ep] last token counted
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
    b.send_ids = Buffer(DType::i32, {n_send, k});
    b.send_weight = Buffer(DType::f32, {n_send, k});
    b.send_adapter = Buffer(DType::i32, {n_send, 1});
    b.token.assign(static_cast<size_t>(n_send), -1);
    b.back_row.assign(static_cast<size_t>(b.n_tok * ep), -1);
    std::fill(b.send_ids.ptr<int32_t>(), b.send_ids.ptr<int32_t>() + n_send * k, -1);

    // Pass 2: tokens ascending, so each destination's rows come in token order.
    std::vector<int64_t> cursor = offsets_of(b.send_rows);  // [ep + 1]
    for (int64_t t = b.first; t < end; ++t) {
        int64_t* row_of = b.back_row.data() + (t - b.first) * ep;  // [ep] this token's rows
        for (int64_t i = 0; i < k; ++i) {
            const auto a = static_cast<size_t>(t * k + i);
            if (!r.kept[a])
                continue;
            const auto dest = static_cast<size_t>(hosting.rank_of(r.idx[a]));
            int64_t row = row_of[dest];
            if (row < 0) {
                row = row_of[dest] = cursor[dest]++;
                b.token[static_cast<size_t>(row)] = t;
                b.send_adapter.ptr<int32_t>()[row] = row_adapter ? row_adapter[t] : 0;
            }
            b.send_ids.ptr<int32_t>()[row * k + i] = static_cast<int32_t>(r.idx[a]);
            b.send_weight.ptr<float>()[row * k + i] = r.weight[a];
        }
    }
    b.send.t = scratch(payload.dtype, {n_send, width});
    if (n_send > 0)
        ops::gather_rows(ctx, payload, copied(ctx, scratch, b.token, DType::i64), b.send.t);
}

// Counts (comm::exchange_counts) and metadata (two all_to_all_v: the expert ids with the row's
// adapter as one more column, and the weights), blocking; allocates every expert-side buffer and
// `back` (in scratch), returned rows out_width wide (a group of one: not recv and back, which
// are the payload and the partials themselves). Collective over ep.
void exchange_metadata(backend::Scratch& scratch,
                       MoeBatch& b,
                       int64_t out_width,
                       const comm::Comm* ep) {
    b.recv_rows = ep ? comm::exchange_counts(b.send_rows, *ep) : b.send_rows;
    const int64_t n_recv = total(b.recv_rows), n_send = b.send.view().dim(0);
    const int64_t width = b.send.view().dim(1), k = b.send_ids.view().dim(1);
    b.recv.t = ep ? scratch(b.send.t.dtype, {n_recv, width}) : b.send.t;
    b.recv_ids = Buffer(DType::i32, {n_recv, k});
    b.recv_weight = Buffer(DType::f32, {n_recv, k});
    b.recv_adapter = Buffer(DType::i32, {n_recv, 1});
    b.partial.t = scratch(DType::f32, {n_recv, out_width});
    b.back.t = ep ? scratch(DType::f32, {n_send, out_width}) : b.partial.t;
    Buffer send_meta(DType::i32, {n_send, k + 1}), recv_meta(DType::i32, {n_recv, k + 1});
    for (int64_t row = 0; row < n_send; ++row) {
        int32_t* to = send_meta.ptr<int32_t>() + row * (k + 1);
        std::copy_n(b.send_ids.ptr<int32_t>() + row * k, k, to);
        to[k] = b.send_adapter.ptr<int32_t>()[row];
    }
    exchange(send_meta.view(), b.send_rows, recv_meta.view(), b.recv_rows, ep);
    for (int64_t row = 0; row < n_recv; ++row) {
        const int32_t* from = recv_meta.ptr<int32_t>() + row * (k + 1);
        std::copy_n(from, k, b.recv_ids.ptr<int32_t>() + row * k);
        b.recv_adapter.ptr<int32_t>()[row] = from[k];
    }
    exchange(b.send_weight.view(), b.send_rows, b.recv_weight.view(), b.recv_rows, ep);
}

// The payload to the experts, once ctx has gathered it; non-blocking on the host (device
// tensors: NCCL, completed on return), completes in b.dispatch. Collective over ep. In a group of
// one recv is the payload already.
void start_dispatch(const backend::Ctx& ctx, MoeBatch& b, const comm::Comm* ep) {
    if (ep == nullptr)
        return;
    ops::synchronize(ctx);
    b.dispatch =
        comm::all_to_all_v_start(b.send.view(), b.send_rows, b.recv.view(), b.recv_rows, *ep);
}

// The partials back to their owners, once ctx has computed them; non-blocking as start_dispatch,
// completes in b.combine. Collective over ep. In a group of one back is the partials already.
void start_combine(const backend::Ctx& ctx, MoeBatch& b, const comm::Comm* ep) {
    if (ep == nullptr)
        return;
    ops::synchronize(ctx);
    b.combine =
        comm::all_to_all_v_start(b.partial.view(), b.recv_rows, b.back.view(), b.send_rows, *ep);
}

}  // namespace

ExpertHosting hosting_of(const MoeWeights& local, int64_t n_exp, const comm::Comm* ep) {
    return hosting_of(local.expert_rank, n_exp, ep);
}

ExpertHosting hosting_of(const std::vector<int>& placement, int64_t n_exp, const comm::Comm* ep) {
    ExpertHosting h;
    h.ep = ep ? ep->size() : 1;
    h.ep_rank = ep ? ep->rank() : 0;
    h.n_exp = n_exp;
    h.placement = &placement;
    return h;
}

void run_pipeline(const ExpertHosting& hosting,
                  const Routing& r,
                  int64_t top_k,
                  const Tensor& payload,
                  int64_t out_width,
                  const MoeParallel& par,
                  MoeCommStats& s,
                  const ExpertStage& experts,
                  const OwnerStage& owner,
                  const int* row_adapter,
                  const backend::Ctx& ctx) {
    const comm::Comm* ep = par.ep;
    const int64_t n_own = payload.dim(0);
    const int64_t n_batch = par.overlap ? 2 : 1;
    backend::Scratch scratch(ctx);                                // the batches' device rows
    std::vector<MoeBatch> batches(static_cast<size_t>(n_batch));  // never resized
    {
        ScopedTimer timer(s.dispatch_seconds);
        for (int64_t i = 0; i < n_batch; ++i) {
            MoeBatch& b = batches[static_cast<size_t>(i)];
            b.first = i * ((n_own + 1) / 2);
            b.n_tok = n_batch == 1 ? n_own : std::min((n_own + 1) / 2, n_own - b.first);
            plan_batch(ctx, scratch, r, top_k, hosting, payload, row_adapter, b);
            exchange_metadata(scratch, b, out_width, ep);
            s.dispatch_rows += b.send.view().dim(0);
            s.dispatch_bytes += static_cast<int64_t>(b.send.view().bytes());
            s.combine_bytes +=
                b.send.view().dim(0) * out_width * static_cast<int64_t>(sizeof(float));
            s.self_rows += b.send_rows[static_cast<size_t>(hosting.ep_rank)];
        }
        for (MoeBatch& b : batches)
            start_dispatch(ctx, b, ep);
    }
    auto poll = [&batches] {
        for (MoeBatch& b : batches) {
            b.dispatch.test();
            b.combine.test();
        }
    };
    for (MoeBatch& b : batches) {
        {
            ScopedTimer timer(s.dispatch_seconds);
            b.dispatch.wait();
        }
        {
            ScopedTimer timer(s.compute_seconds);
            experts(b, poll);
        }
        ScopedTimer timer(s.combine_seconds);
        start_combine(ctx, b, ep);
    }
    ScopedTimer timer(s.combine_seconds);
    for (MoeBatch& b : batches) {
        b.combine.wait();
        owner(b);
    }
}

const int* received_adapters(const MoeBatch& b) {
    const int32_t* a = b.recv_adapter.ptr<int32_t>();
    const int64_t n = b.recv_adapter.view().dim(0);
    return std::any_of(a, a + n, [](int32_t id) { return id != 0; }) ? a : nullptr;
}

void sum_partials(const backend::Ctx& ctx, const MoeBatch& b, Tensor& acc /*[n_own, w]*/) {
    sum_partials(ctx, b, b.back.view(), acc);
}

void sum_partials(const backend::Ctx& ctx,
                  const MoeBatch& b,
                  const Tensor& back /*[n_send, w]*/,
                  Tensor& acc /*[n_own, w]*/) {
    if (b.n_tok == 0)
        return;
    backend::Scratch scratch(ctx);
    const auto n = static_cast<int64_t>(b.back_row.size());  // n_tok · ep
    const Tensor row = copied(ctx, scratch, b.back_row, DType::i64);
    const Tensor ones =
        copied(ctx, scratch, std::vector<float>(static_cast<size_t>(n), 1.0f), DType::f32);
    Tensor part = acc.rows(b.first, b.n_tok);  // [n_tok, w]
    ops::moe_combine(ctx, back, row, ones, n / b.n_tok, part);
}

}  // namespace hymoe::model::detail
