// MLA absorbed decode over pages on the GPU against a double-precision loop over the same
// cache: three sequences of 1, 37 and 100 tokens scattered over shuffled pages of a pool whose
// rows and pages carry other data between them (wider rows, other layers), first over every
// key, then over DSA key lists with −1 padding and an out-of-range entry.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "cuda_test.h"
#include "hymoe/backend/cuda_ops.h"

namespace utf = boost::unit_test;
using namespace hymoe;
using namespace hymoe::cuda_test;

BOOST_AUTO_TEST_SUITE(cuda_mla_decode, *utf::label("cuda"))

BOOST_AUTO_TEST_CASE(paged_absorbed_decode_matches_a_loop, *utf::precondition(need_gpu)) {
    Gpu g;
    const int B = 3, H = 4, r_kv = 64, d_r = 16, pt = 16, n_pages = 20, max_pages = 8;
    const int64_t row_stride = r_kv + d_r + 8, page_stride = row_stride * pt + 40;
    const int d_lat = r_kv + d_r;
    const float tau = 0.125f;
    const std::vector<int32_t> n_keys = {1, 37, 100};
    Buffer pool = random({n_pages, page_stride}, 100, DType::f32);
    Buffer q = random({B, H, d_lat}, 101, DType::f32);
    std::vector<int32_t> table(static_cast<size_t>(B * max_pages), -1), perm(n_pages);
    for (int i = 0; i < n_pages; ++i)
        perm[static_cast<size_t>(i)] = (i * 7 + 3) % n_pages;  // pages out of order
    int next = 0;
    for (int b = 0; b < B; ++b)
        for (int i = 0; i < (n_keys[static_cast<size_t>(b)] + pt - 1) / pt; ++i)
            table[static_cast<size_t>(b * max_pages + i)] = perm[static_cast<size_t>(next++)];
    const int n_sel = 32;
    std::vector<int32_t> sel(static_cast<size_t>(B * n_sel), -1);
    for (int b = 0; b < B; ++b)
        for (int j = 0; j < std::min(n_sel - 2, n_keys[static_cast<size_t>(b)]); ++j)
            sel[static_cast<size_t>(b * n_sel + j)] = (j * 13) % n_keys[static_cast<size_t>(b)];
    sel[static_cast<size_t>(1 * n_sel + n_sel - 1)] = 1000;  // beyond the sequence: masked
    for (int b = 0; b < B; ++b) {                            // distinct keys, as a top-k gives
        auto first = sel.begin() + b * n_sel, last = first + n_sel;
        std::sort(first, last);
        std::fill(std::unique(first, last), last, -1);
    }

    auto device_i32 = [&](const std::vector<int32_t>& v) {
        Tensor t = g.arena.tensor(DType::i32, {static_cast<int64_t>(v.size())});
        cu::copy_to_device(t.data, v.data(), v.size() * sizeof(int32_t), g.s);
        return t;
    };
    Tensor dpool = to_device(pool.view(), DType::f32, g.arena, g.s);
    Tensor dq = to_device(q.view(), DType::f32, g.arena, g.s);
    Tensor dtable = device_i32(table), dn = device_i32(n_keys), dsel = device_i32(sel);
    const int max_keys = 128;
    Tensor dscores = g.arena.tensor(DType::f32, {B, H, max_keys});
    Tensor dout = g.arena.tensor(DType::f32, {B, H, r_kv});

    for (bool dsa : {false, true}) {
        cu::MlaDecodeParams p;
        p.n_seq = B;
        p.n_head = H;
        p.r_kv = r_kv;
        p.d_r = d_r;
        p.tau = tau;
        p.q_hat = dq.ptr<float>();
        p.pages = dpool.ptr<float>() + 40;  // this layer's rows start after another layer's
        p.page_stride = page_stride;
        p.row_stride = row_stride;
        p.page_tokens = pt;
        p.block_table = dtable.ptr<int32_t>();
        p.max_pages = max_pages;
        p.n_keys = dn.ptr<int32_t>();
        p.selected = dsa ? dsel.ptr<int32_t>() : nullptr;
        p.n_selected = dsa ? n_sel : 0;
        p.max_keys = max_keys;
        p.scores = dscores.ptr<float>();
        p.o_bar = dout.ptr<float>();
        cu::mla_decode(g.s, p);

        Buffer want(DType::f32, {B, H, r_kv});
        for (int b = 0; b < B; ++b) {
            std::vector<int64_t> keys;
            const int32_t n = n_keys[static_cast<size_t>(b)];
            for (int j = 0; j < (dsa ? n_sel : n); ++j) {
                const int64_t u = dsa ? sel[static_cast<size_t>(b * n_sel + j)] : j;
                if (u >= 0 && u < n)
                    keys.push_back(u);
            }
            auto row = [&](int64_t u) {
                const int32_t page = table[static_cast<size_t>(b * max_pages + u / pt)];
                return pool.ptr<float>() + page * page_stride + 40 + (u % pt) * row_stride;
            };
            for (int h = 0; h < H; ++h) {
                const float* qh = q.ptr<float>() + (b * H + h) * d_lat;
                std::vector<double> s(keys.size());
                double mx = -INFINITY, sum = 0;
                for (size_t j = 0; j < keys.size(); ++j) {
                    double dot = 0;
                    for (int x = 0; x < d_lat; ++x)
                        dot += static_cast<double>(qh[x]) * static_cast<double>(row(keys[j])[x]);
                    s[j] = dot * static_cast<double>(tau);
                    mx = std::max(mx, s[j]);
                }
                for (double& v : s)
                    sum += (v = std::exp(v - mx));
                float* o = want.ptr<float>() + (b * H + h) * r_kv;
                for (int y = 0; y < r_kv; ++y) {
                    double acc = 0;
                    for (size_t j = 0; j < keys.size(); ++j)
                        acc += s[j] / sum * static_cast<double>(row(keys[j])[y]);
                    o[y] = static_cast<float>(acc);
                }
            }
        }
        Buffer got = to_host(dout, g.s);
        const double err = rel_error(got.ptr<float>(), want.ptr<float>(), int64_t{B} * H * r_kv);
        BOOST_TEST_INFO((dsa ? "DSA keys" : "all keys") << ": normalised error " << err);
        BOOST_TEST(err < tolerance(DType::f32));
    }
}

BOOST_AUTO_TEST_SUITE_END()
