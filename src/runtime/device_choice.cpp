// job.device against the build, the job and the machine (runtime/device_choice.h).
#include "hymoe/runtime/device_choice.h"

#include "hymoe/core/error.h"
#include "hymoe/core/log.h"
#include "hymoe/parallel/device_select.h"

namespace hymoe::runtime {

std::optional<std::string> device_limit(const Job& job, bool cuda_build) {
    const deck::Deck& d = job.deck;
    const parallel::Layout& l = job.layout;
    if (!cuda_build)
        return std::string("this hymoe was built without CUDA (make CUDA=1 builds it)");
    if (d.job.kind != deck::JobKind::infer && d.job.kind != deck::JobKind::lora)
        return cat(deck::to_string(d.job.kind),
                   " jobs run on the CPU only (the GPU runs infer and lora jobs)");
    if (l.ep > 1 && d.parallel.rebalance_every > 0)
        return std::string(
            "the GPU model keeps each routed expert where it was loaded (parallel.rebalance_every "
            "moves them on the CPU only)");
    return std::nullopt;
}

DeviceDecision decide_device(const deck::Deck& deck,
                             const std::optional<std::string>& limit,
                             bool gpu_on_every_rank) {
    const deck::DeviceChoice choice = deck.job.device;
    if (choice == deck::DeviceChoice::cpu)
        return {};
    if (limit) {
        if (choice == deck::DeviceChoice::cuda)
            HYMOE_FAIL(Exit::invalid, deck.locate("job.device"), ": cuda, but ", *limit);
        return {false, "job.device: auto runs on the CPU, because " + *limit};
    }
    if (!gpu_on_every_rank) {
        if (choice == deck::DeviceChoice::cuda)
            HYMOE_FAIL(Exit::invalid,
                       deck.locate("job.device"),
                       ": cuda, but not every rank sees a GPU (use auto to fall back to the CPU)");
        return {false, "job.device: auto runs on the CPU, because not every rank sees a GPU"};
    }
    return {true, ""};
}

DeviceDecision choose_device(const Job& job) {
#ifdef HYMOE_CUDA
    const bool cuda_build = true;
#else
    const bool cuda_build = false;
#endif
    const std::optional<std::string> limit = device_limit(job, cuda_build);
    const bool want = job.deck.job.device != deck::DeviceChoice::cpu && !limit;
    const backend::DeviceInfo info = parallel::select_device(want);  // collective in every case
    DeviceDecision decision = decide_device(job.deck, limit, info.cuda_available);
    if (decision.cuda)
        decision.note = cat("device: GPU ",
                            info.device,
                            " of the ",
                            info.n_devices,
                            " rank 0 sees (",
                            info.name,
                            ", ",
                            info.memory_gb,
                            " GB); each rank takes GPU local_rank mod its GPU count");
    if (!decision.note.empty())
        log::info(decision.note);
    return decision;
}

}  // namespace hymoe::runtime
