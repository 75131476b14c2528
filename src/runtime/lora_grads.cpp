// The sums of the LoRA gradients over the ranks that hold the same slice (runtime/lora_grads.h).
#include "hymoe/runtime/lora_grads.h"

#include <algorithm>
#include <map>

#include "hymoe/backend/ops_reduce.h"

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

// Every gradient of adapter 0 with the groups it is summed over.
std::vector<std::pair<model::TensorSpec, std::vector<Group>>> gradients(model::LoraModel& lm) {
    const model::TensorList grads = lm.tensors(0, true);  // A, B of each module in order
    std::vector<std::pair<model::TensorSpec, std::vector<Group>>> out;
    for (size_t i = 0; i < grads.size(); ++i)
        out.emplace_back(grads[i], holders(lm.modules[i / 2], grads[i]));
    return out;
}

}  // namespace

void sum_lora_gradients(model::LoraModel& lm, const parallel::Comms& comms) {
    std::map<std::vector<Group>, std::vector<model::TensorSpec>> by_groups;
    for (auto& [t, groups] : gradients(lm))
        by_groups[groups].push_back(t);
    for (auto& [groups, list] : by_groups) {
        int64_t n = 0;
        for (const model::TensorSpec& g : list)
            n += shape_numel(g.shape);
        Buffer packed(DType::f32, {n});
        int64_t at = 0;
        for (const model::TensorSpec& g : list) {
            std::copy_n(g.dest->ptr<float>(), shape_numel(g.shape), packed.ptr<float>() + at);
            at += shape_numel(g.shape);
        }
        for (Group group : groups)
            if (comms.of(group).size() > 1)
                comm::all_reduce(packed.view(), comms.of(group));
        at = 0;
        for (const model::TensorSpec& g : list) {
            std::copy_n(packed.ptr<float>() + at, shape_numel(g.shape), g.dest->ptr<float>());
            at += shape_numel(g.shape);
        }
    }
}

double lora_grad_sum_of_squares(model::LoraModel& lm, const parallel::Comms& comms) {
    std::vector<double> sum = {0};
    for (auto& [t, groups] : gradients(lm)) {
        double copies = 1;  // the slice is held by `copies` ranks: count it once
        for (Group group : groups)
            copies *= comms.of(group).size();
        const Tensor g{t.dest->view().data, DType::f32, Device::cpu, t.shape};  // host gradients
        sum[0] += ops::sum_of_squares(backend::cpu_ctx(), g) / copies;
    }
    comm::all_reduce_sum(sum, comms.world);
    return sum[0];
}

}  // namespace hymoe::runtime
