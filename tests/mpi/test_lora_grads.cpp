// The LoRA trainer's gradient sums over ranks and global norm (runtime/lora_grads.h) on the CPU's
// Ctx over the host slots (model/lora_factors.h host_trainable), for the tiny preset with adapters
// on every target, per-expert and layer-shared expert adapters, at np 1, 2, 4, 8 over tp, dp, ep
// and etp layouts: every rank fills each gradient with small integers scaled by its rank, so
// every sum is exact; after sum_lora_gradients each factor holds the sum over the ranks that hold
// its slice (tp then dp for attention and shared experts, etp, edp and ep for routed experts,
// checked tensor by tensor against the groups worked out here), the norm counts every slice once
// (the sum of squares over the world divided by its copies), and a NaN on one rank reaches its
// slice's holders, which name the first layer holding one (an inf in a later layer ignored).
#include <cmath>
#include <limits>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "../testing.h"
#include "hymoe/backend/ctx.h"
#include "hymoe/model/config.h"
#include "hymoe/model/lora_factors.h"
#include "hymoe/model/lora_model.h"
#include "hymoe/model/model.h"
#include "hymoe/parallel/comms.h"
#include "hymoe/runtime/lora_grads.h"

using namespace hymoe;
using hymoe::testing::all_ranks;
using parallel::Group;
using parallel::Layout;

namespace {

// The layouts of this world (pp 1): {tp, dp, pp, ep, etp}.
std::vector<Layout> layouts(int world) {
    if (world == 1)
        return {Layout{1, 1, 1, 1, 1}};
    if (world == 2)
        return {Layout{2, 1, 1, 1, 1}, Layout{1, 2, 1, 1, 1}, Layout{1, 2, 1, 2, 1}};
    if (world == 4)
        return {Layout{2, 2, 1, 1, 1}, Layout{2, 2, 1, 2, 1}, Layout{2, 2, 1, 2, 2}};
    return {Layout{2, world / 2, 1, 4, 1}, Layout{2, world / 2, 1, 2, 2}};
}

// The groups a factor's gradient is summed over, from the module and the factor's split.
std::vector<Group> holders(const model::LoraModule& mod, const model::TensorSpec& t) {
    const bool split = t.split_dim >= 0;
    if (!mod.expert)
        return split ? std::vector{Group::dp} : std::vector{Group::tp, Group::dp};
    std::vector<Group> g = split ? std::vector{Group::edp} : std::vector{Group::etp, Group::edp};
    if (mod.peft_names.size() > 1)
        g.push_back(Group::ep);
    return g;
}

// x summed over the ranks of every group in gs, one after the other.
int64_t over(int64_t x, const std::vector<Group>& gs, const parallel::Comms& c) {
    for (Group g : gs)
        x = comm::all_reduce_value(x, c.of(g));
    return x;
}

// Element k of gradient i before the sums, on world rank r: (r + 1)·(1 + (i + k) mod 5).
float base(size_t i, int64_t k) {
    return static_cast<float>(1 + (static_cast<int64_t>(i) + k) % 5);
}

struct Trained {
    parallel::Grid grid;
    model::Model m;
    model::LoraModel lm;
    model::TrainableLora t;
};

void setup(Trained& s, const Layout& l, bool per_expert) {
    s.grid = parallel::make_grid(l);
    s.m = model::make_model(model::preset_config("tiny"), s.grid);
    model::init_model_random(s.m, 7);  // the weights, which the adapters attach to
    s.lm = model::attach_lora(s.m,
                              {"q_proj",
                               "k_proj",
                               "v_proj",
                               "o_proj",
                               "gate_proj",
                               "up_proj",
                               "down_proj",
                               "experts",
                               "shared_experts"},
                              per_expert);
    model::add_lora_adapter(s.lm, s.m.shard, 4, 0.5f, 3, true);
    s.t = model::host_trainable(s.lm);
    for (size_t i = 0; i < s.t.grads.size(); ++i)
        for (int64_t k = 0; k < s.t.grads[i].numel(); ++k)
            s.t.grads[i].ptr<float>()[k] = static_cast<float>(s.grid.rank + 1) * base(i, k);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(lora_grads)

BOOST_AUTO_TEST_CASE(sums_are_over_the_holders_and_the_norm_counts_each_slice_once) {
    const backend::Ctx ctx = backend::cpu_ctx();
    for (const Layout& l : layouts(hymoe::testing::world_size()))
        for (bool per_expert : {false, true}) {
            Trained s;
            setup(s, l, per_expert);
            const model::TensorList specs = s.lm.tensors(0, true);
            runtime::sum_lora_gradients(s.lm, ctx, s.t.grads, s.grid.comms);
            bool ok = true;
            std::vector<double> want = {0};
            for (size_t i = 0; i < specs.size(); ++i) {
                const std::vector<Group> gs = holders(s.lm.modules[i / 2], specs[i]);
                const auto scale = static_cast<float>(over(s.grid.rank + 1, gs, s.grid.comms));
                const auto copies = static_cast<double>(over(1, gs, s.grid.comms));
                const Tensor& g = s.t.grads[i];
                for (int64_t k = 0; k < g.numel(); ++k) {
                    const float v = scale * base(i, k);
                    ok = ok && g.ptr<float>()[k] == v;
                    want[0] += static_cast<double>(v) * static_cast<double>(v) / copies;
                }
            }
            comm::all_reduce_sum(want, s.grid.comms.world);
            const runtime::LoraGradNorm norm =
                runtime::lora_grad_norm(s.lm, ctx, s.t.grads, s.grid.comms);
            BOOST_TEST_CONTEXT("tp" << l.tp << " dp" << l.dp << " ep" << l.ep << " etp" << l.etp
                                    << (per_expert ? " per expert" : " shared")) {
                BOOST_TEST(all_ranks(ok));
                BOOST_TEST(std::abs(norm.sum_of_squares - want[0]) <= 1e-12 * want[0]);
                BOOST_TEST(norm.sum_of_squares > 0);
                BOOST_TEST(norm.nonfinite_layer == -1);
            }
        }
}

BOOST_AUTO_TEST_CASE(a_nan_on_one_rank_names_its_layer_on_the_slices_holders) {
    const backend::Ctx ctx = backend::cpu_ctx();
    for (const Layout& l : layouts(hymoe::testing::world_size())) {
        Trained s;
        setup(s, l, false);
        const model::TensorList specs = s.lm.tensors(0, true);
        // a NaN in layer 1's first factor on rank 0 only; an inf in every rank's last factor
        size_t nan_at = 0;
        while (s.lm.modules[nan_at / 2].layer < 1)
            nan_at += 2;
        const size_t inf_at = specs.size() - 1;
        BOOST_REQUIRE(s.lm.modules[inf_at / 2].layer > 1);
        if (s.grid.rank == 0)
            s.t.grads[nan_at].ptr<float>()[0] = std::numeric_limits<float>::quiet_NaN();
        s.t.grads[inf_at].ptr<float>()[0] = std::numeric_limits<float>::infinity();
        runtime::sum_lora_gradients(s.lm, ctx, s.t.grads, s.grid.comms);
        const runtime::LoraGradNorm norm =
            runtime::lora_grad_norm(s.lm, ctx, s.t.grads, s.grid.comms);
        const bool holds_the_nan = over(s.grid.rank == 0 ? 1 : 0,
                                        holders(s.lm.modules[nan_at / 2], specs[nan_at]),
                                        s.grid.comms) > 0;
        const int want =
            holds_the_nan ? s.lm.modules[nan_at / 2].layer : s.lm.modules[inf_at / 2].layer;
        BOOST_TEST_CONTEXT("tp" << l.tp << " dp" << l.dp << " ep" << l.ep << " etp" << l.etp) {
            BOOST_TEST(all_ranks(norm.nonfinite_layer == want));
            BOOST_TEST(!std::isfinite(norm.sum_of_squares));
        }
    }
}

BOOST_AUTO_TEST_SUITE_END()
