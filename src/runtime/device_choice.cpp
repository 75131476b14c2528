// job.device against the build, the job and the machine, and job.device_memory's share of the GPU
// (runtime/device_choice.h).
#include "hymoe/runtime/device_choice.h"

#include <cmath>

#include "hymoe/core/error.h"
#include "hymoe/core/log.h"
#include "hymoe/parallel/device_select.h"
#include "hymoe/parallel/device_share.h"

namespace hymoe::runtime {

namespace {

double gb(size_t bytes) {  // to two decimals
    return std::round(static_cast<double>(bytes) / 1e7) / 100;
}

}  // namespace

std::optional<std::string> device_limit(const Job& job, bool cuda_build) {
    const deck::Deck& d = job.deck;
    if (!cuda_build)
        return std::string("this hymoe was built without CUDA (make CUDA=1 builds it)");
    if (d.job.kind != deck::JobKind::infer && d.job.kind != deck::JobKind::lora)
        return cat(deck::to_string(d.job.kind),
                   " jobs run on the CPU only (the GPU runs infer and lora jobs)");
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

size_t arena_share(size_t free_bytes, double fraction, int sharers) {
    HYMOE_CHECK(fraction > 0 && fraction <= 1 && sharers >= 1,
                "arena_share: a fraction of ",
                fraction,
                " among ",
                sharers,
                " ranks");
    return static_cast<size_t>(static_cast<double>(free_bytes) * fraction / sharers);
}

size_t device_arena_bytes(const Job& job) {
    const parallel::DeviceShare share =
        parallel::share_device(backend::current_device_key(), backend::free_device_bytes);
    const double fraction = job.deck.job.device_memory;
    const size_t bytes = arena_share(share.free_bytes, fraction, share.sharers);
    if (share.sharers > 1)
        log::info(cat("job.device_memory: ",
                      share.sharers,
                      " ranks share GPU ",
                      backend::current_device(),
                      ": each takes ",
                      fraction,
                      " / ",
                      share.sharers,
                      " of its ",
                      gb(share.free_bytes),
                      " GB free (",
                      gb(bytes),
                      " GB)"));
    return bytes;
}

}  // namespace hymoe::runtime
