// LoRA adapters in and out (runtime/lora_adapters.h): PEFT export, merged weights, PEFT loading
// for the infer job with each rank reading its tensor-parallel part.
#include "hymoe/runtime/lora_adapters.h"

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "hymoe/core/error.h"
#include "hymoe/core/log.h"
#include "hymoe/io/checkpoint.h"
#include "hymoe/io/peft.h"
#include "hymoe/io/safetensors.h"
#include "hymoe/runtime/model_checkpoint.h"

namespace hymoe::runtime {

namespace {

namespace fs = std::filesystem;

// The last dotted component of a module path: "q_proj" of "model.layers.0.self_attn.q_proj".
std::string leaf(const std::string& module) {
    return module.substr(module.rfind('.') + 1);
}

// Whether a PEFT key is another rank's to apply: it names a layer of another pipeline stage
// ("…model.layers.N.…", N outside this stage's layers) or a routed expert ("….experts.E.…") that
// this rank does not host.
bool another_ranks(const std::string& key, const model::Model& m) {
    const std::string tag = "model.layers.", expert_tag = ".experts.";
    const size_t at = key.find(tag);
    if (at == std::string::npos)
        return false;
    const int layer = std::atoi(key.c_str() + at + tag.size());
    if (!m.shard.owns_layer(layer))
        return true;
    const size_t e_at = key.find(expert_tag);
    if (e_at == std::string::npos || !std::isdigit(key[e_at + expert_tag.size()]))
        return false;
    const std::vector<model::DenseFfnWeights>& experts = m.layers[layer].moe.experts;
    const auto e = static_cast<size_t>(std::atoi(key.c_str() + e_at + expert_tag.size()));
    return e < experts.size() && experts[e].up_proj.view().data == nullptr;
}

// The whole tensors of every rank's parts, on rank 0 (empty on the others; rank 0 holds them
// all at once): written as checkpoint files into the scratch folder dir, read back whole by rank
// 0, and the folder removed. Collective over world.
std::map<std::string, Buffer> gather_on_rank0(const comm::Comm& world,
                                              const std::string& dir,
                                              const std::vector<io::CkptEntry>& parts) {
    if (world.rank() == 0) {
        fs::remove_all(dir);
        fs::create_directories(dir);
    }
    comm::barrier(world);
    const std::string listed = io::write_tensors(world, dir, parts, false);
    std::map<std::string, Buffer> whole;
    if (world.rank() == 0) {
        const io::TensorStore store(dir, "{\"tensors\": " + listed + "}");
        const nlohmann::json names = nlohmann::json::parse(listed);
        for (const auto& item : names.items()) {
            Buffer b(DType::f32, store.shape(item.key()));
            Tensor v = b.view();
            store.read(item.key(), -1, 0, 0, v);
            whole.emplace(item.key(), std::move(b));
        }
        fs::remove_all(dir);
    }
    return whole;
}

}  // namespace

void export_adapters(const Job& job,
                     model::Model& m,
                     model::LoraModel& lm,
                     const parallel::Grid& grid,
                     const std::string& folder) {
    const deck::FinetuneSection& ft = job.deck.finetune;
    const std::string out = job.deck.job.output;
    const comm::Comm& world = grid.comms.world;
    nlohmann::json mine = nlohmann::json::object();  // module → its PEFT module names
    std::vector<io::CkptEntry> parts;
    for (const model::LoraModule& mod : lm.modules)
        mine[mod.name] = mod.peft_names;
    for (const model::TensorSpec& t : lm.tensors(0))
        parts.push_back(checkpoint_entry(t, m.shard));
    const std::map<std::string, Buffer> whole =
        gather_on_rank0(world, out + "/.adapter.partial", parts);
    const std::vector<std::string> modules = io::all_gather_strings(mine.dump(), world);
    if (grid.rank == 0) {
        io::PeftConfig c;
        c.r = ft.lora.rank, c.alpha = ft.lora.alpha, c.dropout = ft.lora.dropout;
        c.rslora = ft.lora.rslora;
        c.base_model =
            job.deck.model.weights.empty() ? job.deck.model.preset : job.deck.model.weights;
        std::map<std::string, std::vector<std::string>> peft_names;  // every stage's modules
        for (const std::string& text : modules) {
            const nlohmann::json rank_modules = nlohmann::json::parse(text);
            for (const auto& [name, names] : rank_modules.items())
                peft_names[name] = names.get<std::vector<std::string>>();
        }
        std::set<std::string> leaves;
        std::vector<std::pair<std::string, Tensor>> tensors;
        for (const auto& [module, names] : peft_names)
            for (const std::string& name : names) {  // a shared expert adapter: each expert
                tensors.emplace_back(io::peft_key(name, 'A'),
                                     whole.at(module + ".lora_A.weight").view());
                tensors.emplace_back(io::peft_key(name, 'B'),
                                     whole.at(module + ".lora_B.weight").view());
                leaves.insert(leaf(name));
            }
        c.target_modules.assign(leaves.begin(), leaves.end());
        fs::create_directories(out + "/adapters");
        io::write_peft(out + "/adapters/" + folder, c, tensors);
    }
    if (ft.export_merged && folder == "final") {
        model::merge_lora(lm, 0);
        std::vector<io::CkptEntry> weights;
        for (const model::TensorSpec& t : model::model_tensors(m))
            weights.push_back(checkpoint_entry(t, m.shard));
        const std::map<std::string, Buffer> merged =
            gather_on_rank0(world, out + "/.merged.partial", weights);
        if (grid.rank == 0) {
            std::vector<std::pair<std::string, Tensor>> tensors;
            for (const auto& [name, b] : merged)
                tensors.emplace_back(name, b.view());
            const std::string dir = out + "/merged";
            fs::create_directories(dir);
            io::write_safetensors(
                dir + "/model.safetensors", tensors, {{"format", "pt"}}, job.deck.model.dtype);
            std::ofstream(dir + "/config.json") << model::to_json(job.model) << "\n";
        }
    }
    comm::barrier(world);
}

bool adapters_adapt_routed_experts(const Job& job) {
    for (const auto& [name, dir] : job.deck.inference.adapters) {
        const io::SafetensorsFile file(dir + "/adapter_model.safetensors");
        for (const std::string& key : file.names())
            if (key.find(".mlp.experts.") != std::string::npos)
                return true;
    }
    return false;
}

InferAdapters load_infer_adapters(const Job& job, model::Model& m) {
    InferAdapters a;
    const auto& folders = job.deck.inference.adapters;
    if (folders.empty())
        return a;
    // every projection an adapter may hold; expert adapters per expert (a layer-shared one is
    // written once per expert module)
    a.lm = model::attach_lora(m,
                              {"q_proj",
                               "k_proj",
                               "v_proj",
                               "o_proj",
                               "gate_proj",
                               "up_proj",
                               "down_proj",
                               "experts",
                               "shared_experts"},
                              true,
                              false);
    for (const auto& [name, dir] : folders) {
        const int id = static_cast<int>(a.ids.size());
        a.ids[name] = id;
        const io::PeftConfig c = io::read_peft_config(dir);
        const io::SafetensorsFile file(dir + "/adapter_model.safetensors");
        std::set<std::string> used;
        for (model::LoraModule& mod : a.lm.modules) {
            model::LoraPair& p = mod.slot->adapters.emplace_back();
            const std::string ka = io::peft_key(mod.name, 'A'), kb = io::peft_key(mod.name, 'B');
            if (!file.has(ka) || !file.has(kb))
                continue;  // this adapter leaves the projection alone
            used.insert(ka), used.insert(kb);
            const Shape& w = mod.weight.shape;  // [out, in], this rank's part
            p.scale = static_cast<float>(c.scale());
            p.A = Buffer(DType::f32, {c.r, w[1]});
            p.B = Buffer(DType::f32, {w[0], c.r});
            const int part = m.shard.part(mod.weight.split_over);
            if (mod.weight.split_dim == 1)
                file.read_slice(ka, 1, part * w[1], p.A.view());
            else
                file.read(ka, p.A.view());
            if (mod.weight.split_dim == 0)
                file.read_slice(kb, 0, part * w[0], p.B.view());
            else
                file.read(kb, p.B.view());
        }
        for (const std::string& key : file.names())
            if (!used.count(key) && !another_ranks(key, m))
                HYMOE_FAIL(Exit::bad_input,
                           dir,
                           ": adapter '",
                           name,
                           "' holds ",
                           key,
                           ", which names no projection of this model");
        log::info(cat("adapter '", name, "' (", dir, "): r = ", c.r, ", alpha = ", c.alpha));
    }
    return a;
}

}  // namespace hymoe::runtime
