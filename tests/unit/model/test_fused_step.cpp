// The GPU model's fused-kernel choices (hymoe/model/fused_step.h). The fused DSA path: refused for
// the tiny presets' latent (r_kv 32, d_r 8: not the sparse kernel's widths) and for batches past
// its grid or an indexer of 8 heads across sequences; taken for tiny-deepseek widened to r_kv 128,
// d_r 16 (tests/cuda/test_model.cpp's fused DSA model) for every step shape of that test, for mid
// and the flagship; its top_k is min(top_k, the longest context); one sequence ranks two queries a
// block. dsa_fused_bytes bounds idx plus the indexer scratch of every plan of up to max_tokens
// rows (scanned over rows, contexts, top-k, SM counts). moe_fused_bytes: the plan's scratch,
// h, out, idx and weights of the widest MoE kind; 0 where no MoE layer runs fused (no plan,
// ReLU² experts, capacity dropping).
#include <algorithm>
#include <cstdint>

#include <boost/test/unit_test.hpp>

#include "hymoe/model/config.h"
#include "hymoe/model/fused_step.h"

using namespace hymoe;
using namespace hymoe::model;
namespace cu = hymoe::backend::cuda;

namespace {

// tiny-deepseek with a latent the sparse kernel takes (as tests/cuda/test_model.cpp builds it).
ModelConfig wide_deepseek() {
    ModelConfig c = preset_config("tiny-deepseek");
    c.mla.kv_lora_rank = 128;
    c.mla.qk_rope_head_dim = 16;
    return c;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(fused_step)

BOOST_AUTO_TEST_CASE(dsa_plan_refuses_what_the_kernels_do_not_take) {
    for (const char* name : {"tiny", "tiny-deepseek"}) {
        const DsaFusedPlan P = dsa_fused_plan(preset_config(name), 3, 40, false, 132);
        BOOST_TEST_INFO(name);
        BOOST_TEST(!P.supported);
        BOOST_TEST_INFO(name);
        BOOST_TEST(P.why != nullptr);
    }
    const ModelConfig c = wide_deepseek();
    BOOST_TEST(!dsa_fused_plan(c, 0, 40, false, 132).supported);
    BOOST_TEST(!dsa_fused_plan(c, 65536, 70000, false, 132).supported);
    BOOST_TEST(dsa_fused_plan(c, 65535, 70000, false, 132).supported);
    BOOST_TEST(!dsa_fused_plan(c, 3, 0, false, 132).supported);
    ModelConfig eight = c;  // 8 indexer heads: two queries a block only, so one sequence only
    eight.indexer.n_head = 8;
    BOOST_TEST(!dsa_fused_plan(eight, 3, 40, false, 132).supported);
    BOOST_TEST(dsa_fused_plan(eight, 3, 40, true, 132).supported);
}

BOOST_AUTO_TEST_CASE(dsa_plan_for_the_model_sizes) {
    const ModelConfig c = wide_deepseek();
    // test_model.cpp's steps: (rows, longest context, sequences)
    const int64_t steps[][3] = {{30, 16, 3}, {53, 40, 3}, {3, 45, 3}, {40, 40, 1}, {1, 1, 1}};
    for (const auto& s : steps) {
        const DsaFusedPlan P = dsa_fused_plan(c, s[0], s[1], s[2] == 1, 132);
        BOOST_TEST_INFO("rows " << s[0] << " context " << s[1]);
        BOOST_TEST_REQUIRE(P.supported);
        BOOST_TEST(P.top_k == std::min<int64_t>(8, s[1]));
        BOOST_TEST(P.indexer.queries_per_block == (s[2] == 1 ? 2 : 1));
        BOOST_TEST(P.indexer.capacity >= P.top_k + P.indexer.key_tile);
        BOOST_TEST(P.attention.row_blocks == 1);
    }
    const DsaFusedPlan mid = dsa_fused_plan(preset_config("mid"), 64, 4096, false, 132);
    BOOST_TEST(mid.supported);
    BOOST_TEST(mid.top_k == 256);
    const DsaFusedPlan big = dsa_fused_plan(preset_config("flagship-2.8t"), 8, 1 << 20, false, 132);
    BOOST_TEST_REQUIRE(big.supported);
    BOOST_TEST(big.top_k == 2048);
    BOOST_TEST(big.attention.row_blocks == 2);
    BOOST_TEST(big.indexer.n_split > 1);  // a short decode batch at long context splits its keys
}

BOOST_AUTO_TEST_CASE(dsa_bytes_bound_every_plan) {
    BOOST_TEST(dsa_fused_bytes(preset_config("tiny-kimi"), 256, 132) == 0);  // no DSA layer
    ModelConfig c = wide_deepseek();
    for (int top_k : {8, 256, 2048})
        for (int n_sm : {1, 16, 132})
            for (int64_t T : {1, 200}) {
                c.indexer.top_k = top_k;
                const int64_t bound = dsa_fused_bytes(c, T, n_sm);
                int64_t most = 0;
                for (int64_t rows = 1; rows <= T; ++rows)
                    for (int64_t visible : {int64_t{1}, rows, int64_t{5000}, int64_t{1} << 20})
                        for (bool one : {false, true}) {
                            const DsaFusedPlan P = dsa_fused_plan(c, rows, visible, one, n_sm);
                            if (P.supported)
                                most = std::max(most, rows * P.top_k * 4 + P.indexer.scratch_bytes);
                        }
                BOOST_TEST_INFO("top_k " << top_k << " SMs " << n_sm << " rows " << T);
                BOOST_TEST(most <= bound);
                BOOST_TEST_INFO("top_k " << top_k << " SMs " << n_sm << " rows " << T);
                BOOST_TEST(most > 0);
            }
}

BOOST_AUTO_TEST_CASE(moe_bytes_of_the_widest_kind) {
    BOOST_TEST(moe_fused_bytes(preset_config("tiny"), 256) == 0);  // d = 64: no fused plan
    const ModelConfig mid = preset_config("mid");
    const int64_t T = 300, n = T * mid.moe.top_k;
    const cu::MoePlan plan = cu::moe_plan(T, mid.moe.top_k, mid.moe.n_routed_experts, 1024, 512);
    BOOST_TEST_REQUIRE(plan.supported);
    BOOST_TEST(moe_fused_bytes(mid, T) == plan.scratch_bytes + n * 512 * 2 + n * 1024 * 2 + n * 8);
    ModelConfig latent = mid;  // a LatentMoE layer of width 128 beside the full-width ones
    latent.moe.latent_size = 128;
    latent.layers.back().ffn = Ffn::latent_moe;
    BOOST_TEST(moe_fused_bytes(latent, T) == moe_fused_bytes(mid, T));
    for (LayerSpec& l : latent.layers)
        if (l.ffn == Ffn::moe)
            l.ffn = Ffn::latent_moe;
    const cu::MoePlan narrow = cu::moe_plan(T, mid.moe.top_k, mid.moe.n_routed_experts, 128, 512);
    BOOST_TEST(moe_fused_bytes(latent, T) ==
               narrow.scratch_bytes + n * 512 * 2 + n * 128 * 2 + n * 8);
    ModelConfig relu2 = mid;  // layers the fused kernels do not run (moe_runs_fused): nothing
    relu2.moe.expert_act = ExpertAct::relu2;
    BOOST_TEST(moe_fused_bytes(relu2, T) == 0);
    ModelConfig dropping = mid;
    dropping.moe.capacity_factor = 1.25;
    BOOST_TEST(moe_fused_bytes(dropping, T) == 0);
}

BOOST_AUTO_TEST_SUITE_END()
