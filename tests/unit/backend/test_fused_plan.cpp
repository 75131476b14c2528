// The fused kernels' plans on the CPU (hymoe/backend/cuda_fused.h): the KDA chunk kernel's
// shared-memory layout (shapes taken and refused, 16-byte alignment, strides fit for ldmatrix,
// the regions live in each phase pairwise disjoint and inside the block's bytes, ≤ 227 KiB);
// the indexer's queries per block, candidate capacity, regions and key splits (none for a
// prefill block, enough to fill the GPU for a short decode batch at long context, never below
// four top_k keys a split, a merge that fits); the sparse MLA's row blocks, head tiles and
// regions; the MoE plan's grid bounds (enough row tiles for the most uneven routing) and its
// dispatch arrays carved from the scratch without overlap.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "hymoe/backend/cuda_fused.h"

namespace cu = hymoe::backend::cuda;

namespace {

struct Region {
    const char* name;
    int64_t off, bytes;
};

// Every pair of regions disjoint, each aligned to 16 bytes and inside [0, total).
void expect_disjoint(const std::vector<Region>& live, int64_t total, const std::string& phase) {
    for (size_t i = 0; i < live.size(); ++i) {
        const Region& a = live[i];
        BOOST_TEST_INFO(phase << ": " << a.name);
        BOOST_TEST(a.off % 16 == 0);
        BOOST_TEST_INFO(phase << ": " << a.name);
        BOOST_TEST((a.off >= 0 && a.off + a.bytes <= total));
        for (size_t j = i + 1; j < live.size(); ++j) {
            const Region& b = live[j];
            BOOST_TEST_INFO(phase << ": " << a.name << " and " << b.name);
            BOOST_TEST((a.off + a.bytes <= b.off || b.off + b.bytes <= a.off));
        }
    }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(fused_plan)

BOOST_AUTO_TEST_CASE(kda_chunk_layout_shapes) {
    for (auto [K, V] : std::vector<std::pair<int, int>>{{128, 128}, {64, 96}, {16, 32}, {96, 64}})
        BOOST_TEST(cu::kda_chunk_layout(K, V).supported);
    BOOST_TEST(cu::kda_chunk_layout(128, 128).bv == 64);
    BOOST_TEST(cu::kda_chunk_layout(128, 96).bv == 32);
    for (auto [K, V] :
         std::vector<std::pair<int, int>>{{72, 128}, {144, 128}, {0, 64}, {128, 48}}) {
        const cu::KdaChunkLayout L = cu::kda_chunk_layout(K, V);
        BOOST_TEST(!L.supported);
        BOOST_TEST(L.why != nullptr);
    }
}

BOOST_AUTO_TEST_CASE(kda_chunk_layout_regions_per_phase) {
    const int64_t C = cu::kKdaChunk, B = cu::kKdaSub;
    for (auto [K, V] :
         std::vector<std::pair<int, int>>{{128, 128}, {128, 96}, {64, 64}, {48, 32}}) {
        const cu::KdaChunkLayout L = cu::kda_chunk_layout(K, V);
        BOOST_TEST_REQUIRE(L.supported);
        BOOST_TEST(L.bytes <= cu::kDynamicSmemLimit);
        for (int ld : {L.ld_k, L.ld_c, L.ld_v})  // bf16 rows start 16-byte aligned
            BOOST_TEST(ld % 8 == 0);
        BOOST_TEST(L.ld_cf % 2 == 0);  // float2 stores of fragment pairs
        BOOST_TEST(L.ld_s % 2 == 0);
        BOOST_TEST(L.ld_k >= K);
        BOOST_TEST(L.ld_v >= L.bv);
        const Region a32{"a32", L.a32, C * K * 4}, q16{"q16", L.q16, C * L.ld_k * 2},
            k16{"k16", L.k16, C * L.ld_k * 2}, qi16{"qi16", L.qi16, (C - B) * L.ld_k * 2},
            ki16{"ki16", L.ki16, (C - B) * L.ld_k * 2}, r16{"r16", L.r16, 6 * B * L.ld_k * 2},
            qg16{"qg16", L.qg16, C * L.ld_k * 2}, kg16{"kg16", L.kg16, C * L.ld_k * 2},
            kl16{"kl16", L.kl16, C * L.ld_k * 2}, akk32{"akk32", L.akk32, C * L.ld_cf * 4},
            aqk32{"aqk32", L.aqk32, C * L.ld_cf * 4}, t16{"t16", L.t16, C * L.ld_c * 2},
            aqk16{"aqk16", L.aqk16, C * L.ld_c * 2}, w16{"w16", L.w16, C * L.ld_k * 2},
            vp16{"vp16", L.vp16, C * L.ld_v * 2}, v16{"v16", L.v16, C * L.ld_v * 2},
            x32{"x32", L.x32, 3 * B * B * 4}, s32{"s32", L.s32, K * L.ld_s * 4},
            s16{"s16", L.s16, K * L.ld_v * 2}, beta{"beta", L.beta, C * 4},
            dec{"dec", L.dec, K * 4};
        const std::string shape = "K " + std::to_string(K) + " V " + std::to_string(V);
        expect_disjoint({a32, q16, k16, qi16, ki16, r16, akk32, aqk32, s32, s16, beta, dec},
                        L.bytes,
                        shape + " stage..triangles");
        expect_disjoint({a32, q16, k16, qg16, kg16, kl16, akk32, aqk32, s32, s16, beta, dec},
                        L.bytes,
                        shape + " chunk factors");
        expect_disjoint(
            {t16, aqk16, w16, vp16, v16, x32, qg16, kg16, kl16, akk32, aqk32, s32, s16, beta, dec},
            L.bytes,
            shape + " solve..products");
    }
}

BOOST_AUTO_TEST_CASE(indexer_plan_blocks_regions_and_splits) {
    const int sms = 132;
    // DeepSeek-V3.2's indexer (64 heads of 128, top 2048): a prefill block of one sequence
    const cu::IndexerPlan pre = cu::indexer_topk_plan(8192, 8192, 64, 128, 2048, true, sms);
    BOOST_TEST_REQUIRE(pre.supported);
    // the sizes the launch checks its call against
    BOOST_TEST((pre.n_q == 8192 && pre.n_head == 64 && pre.d == 128 && pre.top_k == 2048));
    BOOST_TEST(pre.queries_per_block == 2);
    BOOST_TEST(pre.n_split == 1);
    BOOST_TEST(pre.capacity == 4096);
    BOOST_TEST(pre.scratch_bytes == 0);
    BOOST_TEST(pre.smem_bytes <= cu::kDynamicSmemLimit);
    const int rows = pre.queries_per_block * 64;
    expect_disjoint({{"q", pre.q_off, int64_t{rows} * pre.ld_q * 2},
                     {"k", pre.k_off, int64_t{pre.key_tile} * pre.ld_q * 2},
                     {"logit", pre.logit_off, int64_t{rows} * pre.ld_logit * 4},
                     {"cand", pre.cand_off, int64_t{pre.queries_per_block} * pre.capacity * 8},
                     {"w", pre.w_off, int64_t{rows} * 4}},
                    pre.smem_bytes,
                    "indexer prefill");
    BOOST_TEST(pre.ld_q % 8 == 0);
    // 64 decode queries of different sequences at 128k context: split to fill twice the SMs
    const cu::IndexerPlan dec = cu::indexer_topk_plan(64, 131072, 64, 128, 2048, false, sms);
    BOOST_TEST_REQUIRE(dec.supported);
    BOOST_TEST(dec.queries_per_block == 1);
    BOOST_TEST(dec.n_split > 1);
    BOOST_TEST(int64_t{64} * dec.n_split >= 2 * sms);
    BOOST_TEST(dec.merge_smem_bytes >= dec.n_split * 2048 * 8);
    BOOST_TEST(dec.merge_smem_bytes <= cu::kDynamicSmemLimit);
    BOOST_TEST((dec.merge_smem_bytes & (dec.merge_smem_bytes - 1)) == 0);
    BOOST_TEST(dec.scratch_bytes == int64_t{64} * dec.n_split * 2048 * 8);
    // short contexts are not split below four top_k keys a split
    BOOST_TEST(cu::indexer_topk_plan(4, 8000, 64, 128, 2048, false, sms).n_split == 1);
    BOOST_TEST(cu::indexer_topk_plan(4, 16384, 64, 128, 2048, false, sms).n_split == 2);
    // small shapes: capacity a power of two ≥ top_k + key tile; 8 heads only two to a block
    const cu::IndexerPlan small = cu::indexer_topk_plan(5, 300, 8, 32, 16, true, sms);
    BOOST_TEST(small.supported);
    BOOST_TEST(small.capacity == 128);
    BOOST_TEST(!cu::indexer_topk_plan(5, 300, 8, 32, 16, false, sms).supported);
    BOOST_TEST(!cu::indexer_topk_plan(5, 300, 16, 40, 16, false, sms).supported);
    BOOST_TEST(!cu::indexer_topk_plan(5, 300, 64, 2048, 16, false, sms).supported);  // smem
}

BOOST_AUTO_TEST_CASE(mla_sparse_plan_tiles_and_regions) {
    for (auto [H, tiles, rb] :
         std::vector<std::array<int, 3>>{{16, 1, 1}, {8, 1, 1}, {40, 2, 2}, {128, 4, 2}}) {
        const cu::MlaSparsePlan P = cu::mla_sparse_plan(H, 512, 64);
        BOOST_TEST_REQUIRE(P.supported);
        BOOST_TEST((P.n_head == H && P.r_kv == 512 && P.d_r == 64));
        BOOST_TEST(P.head_tiles == tiles);
        BOOST_TEST(P.row_blocks == rb);
        BOOST_TEST(P.smem_bytes <= cu::kDynamicSmemLimit);
        BOOST_TEST(P.ld_lat % 8 == 0);
        BOOST_TEST(P.ld_prob % 8 == 0);
        const int64_t rows = 16 * P.row_blocks;
        expect_disjoint({{"q", P.q_off, rows * P.ld_lat * 2},
                         {"k", P.k_off, int64_t{P.key_tile} * P.ld_lat * 2},
                         {"score", P.score_off, rows * P.ld_score * 4},
                         {"prob", P.prob_off, rows * P.ld_prob * 2},
                         {"stat", P.stat_off, 3 * rows * 4},
                         {"key", P.key_off, int64_t{P.key_tile} * 4}},
                        P.smem_bytes,
                        "mla H " + std::to_string(H));
    }
    BOOST_TEST(!cu::mla_sparse_plan(16, 192, 64).supported);   // 192 not a multiple of 128
    BOOST_TEST(cu::mla_sparse_plan(32, 192, 64).supported);    // ... but of 64 above 16 heads
    BOOST_TEST(!cu::mla_sparse_plan(32, 512, 60).supported);   // latent row not 16-aligned
    BOOST_TEST(!cu::mla_sparse_plan(16, 2048, 64).supported);  // ō over 16 tiles a warp
}

BOOST_AUTO_TEST_CASE(moe_plan_bounds_and_scratch) {
    // Kimi-Linear-48B's experts at 8k tokens: 256 experts, top 8, d 2304, I 1024
    const cu::MoePlan P = cu::moe_plan(8192, 8, 256, 2304, 1024);
    BOOST_TEST_REQUIRE(P.supported);
    BOOST_TEST(P.n_assign == 65536);
    BOOST_TEST(P.rank_tiles == 256);
    BOOST_TEST(P.up_col_tiles == 16);
    BOOST_TEST(P.down_col_tiles == 18);
    // Σ_e ⌈n_e / 128⌉ ≤ ⌈Σ n_e / 128⌉ + (experts with rows) for every split of the rows
    BOOST_TEST(P.row_tiles == 512 + 256);
    int64_t worst = 0;  // 255 experts with one row each, the rest on one expert
    worst += 255;
    worst += (65536 - 255 + 127) / 128;
    BOOST_TEST(worst <= P.row_tiles);
    const cu::MoePlan small = cu::moe_plan(3, 2, 64, 256, 128);  // fewer rows than experts
    BOOST_TEST(small.row_tiles == 1 + 6);
    // the dispatch arrays, carved from a scratch of scratch_bytes, do not overlap
    std::vector<char> scratch(static_cast<size_t>(P.scratch_bytes));
    const cu::MoeDispatch D = cu::moe_dispatch_arrays(P, 8192, 8, 256, scratch.data());
    auto at = [&](const int32_t* p) { return reinterpret_cast<const char*>(p) - scratch.data(); };
    expect_disjoint({{"tile_counts", at(D.tile_counts), int64_t{P.rank_tiles} * 256 * 4},
                     {"offset", at(D.offset), 257 * 4},
                     {"tile_start", at(D.tile_start), 257 * 4},
                     {"row_of", at(D.row_of), P.n_assign * 4},
                     {"token_of", at(D.token_of), P.n_assign * 4}},
                    P.scratch_bytes,
                    "moe scratch");
    BOOST_TEST(!cu::moe_plan(8192, 8, 256, 2300, 1024).supported);   // d not a multiple of 128
    BOOST_TEST(!cu::moe_plan(8192, 8, 256, 2304, 1000).supported);   // I not a multiple of 64
    BOOST_TEST(!cu::moe_plan(8192, 8, 2048, 2304, 1024).supported);  // E over 1024
}

BOOST_AUTO_TEST_SUITE_END()
