// The CPU forms of the batched KDA ops (hymoe/backend/kda_batch.h): a loop over the table's
// sequences calling the one-sequence kernels in order, the conv of every sequence before the SiLU
// of all rows, exactly as model/kda.cpp ran them one sequence at a time.
#include "hymoe/backend/kda_batch.h"

#include "hymoe/backend/ops.h"
#include "hymoe/core/error.h"

namespace hymoe::ops {

void kda_conv_silu(const KdaSeqTable& t, const Tensor& u, const Tensor& w, int plane, Tensor& out) {
    const int64_t D = u.dim(-1), W = w.dim(-1);
    HYMOE_CHECK(plane >= 0 && plane < 3 && t.tail[plane] != nullptr && t.offsets != nullptr &&
                    u.numel() == t.n_tok * D && out.numel() == u.numel() && w.numel() == D * W,
                "kda_conv_silu: plane ",
                plane,
                ", u ",
                shape_string(u.shape),
                " w ",
                shape_string(w.shape),
                " out ",
                shape_string(out.shape),
                " for ",
                t.n_tok,
                " rows");
    const Tensor w2{w.data, w.dtype, w.device, {D, W}};
    for (int64_t s = 0; s < t.n_seq; ++s) {
        const int64_t r = t.offsets[s], n = t.offsets[s + 1] - r;
        if (n == 0)
            continue;
        Tensor us = u.rows(r, n);
        Tensor ys = out.rows(r, n);
        Tensor tail{t.tail[plane][s], DType::f32, Device::cpu, {W - 1, D}};
        causal_conv(us, w2, tail, ys);
    }
    silu_inplace(out);
}

void kda_scan_batch(const KdaSeqTable& t, const KdaBatchScan& p) {
    HYMOE_CHECK(t.n_seq == 0 || (t.offsets != nullptr && t.state != nullptr),
                "kda_scan_batch: a table of ",
                t.n_seq,
                " sequences without offsets or states");
    const int64_t D = static_cast<int64_t>(p.n_head) * p.d_k;
    const int64_t DV = static_cast<int64_t>(p.n_head) * p.d_v;
    for (int64_t s = 0; s < t.n_seq; ++s) {
        const int64_t r = t.offsets[s];
        KdaScanParams one;
        one.n_tok = t.offsets[s + 1] - r;
        one.n_head = p.n_head;
        one.d_k = p.d_k;
        one.d_v = p.d_v;
        one.q = p.q + r * D;
        one.k = p.k + r * D;
        one.v = p.v + r * DV;
        one.g = p.g + r * D;
        one.beta = p.beta + r * p.n_head;
        one.S = t.state[s];
        one.o = p.o + r * DV;
        if (one.n_tok >= p.chunk_from)
            kda_chunked(one);
        else
            kda_recurrent(one);
    }
}

}  // namespace hymoe::ops
