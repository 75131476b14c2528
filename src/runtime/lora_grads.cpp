// The sums of the LoRA gradients over the ranks that hold the same slice (runtime/lora_grads.h).
#include "hymoe/runtime/lora_grads.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "hymoe/backend/ops_reduce.h"
#include "hymoe/backend/ops_rows.h"
#include "hymoe/core/error.h"

namespace hymoe::runtime {

namespace {

using parallel::Group;

// The groups a gradient tensor of `mod` is summed over, in order.
std::vector<Group> holders(const model::LoraModule& mod, const model::TensorSpec& t) {
    const bool split = t.split_dim >= 0;
    if (!mod.expert)
        return split ? std::vector{Group::dp} : std::vector{Group::tp, Group::dp};
    std::vector<Group> g = split ? std::vector{Group::edp} : std::vector{Group::etp, Group::edp};
    if (mod.peft_names.size() > 1)  // one adapter shared by the layer's experts
        g.push_back(Group::ep);
    return g;
}

// The groups each gradient of adapter 0 is summed over, in lm.tensors(0, true) order.
std::vector<std::vector<Group>> gradient_groups(model::LoraModel& lm, size_t n_grads) {
    const model::TensorList grads = lm.tensors(0, true);  // A, B of each module in order
    HYMOE_CHECK(grads.size() == n_grads,
                "lora gradients: ",
                n_grads,
                " tensors for ",
                grads.size(),
                " factors");
    std::vector<std::vector<Group>> out;
    for (size_t i = 0; i < grads.size(); ++i)
        out.push_back(holders(lm.modules[i / 2], grads[i]));
    return out;
}

}  // namespace

void sum_lora_gradients(model::LoraModel& lm,
                        const backend::Ctx& ctx,
                        std::span<Tensor> grads,
                        const parallel::Comms& comms) {
    const std::vector<std::vector<Group>> groups = gradient_groups(lm, grads.size());
    std::map<std::vector<Group>, std::vector<Tensor*>> by_groups;
    for (size_t i = 0; i < grads.size(); ++i)
        by_groups[groups[i]].push_back(&grads[i]);
    for (auto& [gs, list] : by_groups) {
        if (std::ranges::none_of(gs, [&](Group g) { return comms.of(g).size() > 1; }))
            continue;  // held by this rank alone
        int64_t n = 0;
        for (const Tensor* g : list)
            n += g->numel();
        backend::Scratch scratch(ctx);
        Tensor packed = scratch(DType::f32, {n});  // [n]: the group's gradients, in order
        int64_t at = 0;
        for (const Tensor* g : list) {
            Tensor part = packed.rows(at, g->numel());
            ops::cast(ctx, *g, part);
            at += g->numel();
        }
        ops::synchronize(ctx);  // the collectives run outside ctx's stream
        for (Group group : gs)
            if (comms.of(group).size() > 1)
                comm::all_reduce(packed, comms.of(group));
        at = 0;
        for (Tensor* g : list) {
            ops::cast(ctx, packed.rows(at, g->numel()), *g);
            at += g->numel();
        }
    }
}

LoraGradNorm lora_grad_norm(model::LoraModel& lm,
                            const backend::Ctx& ctx,
                            std::span<const Tensor> grads,
                            const parallel::Comms& comms) {
    const std::vector<std::vector<Group>> groups = gradient_groups(lm, grads.size());
    LoraGradNorm norm;
    std::vector<double> squares(grads.size());  // per gradient: one wait for all of them
    ops::sums_of_squares(ctx, grads, squares);
    std::vector<double> sum = {0};
    for (size_t i = 0; i < grads.size(); ++i) {
        double copies = 1;  // the slice is held by `copies` ranks: count it once
        for (Group group : groups[i])
            copies *= comms.of(group).size();
        // f32 squares summed in double stay finite: non-finite iff an element is
        const double s = squares[i];
        if (!std::isfinite(s) && norm.nonfinite_layer < 0)
            norm.nonfinite_layer = lm.modules[i / 2].layer;
        sum[0] += s / copies;
    }
    comm::all_reduce_sum(sum, comms.world);
    norm.sum_of_squares = sum[0];
    return norm;
}

}  // namespace hymoe::runtime
