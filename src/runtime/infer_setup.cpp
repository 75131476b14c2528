// The infer job's setup: this rank's weights from the job's source (random, or read slice by
// slice from safetensors or a model checkpoint), the KV page budget (inference.kv_cache.pages,
// or auto; in host memory, on the GPU, or in the GPU's host tier) and the GPU model's settings.
#include <algorithm>
#include <fstream>
#include <limits>
#include <memory>

#include "hymoe/backend/ops.h"
#include "hymoe/core/error.h"
#include "hymoe/core/log.h"
#include "hymoe/io/safetensors.h"
#include "hymoe/runtime/device_choice.h"
#include "hymoe/runtime/engine.h"
#include "hymoe/runtime/model_checkpoint.h"

namespace hymoe::runtime {

namespace {

// The bytes of host memory a rank may give its KV pages: half of what the node has available
// (/proc/meminfo), shared by the world's ranks as if on one node.
int64_t host_kv_bytes(const Job& job) {
    int64_t available = 0;  // bytes, from /proc/meminfo (kB)
    std::ifstream meminfo("/proc/meminfo");
    for (std::string key; meminfo >> key;) {
        int64_t kb = 0;
        meminfo >> kb;
        if (key == "MemAvailable:")
            available = kb * 1024;
        meminfo.ignore(64, '\n');
    }
    return available / 2 / job.layout.world();
}

}  // namespace

WeightFill weight_fill(const Job& job, const model::ModelShard& shard) {
    if (job.deck.model.init_random)
        return [&job, shard](const model::TensorList& list) {
            model::init_tensors_random(list, shard, job.deck.job.seed);
        };
    if (is_model_checkpoint(job.deck.model.weights)) {  // a convert job's output
        model::ReadTensor read = open_model_checkpoint(job.deck.model.weights, job.model);
        return [shard, read](const model::TensorList& list) {
            model::load_tensors(list, shard, read);
        };
    }
    // each rank reads only its part: the rows or columns of its slice out of the memory map
    auto folder = std::make_shared<io::SafetensorsFolder>(job.deck.model.weights);
    if (job.model.quant.fp8)
        folder->set_fp8({job.model.quant.block_rows, job.model.quant.block_cols},
                        job.deck.model.config);
    auto read = [&job, folder](
                    const std::string& name, const model::TensorPart& part, Tensor& dest) {
        if (part.dim < 0)
            return folder->read(name, dest);
        const Shape& stored = folder->info(name).shape;
        if (part.dim >= static_cast<int>(stored.size()) || stored[part.dim] != part.full)
            HYMOE_FAIL_ONE(Exit::bad_input,
                           job.deck.model.weights,
                           ": ",
                           name,
                           " is ",
                           shape_string(stored),
                           " but the config gives dim ",
                           part.dim,
                           " a length of ",
                           part.full);
        folder->read_slice(name, part.dim, part.begin, dest);
    };
    return [shard, read](const model::TensorList& list) { model::load_tensors(list, shard, read); };
}

model::Model build_model(const Job& job, const parallel::Grid& grid) {
    model::Model m = model::make_model(job.model, grid);
    m.weight_dtype = job.deck.model.dtype;
    if (m.weight_dtype != DType::f32)
        log::info(cat("weights: matrices held in ",
                      to_string(m.weight_dtype),
                      ", products by ",
                      ops::to_string(m.weight_dtype == DType::bf16 ? ops::weight_kernel()
                                                                   : ops::WeightKernel::portable)));
    weight_fill(job, m.shard)(model::model_tensors(m));
    return m;
}

int64_t kv_pages(const Job& job, int64_t page_bytes, const parallel::Grid& grid) {
    if (job.deck.inference.pages > 0)
        return job.deck.inference.pages;
    const int64_t pages =
        comm::all_reduce_value(host_kv_bytes(job) / std::max<int64_t>(page_bytes, 1),
                               grid.comms.world,
                               comm::ReduceOp::min);
    // a page id is an int32 in the block tables
    return std::clamp<int64_t>(pages, job.layout.pp, std::numeric_limits<int32_t>::max());
}

int64_t device_kv_pages(const Job& job,
                        const model::DeviceModel& device,
                        int64_t page_bytes,
                        const parallel::Grid& grid) {
    const bool host_tier =
        job.deck.inference.offload == "host" || job.deck.inference.offload == "file";
    const int64_t mine = host_tier ? device.host_kv_page_budget(page_bytes, host_kv_bytes(job))
                                   : device.kv_page_budget(page_bytes);
    const int64_t budget =
        comm::all_reduce_value(std::min<int64_t>(mine, std::numeric_limits<int32_t>::max()),
                               grid.comms.world,
                               comm::ReduceOp::min);
    const std::string where =
        host_tier ? "in half the host memory available (host or file tier), with two layers' slots "
                    "of them on the GPU next to the weights and one step's work"
                  : "on the GPU next to the weights and one step's work";
    const int64_t asked = job.deck.inference.pages;
    if (asked > budget)
        HYMOE_FAIL(Exit::invalid,
                   job.deck.locate("inference.kv_cache.pages"),
                   ": ",
                   asked,
                   " pages of ",
                   page_bytes,
                   " bytes do not fit ",
                   where,
                   " (",
                   budget,
                   " do); lower it, or leave it auto");
    if (budget < 1)
        HYMOE_FAIL(Exit::invalid,
                   job.deck.locate("inference.batch"),
                   ": no KV page of ",
                   page_bytes,
                   " bytes fits ",
                   where,
                   "; lower max_tokens or max_seqs");
    return asked > 0 ? asked : budget;
}

model::DeviceModelOptions device_model_options(const Job& job) {
    const deck::InferenceSection& inf = job.deck.inference;
    model::DeviceModelOptions o;
    o.dtype = job.deck.model.dtype == DType::bf16 ? DType::bf16 : DType::f32;
    if (job.deck.model.dtype == DType::f16)
        log::info("model.dtype: fp16 runs as fp32 matrices on the GPU (no fp16 GEMM path there)");
    o.max_tokens = inf.max_tokens;
    o.max_seqs = inf.max_seqs;
    o.logits_all = inf.prompt_logprobs;
    o.arena_bytes = device_arena_bytes(job);  // collective
    // inference.batch_invariant: the generic ops, eagerly (their products go to the invariant
    // GEMM, backend/cuda_gemm.h); the fused kernels and the decode graphs are not made for it
    o.fused = o.graphs = !inf.batch_invariant;
    return o;
}

}  // namespace hymoe::runtime
