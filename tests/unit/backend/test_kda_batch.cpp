// Unit tests of the batched KDA ops' CPU forms (hymoe/backend/kda_batch.h): over a table of three
// sequences (one empty) they equal, bit for bit, the one-sequence kernels called per sequence in
// order, for each choice of chunk_from (every sequence chunked, the automatic rule, every one
// token by token); a bad plane or a table without states is refused. And the scratch stand-in
// (backend/scratch_stand_in.h): found only for its own arena, scopes nest and restore, and a CPU
// context's Scratch never uses one.
#include <cstdint>
#include <cstring>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/backend/kda_batch.h"
#include "hymoe/backend/ops.h"
#include "hymoe/backend/scratch_stand_in.h"
#include "hymoe/core/error.h"
#include "hymoe/core/rng.h"

namespace {

using namespace hymoe;

constexpr int H = 2, K = 8, W = 4;
constexpr int64_t D = H * K;
const std::vector<int64_t> kOffsets = {0, 5, 5, 75};  // 5, 0 and 70 rows (two chunks of 64)

std::vector<float> normal(int64_t n, uint32_t stream, float scale = 1.0f) {
    std::vector<float> v(static_cast<size_t>(n));
    Philox(3, stream, 0).fill_normal(v.data(), v.size(), 0.0f, scale);
    return v;
}

Tensor view(std::vector<float>& v, Shape shape) {
    return Tensor{v.data(), DType::f32, Device::cpu, std::move(shape)};
}

// Per sequence: S [H, K, K] and the three tails [W−1, D], random starting values.
struct States {
    std::vector<std::vector<float>> S, tail[3];
    explicit States(uint32_t stream) {
        for (int s = 0; s < 3; ++s) {
            S.push_back(normal(H * K * K, stream++, 0.1f));
            for (auto& t : tail)
                t.push_back(normal((W - 1) * D, stream++));
        }
    }
};

// A table over `st` (host pointers).
struct Table {
    std::vector<float*> S, tail[3];
    std::vector<int32_t> row_seq;
    ops::KdaSeqTable t;
    explicit Table(States& st) {
        for (int s = 0; s < 3; ++s) {
            S.push_back(st.S[s].data());
            for (int p = 0; p < 3; ++p)
                tail[p].push_back(st.tail[p][s].data());
            for (int64_t r = kOffsets[s]; r < kOffsets[s + 1]; ++r)
                row_seq.push_back(s);
        }
        t.n_tok = kOffsets.back();
        t.n_seq = 3;
        t.max_len = 70;
        t.offsets = kOffsets.data();
        t.row_seq = row_seq.data();
        t.state = S.data();
        for (int p = 0; p < 3; ++p)
            t.tail[p] = tail[p].data();
    }
};

bool same(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(kda_batch)

BOOST_AUTO_TEST_CASE(conv_equals_the_one_sequence_conv_per_sequence) {
    const int64_t n = kOffsets.back();
    std::vector<float> u = normal(n * D, 1), w = normal(D * W, 2);
    for (int plane = 0; plane < 3; ++plane) {
        States a(10), b(10);
        Table ta(a);
        std::vector<float> got(static_cast<size_t>(n * D)), want(got.size());
        Tensor gv = view(got, {n, D});
        ops::kda_conv_silu(ta.t, view(u, {n, D}), view(w, {D, 1, W}), plane, gv);
        for (int s = 0; s < 3; ++s) {
            const int64_t r = kOffsets[s], len = kOffsets[s + 1] - r;
            if (len == 0)
                continue;
            Tensor us = view(u, {n, D}).rows(r, len), ys = view(want, {n, D}).rows(r, len);
            Tensor tail = view(b.tail[plane][s], {W - 1, D});
            ops::causal_conv(us, view(w, {D, W}), tail, ys);
        }
        Tensor wv = view(want, {n, D});
        ops::silu_inplace(wv);
        BOOST_TEST(same(got, want));
        for (int s = 0; s < 3; ++s)
            for (int p = 0; p < 3; ++p)
                BOOST_TEST(same(a.tail[p][s], b.tail[p][s]));  // only the plane's tails moved
    }
    States a(10);
    Table ta(a);
    std::vector<float> out(static_cast<size_t>(n * D));
    Tensor ov = view(out, {n, D});
    BOOST_CHECK_THROW(ops::kda_conv_silu(ta.t, view(u, {n, D}), view(w, {D, W}), 3, ov), Error);
}

BOOST_AUTO_TEST_CASE(scan_equals_the_one_sequence_kernels_for_each_chunk_rule) {
    const int64_t n = kOffsets.back();
    std::vector<float> q = normal(n * D, 20, 0.3f), k = normal(n * D, 21, 0.3f);
    std::vector<float> v = normal(n * D, 22), g = normal(n * D, 23, 0.1f);
    std::vector<float> beta = normal(n * H, 24, 0.2f);
    for (float& x : g)
        x = -x * x;  // log-decay ≤ 0
    for (float& x : beta)
        x = 0.5f + x * x;
    for (const int64_t chunk_from : {int64_t{0}, int64_t{2}, INT64_MAX}) {
        BOOST_TEST_CONTEXT("chunk_from " << chunk_from) {
            States a(30), b(30);
            Table ta(a);
            std::vector<float> got(static_cast<size_t>(n * D)), want(got.size());
            ops::KdaBatchScan p;
            p.n_head = H;
            p.d_k = p.d_v = K;
            p.q = q.data();
            p.k = k.data();
            p.v = v.data();
            p.g = g.data();
            p.beta = beta.data();
            p.o = got.data();
            p.chunk_from = chunk_from;
            ops::kda_scan_batch(ta.t, p);
            for (int s = 0; s < 3; ++s) {
                const int64_t r = kOffsets[s];
                ops::KdaScanParams one;
                one.n_tok = kOffsets[s + 1] - r;
                one.n_head = H;
                one.d_k = one.d_v = K;
                one.q = q.data() + r * D;
                one.k = k.data() + r * D;
                one.v = v.data() + r * D;
                one.g = g.data() + r * D;
                one.beta = beta.data() + r * H;
                one.S = b.S[s].data();
                one.o = want.data() + r * D;
                if (one.n_tok >= chunk_from)
                    ops::kda_chunked(one);
                else
                    ops::kda_recurrent(one);
            }
            BOOST_TEST(same(got, want));
            for (int s = 0; s < 3; ++s)
                BOOST_TEST(same(a.S[s], b.S[s]));
        }
    }
    ops::KdaSeqTable empty_states;
    empty_states.n_seq = 1;
    BOOST_CHECK_THROW(ops::kda_scan_batch(empty_states, ops::KdaBatchScan{}), Error);
}

BOOST_AUTO_TEST_CASE(stand_in_scopes_nest_and_a_cpu_scratch_ignores_them) {
    struct Fake final : backend::ScratchStandIn {
        int taken = 0;
        Tensor tensor(DType, Shape) override {
            ++taken;
            return {};
        }
        void release(void*) noexcept override {}
    } outer, inner;
    // arenas are only compared by address here
    const auto* arena_a = reinterpret_cast<const backend::cuda::DeviceArena*>(&outer);
    const auto* arena_b = reinterpret_cast<const backend::cuda::DeviceArena*>(&inner);
    BOOST_TEST(backend::ScratchStandIn::active(arena_a) == nullptr);
    {
        backend::StandInScope s1(outer, *arena_a);
        BOOST_TEST(backend::ScratchStandIn::active(arena_a) == &outer);
        BOOST_TEST(backend::ScratchStandIn::active(arena_b) == nullptr);
        {
            backend::StandInScope s2(inner, *arena_b);
            BOOST_TEST(backend::ScratchStandIn::active(arena_b) == &inner);
            BOOST_TEST(backend::ScratchStandIn::active(arena_a) == nullptr);
        }
        BOOST_TEST(backend::ScratchStandIn::active(arena_a) == &outer);
        const backend::Ctx cpu = backend::cpu_ctx();
        backend::Scratch scratch(cpu);
        const Tensor t = scratch(DType::f32, {4});
        BOOST_TEST((t.device == Device::cpu && t.data != nullptr));
        BOOST_TEST(outer.taken == 0);
    }
    BOOST_TEST(backend::ScratchStandIn::active(arena_a) == nullptr);
}

BOOST_AUTO_TEST_SUITE_END()
