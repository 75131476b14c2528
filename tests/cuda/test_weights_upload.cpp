// The GPU model's weights (src/model/device/device_weights.cpp upload_weights, moe_weights) against
// the host model they come from: every tensor of the weight list but the vision tower's on the
// device at its list shape, the stored matrices in the compute dtype and the rest in fp32, each
// value the host's rounded to that dtype (bit for bit); the views (model_views) on those tensors;
// each MoE layer's MoeW stacks [E_held, out, in] whose slices are the hosted experts, ids
// ascending. For tiny (query latent, gated DSA, KDA, MoE), tiny-kimi (no query latent, MLA,
// correction bias) and a relu2 latent-MoE variant, over ep rank 1 of 2 under a placement, with
// f32 and bf16 host storage and compute dtypes.
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "../../src/model/device/device_runtime.h"
#include "cuda_test.h"
#include "hymoe/backend/owned_ctx.h"
#include "hymoe/model/model_views.h"
#include "hymoe/model/tensor_list.h"

namespace utf = boost::unit_test;
using namespace hymoe;
using namespace hymoe::model;
using cuda_test::need_gpu;

namespace {

// The host values of w rounded to what `t` holds.
std::vector<float> rounded(const Tensor& w, DType t) {
    std::vector<float> x = widened(w);
    if (t == DType::bf16)
        for (float& v : x)
            v = bf16_to_float(float_to_bf16(v));
    return x;
}

bool same_values(const Tensor& dev,
                 const std::vector<float>& want,
                 const backend::cuda::Stream& s) {
    const Buffer got = cuda_test::to_host(dev, s);
    return static_cast<size_t>(got.view().numel()) == want.size() &&
           std::memcmp(got.ptr<float>(), want.data(), want.size() * sizeof(float)) == 0;
}

void check_upload(Model& m, DType cd) {
    backend::OwnedCtx owned(Device::cuda, size_t{256} << 20, m.cfg.moe.n_routed_experts);
    dev::Keep keep;
    const NamedTensors named = dev::upload_weights(owned.ctx(), keep, m, cd);
    const ModelViews views = model_views(m, named);
    for (const TensorSpec& spec : model_tensors(m)) {
        if (spec.block == WeightBlock::vision) {
            BOOST_TEST(named.count(spec.name) == 0u);
            continue;
        }
        BOOST_TEST_INFO(spec.name);
        BOOST_TEST_REQUIRE(named.count(spec.name) == 1u);
        const Tensor& dev = named.at(spec.name);
        const DType want = stored_matrix(spec) ? cd : DType::f32;
        BOOST_TEST_INFO(spec.name);
        BOOST_TEST((dev.device == Device::cuda && dev.dtype == want && dev.shape == spec.shape));
        BOOST_TEST_INFO(spec.name);
        BOOST_TEST(same_values(dev, rounded(spec.dest->view(), want), *owned.ctx().stream));
    }
    BOOST_TEST((views.head.data ==
                (m.cfg.tie_word_embeddings ? views.embed.data : named.at("lm_head.weight").data)));
    for (size_t i = 0; i < m.layers.size(); ++i) {
        if (m.cfg.layers[i].ffn == Ffn::dense)
            continue;
        const MoeWeights& host = m.layers[i].moe;
        const dev::MoeW w = dev::moe_weights(views.layers[i].moe, host);
        const std::vector<int> hosted = hosted_experts(m.local, m.shard, host.expert_rank);
        BOOST_TEST_REQUIRE(w.up.dim(0) == static_cast<int64_t>(hosted.size()));
        BOOST_TEST((w.gate.data == nullptr) == (m.cfg.moe.expert_act == ExpertAct::relu2));
        for (size_t k = 0; k < hosted.size(); ++k) {
            const DenseFfnWeights& e = host.experts[static_cast<size_t>(hosted[k])];
            BOOST_TEST(
                same_values(w.experts.up[k], rounded(e.up_proj.view(), cd), *owned.ctx().stream));
            BOOST_TEST(same_values(
                w.experts.down[k], rounded(e.down_proj.view(), cd), *owned.ctx().stream));
            BOOST_TEST((w.experts.up[k].data ==
                        dev::at(w.up, static_cast<int64_t>(k) * w.up.dim(1) * w.up.dim(2))));
        }
        BOOST_TEST(w.host.expert_rank == host.expert_rank, boost::test_tools::per_element());
    }
}

Model model_of(const std::string& preset, bool relu2_latent, DType storage) {
    ModelConfig cfg = preset_config(preset);
    if (relu2_latent) {
        cfg.moe.expert_act = ExpertAct::relu2;
        for (LayerSpec& l : cfg.layers)
            if (l.ffn == Ffn::moe)
                l.ffn = Ffn::latent_moe;
    }
    cfg.tie_word_embeddings = relu2_latent;
    Model m = make_model(cfg);
    m.weight_dtype = storage;
    m.shard.ep = 2;
    m.shard.ep_rank = 1;
    for (LayerWeights& l : m.layers)
        l.moe.expert_rank = {1, 0, 0, 1, 1, 0, 1, 0};
    init_model_random(m, 9);
    return m;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_weights_upload, *utf::label("cuda"))

BOOST_AUTO_TEST_CASE(every_listed_tensor_uploaded_once_in_its_dtype, *utf::precondition(need_gpu)) {
    const std::vector<std::pair<std::string, bool>> kinds = {
        {"tiny", false}, {"tiny-kimi", false}, {"tiny", true}};  // preset, relu2 latent
    for (const auto& [preset, relu2_latent] : kinds)
        for (DType storage : {DType::f32, DType::bf16})
            for (DType cd : {DType::f32, DType::bf16}) {
                BOOST_TEST_CONTEXT(preset << (relu2_latent ? " relu2 latent" : "") << " held "
                                          << to_string(storage) << " cd " << to_string(cd)) {
                    Model m = model_of(preset, relu2_latent, storage);
                    check_upload(m, cd);
                }
            }
}

BOOST_AUTO_TEST_SUITE_END()
