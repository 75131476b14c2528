// The GPU MoE layer over an ep group (device_moe_ep.h). Per layer: router logits on the device,
// the routing where the one-rank model routes (the fused route kernel for the layers that run
// fused, else router.h on the host), brought to the host, the host plan of
// every micro-batch (moe_ep_plan.h) with its counts, expert ids and weights exchanged over MPI,
// then on the device: gather the rows to send (compute stream) → all-to-all-v (communication
// stream) → the CPU's grouped expert stage on the local expert ids (moe_grouped.h: permute into
// each hosted expert's rows, grouped GEMMs, slot-ordered fp32 partial per received row; compute
// stream) → all-to-all-v back (communication stream) → the owner's sum in
// ascending source rank (compute stream). Events order the two streams; every buffer lives in
// the layer's Scratch, freed after the compute stream has waited for the last combine.
#include "device_moe_ep.h"

#include <vector>

#include "../router.h"
#include "hymoe/backend/cuda_ops.h"
#include "hymoe/core/error.h"
#include "hymoe/model/decode_graph_plan.h"
#include "hymoe/model/moe_ep_plan.h"

namespace hymoe::model::gpu {

namespace {

// One micro-batch: the host plan and its device buffers.
struct Batch {
    EpSendPlan send;
    std::vector<int64_t> recv_rows;  // [ep] rows from each rank
    std::vector<float> recv_weight;  // [n_recv, k]
    std::vector<int32_t> local_ids;  // [n_recv, k] each slot's hosted expert (local), −1 elsewhere
    std::vector<int64_t> load;       // [E_local] rows each hosted expert ran on
    Tensor sent, received;           // [n_send, w], [n_recv, w] in cd
    Tensor partial, back;            // [n_recv, w], [n_send, w] f32
};

int64_t total(const std::vector<int64_t>& rows) {
    int64_t n = 0;
    for (int64_t r : rows)
        n += r;
    return n;
}

// The counts, then the rows' expert ids and weights over MPI; fills b's expert side.
void exchange_metadata(Batch& b,
                       int64_t k,
                       const std::vector<int>& local_index,
                       int64_t n_local,
                       const comm::Comm& ep) {
    b.recv_rows = comm::exchange_counts(b.send.send_rows, ep);
    const int64_t n_send = b.send.n_send(), n_recv = total(b.recv_rows);
    std::vector<int32_t> ids(b.send.ids), recv_ids(static_cast<size_t>(n_recv * k));
    b.recv_weight.assign(static_cast<size_t>(n_recv * k), 0.0f);
    std::vector<float> weight(b.send.weight);
    Tensor ids_out{ids.data(), DType::i32, Device::cpu, {n_send, k}};
    Tensor ids_in{recv_ids.data(), DType::i32, Device::cpu, {n_recv, k}};
    Tensor w_out{weight.data(), DType::f32, Device::cpu, {n_send, k}};
    Tensor w_in{b.recv_weight.data(), DType::f32, Device::cpu, {n_recv, k}};
    comm::all_to_all_v(ids_out, b.send.send_rows, ids_in, b.recv_rows, ep);
    comm::all_to_all_v(w_out, b.send.send_rows, w_in, b.recv_rows, ep);
    b.local_ids = local_expert_ids(recv_ids, local_index);
    b.load.assign(static_cast<size_t>(n_local), 0);
}

// The hosted experts on b.received into b.partial (compute stream): the CPU's grouped expert stage
// (moe_grouped.h) on the local expert ids, each received row's weighted sum over its hosted slots
// in slot order.
void run_experts(Gpu& g, const ModelConfig& cfg, const MoeW& w, Batch& b) {
    const int64_t n_recv = b.received.dim(0);
    if (n_recv == 0)
        return;
    const detail::RowSlots slots{b.local_ids.data(), b.recv_weight.data(), n_recv, cfg.moe.top_k};
    detail::experts_grouped(
        ctx_of(g), w.experts, cfg.moe.expert_act, slots, b.received, b.partial, [] {}, b.load);
}

// The rows' routing from the device's logits [n, E], brought to the host (one synchronisation):
// on the device where the one-rank model routes there (moe_runs_fused: the fused route kernel,
// dropless), else router.h on the host.
Routing route(Gpu& g,
              Scratch& s,
              const ModelConfig& cfg,
              const LayerSpec& spec,
              const MoeW& w,
              const Tensor& logits,
              DType cd,
              bool fused) {
    const int64_t n = logits.dim(0), n_exp = cfg.moe.n_routed_experts, k = cfg.moe.top_k;
    if (!moe_runs_fused(cfg, spec, cd, fused, n)) {
        Buffer scores(DType::f32, {n, n_exp});
        cu::download(logits, scores.view(), g.stream);
        g.stream.synchronize();
        detail::router_activate(cfg, scores.view());
        return detail::route_scores(cfg, w.host, scores.view());
    }
    Tensor idx = s(DType::i32, {n, k}), weight = s(DType::f32, {n, k});  // [n, k]
    route_on_device(g, cfg, w, logits, idx, weight);
    std::vector<int32_t> ids(static_cast<size_t>(n * k));
    Routing r;
    r.weight.resize(ids.size());
    cu::copy_to_host(ids.data(), idx.data, ids.size() * sizeof(int32_t), g.stream);
    cu::copy_to_host(r.weight.data(), weight.data, r.weight.size() * sizeof(float), g.stream);
    g.stream.synchronize();
    r.idx.assign(ids.begin(), ids.end());
    r.kept.assign(ids.size(), 1);
    r.tokens_per_expert.assign(static_cast<size_t>(n_exp), 0);
    for (int32_t e : ids)
        ++r.tokens_per_expert[static_cast<size_t>(e)];
    return r;
}

}  // namespace

MoeEp::MoeEp(const comm::Comm& ep, bool overlap, bool fused)
    : ep_(ep), overlap_(overlap), fused_(fused) {}

void MoeEp::forward(Gpu& g,
                    const ModelConfig& cfg,
                    const LayerSpec& spec,
                    const MoeW& w,
                    const Tensor& x,
                    DType cd,
                    Tensor& y,
                    MoeCommStats& stats) {
    const MoeConfig& m = cfg.moe;
    const int64_t n = x.dim(0), n_exp = m.n_routed_experts, k = m.top_k;
    const bool latent = spec.ffn == Ffn::latent_moe;
    const int64_t width = latent ? m.latent_size : cfg.hidden_size;
    const int ep = ep_.size();
    const std::vector<int> local_index =
        local_expert_index(w.host.expert_rank, n_exp, ep, ep_.rank());
    const int64_t n_local = w.up.dim(0);
    const cu::Stream& st = g.stream;
    Scratch s(g.arena);

    // the routing, on the host from the device's logits
    Routing r;
    Tensor z, xc;  // [n, w] the experts' input in cd; [n, d] x in cd
    if (n > 0) {
        Tensor logits = s(DType::f32, {n, n_exp});  // [n, E]
        g.blas.linear(x, w.router, logits);
        xc = in_dtype(g, s, x, cd);
        z = xc;
        if (latent) {
            z = s(cd, {n, width});
            g.blas.linear(xc, w.fc1, z);
        }
        r = route(g, s, cfg, spec, w, logits, cd, fused_);
    }

    // the host plan of every micro-batch, the same count of them on every rank
    const std::vector<RowRange> ranges = moe_micro_batches(n, overlap_);
    std::vector<Batch> batches(ranges.size());
    for (size_t i = 0; i < ranges.size(); ++i) {
        Batch& b = batches[i];
        b.send = plan_ep_send(r, k, w.host.expert_rank, n_exp, ep, ranges[i]);
        exchange_metadata(b, k, local_index, n_local, ep_);
        const int64_t n_send = b.send.n_send(), n_recv = total(b.recv_rows);
        b.sent = s(cd, {n_send, width});
        b.received = s(cd, {n_recv, width});
        b.partial = s(DType::f32, {n_recv, width});
        b.back = s(DType::f32, {n_send, width});
        if (n_send > 0)
            cu::gather_rows(st, z, upload_values(g, s, b.send.token, DType::i64), b.sent);
        stats.dispatch_rows += n_send;
        stats.dispatch_bytes += static_cast<int64_t>(b.sent.bytes());
        stats.combine_bytes += static_cast<int64_t>(b.back.bytes());
        stats.self_rows += b.send.send_rows[static_cast<size_t>(ep_.rank())];
    }

    // dispatch every micro-batch; per micro-batch: experts, combine; then the owner's sums
    sent_ready_.record(st);
    cu::wait_for(comm_, sent_ready_);
    for (size_t i = 0; i < batches.size(); ++i) {
        Batch& b = batches[i];
        comm::all_to_all_v_queued(
            b.sent, b.send.send_rows, b.received, b.recv_rows, ep_, comm_.get());
        dispatched_[i].record(comm_);
    }
    for (size_t i = 0; i < batches.size(); ++i) {
        Batch& b = batches[i];
        cu::wait_for(st, dispatched_[i]);
        run_experts(g, cfg, w, b);
        computed_[i].record(st);
        cu::wait_for(comm_, computed_[i]);
        comm::all_to_all_v_queued(
            b.partial, b.recv_rows, b.back, b.send.send_rows, ep_, comm_.get());
        combined_[i].record(comm_);
    }
    Tensor y_lat;  // [n, ℓ] (latent)
    Tensor& acc = latent ? (y_lat = s(DType::f32, {n, width})) : y;
    for (size_t i = 0; i < batches.size(); ++i) {
        const Batch& b = batches[i];
        cu::wait_for(st, combined_[i]);
        const RowRange rows = b.send.tokens;
        if (rows.count == 0)
            continue;
        // acc rows [begin, begin + count) = Σ over ranks ascending of the returned partials
        const Tensor back_row = upload_values(g, s, b.send.back_row, DType::i64);
        const Tensor ones =
            upload_values(g, s, std::vector<float>(b.send.back_row.size(), 1.0f), DType::f32);
        Tensor part{at(acc, rows.begin * width), DType::f32, Device::cuda, {rows.count, width}};
        cu::moe_unpermute(st, b.back, back_row, ones, ep, part);
    }
    if (n > 0) {
        if (latent)
            g.blas.linear(in_dtype(g, s, y_lat, cd), w.fc2, y);
        if (m.n_shared_experts > 0) {                             // y += Shared(x)
            Tensor shared = s(DType::f32, {n, cfg.hidden_size});  // [n, d]
            dense_ffn_forward(ctx_of(g), w.shared, m.expert_act, xc, shared);
            cu::add_inplace(st, y, shared);
        }
    }

    MoeCommStats one;  // the load of this rank's experts
    one.calls = 1;
    one.tokens_per_expert.assign(static_cast<size_t>(n_exp), 0);
    for (int64_t e = 0; e < n_exp; ++e)
        if (local_index[static_cast<size_t>(e)] >= 0)
            for (const Batch& b : batches)
                one.tokens_per_expert[static_cast<size_t>(e)] +=
                    b.load[static_cast<size_t>(local_index[e])];
    stats.add(one);
}

}  // namespace hymoe::model::gpu
