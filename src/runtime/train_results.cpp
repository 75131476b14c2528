// The lora job's history (runtime/train_results.h): checkpoint entries and results.h5.
#include "hymoe/runtime/train_results.h"

#include "host_view.h"
#include "hymoe/io/h5.h"
#include "hymoe/parallel/comm.h"

namespace hymoe::runtime {

std::vector<io::CkptEntry> TrainHistory::entries() {
    std::vector<io::CkptEntry> e;
    auto add = [&](const char* name, std::vector<double>& v) {
        // doubles travel as int64 bit patterns: checkpoints store them bit-exact
        e.push_back({std::string("history/") + name, view_of(v, DType::i64), -1, 0, 0, true, ""});
    };
    add("step", step), add("loss", loss), add("lr", lr), add("grad_norm", grad_norm);
    add("tokens", tokens), add("seconds", seconds), add("tokens_per_s", tokens_per_s);
    add("skipped", skipped), add("eval_step", eval_step), add("domain_loss", domain_loss);
    add("general_loss", general_loss), add("domain_accuracy", domain_accuracy);
    add("general_accuracy", general_accuracy), add("load", load), add("overlap", overlap);
    add("kl", kl);
    return e;
}

void TrainHistory::resize(int64_t steps, int64_t evals) {
    for (auto* v : {&step, &loss, &lr, &grad_norm, &tokens, &seconds, &tokens_per_s, &skipped})
        v->resize(static_cast<size_t>(steps));
    for (auto* v : {&eval_step, &domain_loss, &general_loss, &domain_accuracy, &general_accuracy})
        v->resize(static_cast<size_t>(evals));
    const auto L = static_cast<int64_t>(moe_layers.size());
    load.resize(static_cast<size_t>(steps * L * n_expert));
    overlap.resize(static_cast<size_t>(steps * L));
    kl.resize(static_cast<size_t>(steps * L));
}

void TrainHistory::write(const std::string& path,
                         const io::RunMeta& meta,
                         const TrainStatus& st) const {
    const comm::Comm self = comm::self_comm();
    io::H5Writer w(path, self);
    io::write_meta(w, meta);
    auto put = [&](const std::string& name, const std::vector<double>& v, Shape shape) {
        std::vector<float> f(v.begin(), v.end());
        if (shape.empty())
            shape = {static_cast<int64_t>(v.size())};
        w.array(name, Tensor{f.data(), DType::f32, Device::cpu, shape});
    };
    const auto S = static_cast<int64_t>(step.size()), L = static_cast<int64_t>(moe_layers.size());
    std::vector<int64_t> steps(step.begin(), step.end()),
        eval_steps(eval_step.begin(), eval_step.end());
    w.array("/train/step", Tensor{steps.data(), DType::i64, Device::cpu, {S}});
    put("/train/loss", loss, {}), put("/train/lr", lr, {}), put("/train/grad_norm", grad_norm, {});
    put("/train/tokens", tokens, {}), put("/train/seconds", seconds, {});
    put("/train/tokens_per_s", tokens_per_s, {}), put("/train/skipped", skipped, {});
    const auto M = static_cast<int64_t>(eval_step.size());
    w.array("/eval/step", Tensor{eval_steps.data(), DType::i64, Device::cpu, {M}});
    put("/eval/domain_loss", domain_loss, {}), put("/eval/general_loss", general_loss, {});
    put("/eval/domain_accuracy", domain_accuracy, {});
    put("/eval/general_accuracy", general_accuracy, {});
    w.text("/train/status", st.status);
    w.text("/eval/metric", st.metric);
    int64_t best = st.best_step;
    w.array("/eval/best_step", Tensor{&best, DType::i64, Device::cpu, {1}});
    if (L > 0) {
        std::vector<int64_t> layers = moe_layers;
        w.array("/experts/layers", Tensor{layers.data(), DType::i64, Device::cpu, {L}});
        put("/experts/load", load, {S, L, n_expert});
        put("/drift/top_k_overlap", overlap, {S, L});
        put("/drift/kl", kl, {S, L});
    }
    w.commit();
}

}  // namespace hymoe::runtime
