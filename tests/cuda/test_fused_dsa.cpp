// The fused DSA kernels (hymoe/backend/cuda_fused.h) against the CPU ops. Indexer top-k:
// ops::indexer_scores then ops::top_k over each query's visible keys, (a) a prefill block of 40
// queries of one sequence at positions 2000.. (two queries a block, contiguous f32 keys), (b) six
// decode queries of different sequences with 1 to 5000 visible keys over shuffled bf16 pages,
// each under three plans: the device's, one split with the candidate buffer compacted many times
// (n_sm = 1), and many splits merged (n_sm = 1024). Inputs are bf16 values, so q·k products are
// exact and scores differ from the CPU's in summation order only: the kept keys must equal the
// CPU's, except keys whose scores lie within 1e-5 (relative) of the k-th score. Sparse MLA: the
// absorbed attention over each query's selected keys (−1 entries, keys past `visible`, a query
// with none) against ops::attention_core on the gathered rows, for 16 heads (one 16-row block)
// and 40 heads (two tiles of 32), f32 and bf16 pages; bf16 operands and probabilities hold it
// to the bf16 tolerance.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <numeric>
#include <set>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "cuda_test.h"
#include "hymoe/backend/cuda_fused.h"
#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_attention.h"
#include "hymoe/model/attention.h"

namespace utf = boost::unit_test;
using namespace hymoe;
using namespace hymoe::cuda_test;

namespace {

// Rows of several sequences scattered over the pages of a pool, with other data between rows
// and pages (wider rows, padding after each page).
struct Pool {
    int page_tokens = 16, max_pages = 0;
    int64_t row_stride = 0, page_stride = 0;
    Buffer pages;                // [n_pages, page_stride] fp32 values (bf16-representable)
    std::vector<int32_t> table;  // [n_seq, max_pages]
};

// rows[b] [n_b, width] → a pool; the page order is a fixed shuffle.
Pool make_pool(const std::vector<Buffer>& rows, int width) {
    Pool p;
    p.row_stride = width + 8;
    p.page_stride = p.row_stride * p.page_tokens + 24;
    int n_pages = 0;
    for (const Buffer& r : rows) {
        const int need = static_cast<int>((r.view().dim(0) + p.page_tokens - 1) / p.page_tokens);
        p.max_pages = std::max(p.max_pages, need);
        n_pages += need;
    }
    p.max_pages = std::max(p.max_pages, 1);
    p.pages = random({std::max(n_pages, 1), p.page_stride}, 400, DType::bf16);
    p.table.assign(rows.size() * static_cast<size_t>(p.max_pages), -1);
    int next = 0;
    for (size_t b = 0; b < rows.size(); ++b) {
        const int64_t n = rows[b].view().dim(0);
        for (int64_t u = 0; u < n; ++u) {
            const int slot = static_cast<int>(u / p.page_tokens);
            int32_t& page =
                p.table[b * static_cast<size_t>(p.max_pages) + static_cast<size_t>(slot)];
            if (page < 0)
                page = static_cast<int32_t>((next++ * 7 + 3) % n_pages);  // coprime stride
            std::copy_n(
                rows[b].ptr<float>() + u * width,
                width,
                p.pages.ptr<float>() + page * p.page_stride + (u % p.page_tokens) * p.row_stride);
        }
    }
    return p;
}

cu::PagedRows paged(const Pool& pool, const Tensor& dev_pages, const Tensor& dev_table) {
    cu::PagedRows r;
    r.rows = dev_pages.data;
    r.dtype = dev_pages.dtype;
    r.row_stride = pool.row_stride;
    r.page_stride = pool.page_stride;
    r.page_tokens = pool.page_tokens;
    r.block_table = dev_table.ptr<int32_t>();
    r.max_pages = pool.max_pages;
    return r;
}

int sm_count() {
    int n = 0;
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, 0);
    return n;
}

// The GPU's kept keys of one query against ops::top_k on the CPU's scores: equal, except keys
// (either side) whose score is within 1e-5 of the k-th score.
void expect_same_top_k(const float* scores,
                       int64_t visible,
                       int64_t top_k,
                       const int32_t* got,
                       const char* what,
                       int64_t row) {
    const int64_t k = std::min(top_k, visible);
    std::vector<int64_t> want(static_cast<size_t>(k));
    ops::top_k(scores, visible, k, want.data());
    float scale = 0.0f;
    for (int64_t u = 0; u < visible; ++u)
        scale = std::max(scale, std::abs(scores[u]));
    const float bar = k > 0 ? scores[want.back()] : 0.0f, slack = 1e-5f * std::max(scale, 1e-30f);
    std::set<int64_t> a(want.begin(), want.end()), b;
    for (int64_t i = 0; i < top_k; ++i) {
        BOOST_TEST_INFO(what << " row " << row << " slot " << i);
        if (i < k) {
            BOOST_TEST((got[i] >= 0 && got[i] < visible));
            b.insert(got[i]);
        } else {
            BOOST_TEST(got[i] == -1);
        }
    }
    BOOST_TEST_INFO(what << " row " << row << ": distinct keys");
    BOOST_TEST(static_cast<int64_t>(b.size()) == k);
    std::vector<int64_t> diff;
    std::set_symmetric_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(diff));
    for (int64_t u : diff) {
        BOOST_TEST_INFO(what << " row " << row << ": key " << u << " score " << scores[u]
                             << " vs k-th " << bar);
        BOOST_TEST(std::abs(scores[u] - bar) <= slack);
    }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_fused_dsa, *utf::label("cuda"))

BOOST_AUTO_TEST_CASE(indexer_top_k_prefill_block_of_one_sequence, *utf::precondition(need_gpu)) {
    Gpu g;
    const int n_q = 40, H = 8, d = 64, top = 512;
    const int64_t pos_first = 2000, n_k = pos_first + n_q;
    Buffer q = random({n_q, H * d}, 410, DType::bf16);
    Buffer w = random({n_q, H}, 411, DType::f32, 0.1f);
    Buffer k = random({n_k, d}, 412, DType::bf16);
    Buffer scores(DType::f32, {n_q, n_k});
    ops::indexer_scores(q.view(), w.view(), k.view(), scores.view());
    std::vector<int32_t> visible(n_q);
    for (int i = 0; i < n_q; ++i)
        visible[static_cast<size_t>(i)] = static_cast<int32_t>(pos_first + i + 1);
    Tensor dq = to_device(q.view(), DType::f32, g.arena, g.s);
    Tensor dw = to_device(w.view(), DType::f32, g.arena, g.s);
    Tensor dk = to_device(k.view(), DType::f32, g.arena, g.s);
    Tensor dvis = to_device_i32(visible, g.arena, g.s);
    for (int n_sm : {sm_count(), 1, 1024}) {
        const cu::IndexerPlan plan =
            cu::indexer_topk_plan(n_q, static_cast<int>(n_k), H, d, top, true, n_sm);
        BOOST_TEST_REQUIRE(plan.supported);
        BOOST_TEST(plan.queries_per_block == 2);
        cu::IndexerTopkParams p;
        p.n_q = n_q;
        p.n_head = H;
        p.d = d;
        p.top_k = top;
        p.q_dtype = DType::f32;
        p.q = dq.data;
        p.w = dw.ptr<float>();
        p.visible = dvis.ptr<int32_t>();
        p.keys.rows = dk.data;
        p.keys.dtype = DType::f32;
        p.keys.row_stride = d;
        Tensor didx = g.arena.tensor(DType::i32, {n_q, top});
        void* scratch = plan.scratch_bytes > 0 ? g.arena.allocate(plan.scratch_bytes) : nullptr;
        p.idx = didx.ptr<int32_t>();
        p.scratch = scratch;
        cu::indexer_topk(g.s, p, plan);
        const std::vector<int32_t> got = to_host_i32(didx, g.s);
        for (int i = 0; i < n_q; ++i)
            expect_same_top_k(scores.ptr<float>() + int64_t{i} * n_k,
                              visible[static_cast<size_t>(i)],
                              top,
                              got.data() + int64_t{i} * top,
                              n_sm == 1      ? "one split"
                              : n_sm == 1024 ? "many splits"
                                             : "device plan",
                              i);
        g.arena.free(didx.data);
        if (scratch)
            g.arena.free(scratch);
    }
}

BOOST_AUTO_TEST_CASE(indexer_top_k_decode_over_paged_keys, *utf::precondition(need_gpu)) {
    Gpu g;
    const int H = 16, d = 128, top = 2048;
    const std::vector<int32_t> visible = {3000, 100, 1, 5000, 2048, 2049};
    const int B = static_cast<int>(visible.size());
    std::vector<Buffer> keys;
    for (int b = 0; b < B; ++b)
        keys.push_back(random({visible[static_cast<size_t>(b)], d}, 420 + b, DType::bf16));
    const Pool pool = make_pool(keys, d);
    Buffer q = random({B, H * d}, 430, DType::bf16);
    Buffer w = random({B, H}, 431, DType::f32, 0.1f);
    Tensor dq = to_device(q.view(), DType::bf16, g.arena, g.s);
    Tensor dw = to_device(w.view(), DType::f32, g.arena, g.s);
    Tensor dpages = to_device(pool.pages.view(), DType::bf16, g.arena, g.s);
    Tensor dtable = to_device_i32(pool.table, g.arena, g.s);
    Tensor dvis = to_device_i32(visible, g.arena, g.s);
    std::vector<int32_t> seq(B);
    std::iota(seq.begin(), seq.end(), 0);
    Tensor dseq = to_device_i32(seq, g.arena, g.s);
    for (int n_sm : {sm_count(), 1, 1024}) {
        const cu::IndexerPlan plan = cu::indexer_topk_plan(B, 5000, H, d, top, false, n_sm);
        BOOST_TEST_REQUIRE(plan.supported);
        BOOST_TEST(plan.queries_per_block == 1);
        cu::IndexerTopkParams p;
        p.n_q = B;
        p.n_head = H;
        p.d = d;
        p.top_k = top;
        p.q_dtype = DType::bf16;
        p.q = dq.data;
        p.w = dw.ptr<float>();
        p.visible = dvis.ptr<int32_t>();
        p.seq = dseq.ptr<int32_t>();
        p.keys = paged(pool, dpages, dtable);
        Tensor didx = g.arena.tensor(DType::i32, {B, top});
        void* scratch = plan.scratch_bytes > 0 ? g.arena.allocate(plan.scratch_bytes) : nullptr;
        p.idx = didx.ptr<int32_t>();
        p.scratch = scratch;
        cu::indexer_topk(g.s, p, plan);
        const std::vector<int32_t> got = to_host_i32(didx, g.s);
        for (int b = 0; b < B; ++b) {
            const int64_t n = visible[static_cast<size_t>(b)];
            Buffer s(DType::f32, {1, n});
            ops::indexer_scores(q.view().rows(b, 1), w.view().rows(b, 1), keys[b].view(), s.view());
            expect_same_top_k(s.ptr<float>(),
                              n,
                              top,
                              got.data() + int64_t{b} * top,
                              n_sm == 1      ? "one split"
                              : n_sm == 1024 ? "many splits"
                                             : "device plan",
                              b);
        }
        g.arena.free(didx.data);
        if (scratch)
            g.arena.free(scratch);
    }
}

BOOST_AUTO_TEST_CASE(sparse_mla_matches_attention_core, *utf::precondition(need_gpu)) {
    Gpu g;
    const int d_r = 64, n_sel = 150;
    const float tau = 0.07f;
    const std::vector<int32_t> n_keys = {300, 90, 1000};
    const int B = static_cast<int>(n_keys.size());
    for (auto [H, r_kv] : {std::array<int, 2>{16, 512}, {40, 256}})
        for (DType t : {DType::f32, DType::bf16}) {
            const int d_lat = r_kv + d_r;
            std::vector<Buffer> lat;
            for (int b = 0; b < B; ++b)
                lat.push_back(
                    random({n_keys[static_cast<size_t>(b)], d_lat}, 440 + b, DType::bf16));
            const Pool pool = make_pool(lat, d_lat);
            Buffer q = random({B, H, d_lat}, 450, DType::bf16, 0.5f);
            // query b sees its first visible[b] keys; its list has −1 padding, keys past visible,
            // and query 1 has none at all
            const std::vector<int32_t> visible = {280, 90, 1000};
            std::vector<int32_t> sel(static_cast<size_t>(B * n_sel), -1);
            Philox rng(7, 451, 0);
            for (int b = 0; b < B; ++b) {
                if (b == 1)
                    continue;
                std::vector<int32_t> keys(static_cast<size_t>(n_keys[static_cast<size_t>(b)]));
                std::iota(keys.begin(), keys.end(), 0);
                for (size_t i = keys.size() - 1; i > 0; --i)
                    std::swap(keys[i],
                              keys[static_cast<size_t>(rng.uniform() * static_cast<float>(i + 1)) %
                                   (i + 1)]);
                for (int j = 0; j < n_sel - 7; ++j)
                    sel[static_cast<size_t>(b * n_sel + j)] = keys[static_cast<size_t>(j)];
            }
            Buffer want(DType::f32, {B, H, r_kv});
            for (int b = 0; b < B; ++b) {
                std::vector<int32_t> kept;
                for (int j = 0; j < n_sel; ++j) {
                    const int32_t u = sel[static_cast<size_t>(b * n_sel + j)];
                    if (u >= 0 && u < visible[static_cast<size_t>(b)])
                        kept.push_back(u);
                }
                const auto n = static_cast<int64_t>(kept.size());
                if (n == 0)
                    continue;  // ō = 0
                Buffer rows(DType::f32, {n, d_lat}), c_kv(DType::f32, {n, r_kv});
                Buffer mask(DType::f32, {H, n});
                for (int64_t j = 0; j < n; ++j) {
                    const float* src = lat[static_cast<size_t>(b)].ptr<float>() +
                                       kept[static_cast<size_t>(j)] * int64_t{d_lat};
                    std::copy_n(src, d_lat, rows.ptr<float>() + j * d_lat);
                    std::copy_n(src, r_kv, c_kv.ptr<float>() + j * r_kv);
                }
                Tensor q_b = q.view().rows(b, 1);
                q_b.shape = {H, d_lat};
                Tensor o_b = want.view().rows(b, 1);
                o_b.shape = {H, r_kv};
                ops::attention_core(q_b, rows.view(), c_kv.view(), mask.view(), tau, o_b);
            }
            Tensor dq = to_device(q.view(), DType::f32, g.arena, g.s);
            Tensor dpages = to_device(pool.pages.view(), t, g.arena, g.s);
            Tensor dtable = to_device_i32(pool.table, g.arena, g.s);
            Tensor dvis = to_device_i32(visible, g.arena, g.s);
            Tensor dsel = to_device_i32(sel, g.arena, g.s);
            std::vector<int32_t> seq(B);
            std::iota(seq.begin(), seq.end(), 0);
            Tensor dseq = to_device_i32(seq, g.arena, g.s);
            Tensor dout = g.arena.tensor(DType::f32, {B, H, r_kv});
            const cu::MlaSparsePlan plan = cu::mla_sparse_plan(H, r_kv, d_r);
            BOOST_TEST_REQUIRE(plan.supported);
            cu::MlaSparseParams p;
            p.n_q = B;
            p.n_head = H;
            p.r_kv = r_kv;
            p.d_r = d_r;
            p.tau = tau;
            p.q_hat = dq.ptr<float>();
            p.cache = paged(pool, dpages, dtable);
            p.seq = dseq.ptr<int32_t>();
            p.visible = dvis.ptr<int32_t>();
            p.selected = dsel.ptr<int32_t>();
            p.n_selected = n_sel;
            p.o_bar = dout.ptr<float>();
            cu::mla_sparse(g.s, p, plan);
            Buffer got = to_host(dout, g.s);
            const double err =
                rel_error(got.ptr<float>(), want.ptr<float>(), int64_t{B} * H * r_kv);
            double zero = 0;  // query 1 selected nothing
            for (int64_t i = 0; i < int64_t{H} * r_kv; ++i)
                zero = std::max(
                    zero, std::abs(static_cast<double>(got.ptr<float>()[int64_t{H} * r_kv + i])));
            BOOST_TEST_INFO("H " << H << " r_kv " << r_kv << " pages " << to_string(t)
                                 << ": normalised error " << err << ", empty query max " << zero);
            BOOST_TEST(err < tolerance(DType::bf16));
            BOOST_TEST(zero == 0.0);
            for (Tensor* x : {&dq, &dpages, &dtable, &dvis, &dsel, &dseq, &dout})
                g.arena.free(x->data);
        }
}

BOOST_AUTO_TEST_SUITE_END()
