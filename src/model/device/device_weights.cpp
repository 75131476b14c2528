// Uploading the model's weights to its device (device_runtime.h upload_weights): one walk over
// the host model's weight list (model/tensor_list.h), each tensor at its list shape in the dtype
// of its kind, the routed experts stacked per layer and matrix; and the MoE's MoeW over the
// resulting views, with its views for model::moe_forward_parallel.
#include <cstring>
#include <map>
#include <vector>

#include "device_runtime.h"
#include "hymoe/backend/ops_rows.h"
#include "hymoe/core/error.h"
#include "hymoe/model/model.h"
#include "hymoe/model/shard.h"
#include "hymoe/model/tensor_list.h"

namespace hymoe::model::dev {

namespace {

// dev [its shape] = host floats [dev.numel()], rounded to bf16 (to nearest even) when dev is.
void copy_floats(const backend::Ctx& ctx, const float* host, Tensor& dev) {
    const int64_t n = dev.numel();
    std::vector<uint16_t> staged;  // bf16: the rounded values
    if (dev.dtype == DType::bf16) {
        staged.resize(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i)
            staged[static_cast<size_t>(i)] = float_to_bf16(host[i]);
    }
    const Tensor from{staged.empty() ? const_cast<float*>(host) : static_cast<void*>(staged.data()),
                      dev.dtype,
                      Device::cpu,
                      {n}};
    ops::upload(ctx, from, dev);
    ops::synchronize(ctx);  // the host values may go when this returns (uploads are setup only)
}

// A tensor of `shape` on ctx's device kept for good in keep.
Tensor kept(const backend::Ctx& ctx, Keep& keep, DType dtype, Shape shape) {
    return keep.emplace_back(ctx, dtype, std::move(shape)).view();
}

// The slices of one stacked [n, rows, cols] tensor (upload_weights) as that tensor; none: empty.
Tensor stack_of(const std::vector<Tensor>& slices) {
    if (slices.empty())
        return {};
    const Tensor& first = slices.front();
    for (size_t k = 0; k < slices.size(); ++k)
        HYMOE_CHECK(slices[k].data == at(first, static_cast<int64_t>(k) * first.numel()) &&
                        slices[k].shape == first.shape,
                    "device model: the routed experts' matrices are not slices of one stack");
    return Tensor{first.data,
                  first.dtype,
                  first.device,
                  {static_cast<int64_t>(slices.size()), first.dim(0), first.dim(1)}};
}

// The entries of an [E] list of expert views that are held, ids ascending.
std::vector<Tensor> held(const std::vector<Tensor>& experts) {
    std::vector<Tensor> out;
    for (const Tensor& t : experts)
        if (t.data != nullptr)
            out.push_back(t);
    return out;
}

}  // namespace

Tensor upload_weight(const backend::Ctx& ctx, Keep& keep, const Buffer& host, DType dtype) {
    const Tensor& v = host.view();
    HYMOE_CHECK(v.data != nullptr, "device model: a weight is not loaded");
    const std::vector<float> x = widened(v);  // host matrices may be held in bf16
    Tensor dev = kept(ctx, keep, dtype, v.shape);
    copy_floats(ctx, x.data(), dev);
    return dev;
}

NamedTensors upload_weights(const backend::Ctx& ctx, Keep& keep, const Model& host, DType cd) {
    const TensorList list = model_tensors(host);
    const std::vector<StackSlot> slots = expert_stacks(list);
    std::map<std::string, Tensor> stacks;  // by name: [E_held, out, in]
    NamedTensors out;
    for (size_t i = 0; i < list.size(); ++i) {
        const TensorSpec& spec = list[i];
        const StackSlot& slot = slots[i];
        if (spec.block == WeightBlock::vision)
            continue;
        const Tensor& v = spec.dest->view();
        HYMOE_CHECK(v.data != nullptr && v.shape == spec.shape,
                    "device model: ",
                    spec.name,
                    " is ",
                    v.data ? shape_string(v.shape) : "not loaded",
                    " where the weight list gives ",
                    shape_string(spec.shape));
        const DType dtype = stored_matrix(spec) ? cd : DType::f32;
        Tensor dev;
        if (!slot.stack.empty()) {
            Tensor& stack = stacks[slot.stack];
            if (stack.data == nullptr) {
                Shape shape = spec.shape;
                shape.insert(shape.begin(), slot.size);
                stack = kept(ctx, keep, dtype, shape);
            }
            dev = Tensor{at(stack, slot.slot * v.numel()), dtype, stack.device, spec.shape};
        } else {
            dev = kept(ctx, keep, dtype, spec.shape);
        }
        const std::vector<float> x = widened(v);  // host matrices may be held in bf16
        copy_floats(ctx, x.data(), dev);
        out.emplace(spec.name, dev);
    }
    return out;
}

MoeW moe_weights(const MoeWeightViews& v, const MoeWeights& host) {
    MoeW out;
    out.router = v.router;
    out.bias = v.bias;
    out.fc1 = v.fc1;
    out.fc2 = v.fc2;
    out.experts.gate = held(v.experts.gate);  // relu2: none
    out.experts.up = held(v.experts.up);
    out.experts.down = held(v.experts.down);
    HYMOE_CHECK(!out.experts.up.empty(), "device model: an MoE layer holds no routed expert");
    out.gate = stack_of(out.experts.gate);
    out.up = stack_of(out.experts.up);
    out.down = stack_of(out.experts.down);
    out.shared = v.shared;
    out.host.expert_rank = host.expert_rank;
    if (v.bias.data != nullptr) {
        out.host.correction_bias = Buffer(DType::f32, host.correction_bias.view().shape);
        std::memcpy(out.host.correction_bias.ptr<float>(),
                    host.correction_bias.ptr<float>(),
                    host.correction_bias.view().bytes());
    }
    return out;
}

void replace_experts(const backend::Ctx& ctx,
                     const MoeWeights& host,
                     const std::vector<int>& before,
                     MoeW& w) {
    int64_t k = 0;  // the next slot
    for (size_t id = 0; id < host.experts.size(); ++id) {
        const DenseFfnWeights& e = host.experts[id];
        if (e.up_proj.view().data == nullptr)
            continue;  // hosted on another ep rank
        HYMOE_CHECK(k < w.up.dim(0),
                    "device model: more routed experts placed on this rank than its ",
                    w.up.dim(0),
                    " slots");
        if (k < static_cast<int64_t>(before.size()) && before[k] == static_cast<int>(id)) {
            ++k;  // the slot holds this expert already
            continue;
        }
        for (auto [src, stack] : {std::pair{&e.gate_proj, &w.gate},
                                  std::pair{&e.up_proj, &w.up},
                                  std::pair{&e.down_proj, &w.down}}) {
            if (stack->data == nullptr)
                continue;  // relu2: no gate
            const int64_t n = stack->dim(1) * stack->dim(2);
            Tensor slot{
                at(*stack, k * n), stack->dtype, stack->device, {stack->dim(1), stack->dim(2)}};
            const std::vector<float> x = widened(src->view());
            HYMOE_CHECK(static_cast<int64_t>(x.size()) == n,
                        "device model: a routed expert of ",
                        x.size(),
                        " values for a slot of ",
                        n);
            copy_floats(ctx, x.data(), slot);
        }
        ++k;
    }
    HYMOE_CHECK(k == w.up.dim(0),
                "device model: ",
                k,
                " routed experts placed on this rank for its ",
                w.up.dim(0),
                " slots");
    w.host.expert_rank = host.expert_rank;
}

MoeWeightViews moe_views_of(const MoeW& w, DType cd, int64_t n_exp, const comm::Comm* ep) {
    MoeWeightViews v = w;
    v.host_bias = w.host.correction_bias.view();
    v.expert_rank = w.host.expert_rank;
    if (ep != nullptr)
        v.expert_slot = local_expert_index(w.host.expert_rank, n_exp, ep->size(), ep->rank());
    v.act = cd;
    return v;
}

}  // namespace hymoe::model::dev
