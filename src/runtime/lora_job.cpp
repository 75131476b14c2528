// The lora job (runtime/trainer.h) as a Trainer: setup, resume and checkpoints, one optimizer step
// with its guard, the per-step monitoring and evaluation, the step lines every log_every steps,
// results.h5 rewritten while it runs, the best checkpoint and early stopping, and the adapters out.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

#include <nlohmann/json.hpp>

#include "hymoe/backend/ops_rows.h"
#include "hymoe/core/error.h"
#include "hymoe/core/log.h"
#include "hymoe/core/sha256.h"
#include "hymoe/core/stop.h"
#include "hymoe/core/timer.h"
#include "hymoe/io/checkpoint.h"
#include "hymoe/io/meta.h"
#include "hymoe/model/device_weights.h"
#include "hymoe/model/lora_factors.h"
#include "hymoe/model/lora_model.h"
#include "hymoe/model/model_views.h"
#include "hymoe/model/train.h"
#include "hymoe/runtime/device_choice.h"
#include "hymoe/runtime/engine.h"
#include "hymoe/runtime/eval_watch.h"
#include "hymoe/runtime/lora_adapters.h"
#include "hymoe/runtime/lora_grads.h"
#include "hymoe/runtime/model_checkpoint.h"
#include "hymoe/runtime/optimizer.h"
#include "hymoe/runtime/preflight.h"
#include "hymoe/runtime/train_data.h"
#include "hymoe/runtime/train_results.h"
#include "hymoe/runtime/trainer.h"
#include "train_monitor.h"

namespace hymoe::runtime {

namespace {

std::string fixed(double x, int digits) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", digits, x);
    return buf;
}

std::string sci(double x) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.3e", x);
    return buf;
}

// The adapters without dropout while it lives (the evaluations and the routing-drift probe), as
// in PEFT's eval mode.
class NoDropout {
public:
    explicit NoDropout(model::LoraModel& lm) : lm_(lm) {
        for (model::LoraModule& mod : lm_.modules)
            kept_.push_back(std::exchange(mod.slot->dropout, 0.0f));
    }
    ~NoDropout() {
        for (size_t i = 0; i < kept_.size(); ++i)
            lm_.modules[i].slot->dropout = kept_[i];
    }
    NoDropout(const NoDropout&) = delete;
    NoDropout& operator=(const NoDropout&) = delete;

private:
    model::LoraModel& lm_;
    std::vector<float> kept_;  // [modules]
};

// The adapter's factor scale: alpha / r, or alpha / √r with rsLoRA.
double lora_scale(const deck::LoraSection& l) {
    return l.alpha /
           (l.rslora ? std::sqrt(static_cast<double>(l.rank)) : static_cast<double>(l.rank));
}

// What one optimizer step measured.
struct StepOutcome {
    double loss = 0, grad_norm = 0, tokens = 0;
    bool skipped = false;
    std::vector<std::vector<int64_t>> load;  // [n_layer][E] assignments on this replica
};

class Trainer {
public:
    Trainer(const Job& job, const parallel::Grid& grid, bool on_gpu);
    int run();

private:
    std::vector<io::CkptEntry> entries();
    int64_t resume();  // the steps already done (0 without a checkpoint)
    void save(int64_t steps_done, bool best);
    void evaluate_at(int64_t steps_done);
    double metric(size_t eval_index) const;  // finetune.eval.metric at the i-th evaluation
    StepOutcome train_step(int64_t step);
    void record(int64_t step, const StepOutcome& out, double seconds);
    // The step line for the log interval ending at steps_done (steps read from the history).
    void log_line(int64_t steps_done) const;
    void write_results(const std::string& status) const;  // rank 0
    // The guard: "" when the step is good, else what went wrong (naming layer and rank);
    // bad_layer: this rank's first layer with a non-finite gradient, or −1.
    std::string check(double loss, int bad_layer);
    // The host slots' factors made current (on a GPU, brought down once after each update) for
    // what reads them: a checkpoint, the adapters written out.
    void factors_to_host();
    // Where the passes run: the CPU on m_'s weights and lm_'s host slots, or this rank's GPU on
    // uploaded weights with lm_'s adapter as device factors (model/lora_factors.h).
    model::TrainOn on() const { return {m_, ctx(), views_}; }
    const backend::Ctx& ctx() const { return gpu_ ? gpu_->ctx() : m_.ctx; }

    const Job& job_;
    const parallel::Grid& grid_;
    const deck::FinetuneSection& ft_;
    const double t0_ = wall_seconds();
    const std::string started_ = log::utc_timestamp();
    model::Model m_;
    model::LoraModel lm_;
    TrainMix mix_;
    const int64_t micro_, dp_, accum_;
    EvalSet eval_domain_, eval_general_, probe_;
    TrainHistory hist_;
    EvalWatch watch_;
    int64_t saved_ = -1;  // the step of the newest checkpoint this run saved or resumed from
    model::TrainBatch probe_batch_;  // routing drift: the first micro_batch domain rows
    std::vector<Buffer> base_dist_;  // their router distributions at step 0 (B = 0: the base)
    const std::string ckpt_root_, config_sha_;
    std::vector<double> recent_;  // the last losses (spike guard)
    double run_seconds_ = 0;      // the steps of this run: the ETA of the step lines
    int64_t run_steps_ = 0;
    std::unique_ptr<model::DeviceWeights> gpu_;    // on a GPU: the uploaded weights
    std::unique_ptr<model::LoraFactors> factors_;  //   and the adapter there
    bool host_behind_ = false;        // an update since the host slots' factors were brought down
    model::ModelViews views_;         // the weights the passes read (on())
    model::TrainableLora trainable_;  // the adapter's factors and gradients on ctx()
    std::unique_ptr<AdamW> opt_;      // their update on ctx()
};

model::LoraModel attached(model::Model& m, const deck::FinetuneSection& ft, uint64_t seed) {
    model::LoraModel lm = model::attach_lora(m, ft.lora.target_modules, ft.lora.per_expert);
    model::add_lora_adapter(
        lm, m.shard, ft.lora.rank, static_cast<float>(lora_scale(ft.lora)), seed ^ 0x10AAu, true);
    for (model::LoraModule& mod : lm.modules)
        mod.slot->dropout = static_cast<float>(ft.lora.dropout);
    return lm;
}

Trainer::Trainer(const Job& job, const parallel::Grid& grid, bool on_gpu)
    : job_(job),
      grid_(grid),
      ft_(job.deck.finetune),
      m_(build_model(job, grid)),
      lm_(attached(m_, ft_, job.deck.job.seed)),
      mix_(ft_.domain_data,
           ft_.general_ratio > 0 ? ft_.general_data : "",
           ft_.domain_ratio,
           ft_.seq_len,
           job.deck.job.seed),
      micro_(ft_.micro_batch),
      dp_(job.layout.dp),
      accum_(ft_.grad_accum),
      eval_domain_(eval_set(ft_.eval_domain, ft_.eval_batches * micro_ * dp_, ft_.seq_len)),
      eval_general_(eval_set(ft_.eval_general, ft_.eval_batches * micro_ * dp_, ft_.seq_len)),
      watch_{ft_.early_stopping_patience, ft_.early_stopping_min_delta},
      ckpt_root_(job.deck.job.output + "/checkpoints"),
      config_sha_(sha256_hex(model::to_json(job.model))) {
    if (on_gpu) {  // (a build without CUDA refuses it in make_device_weights)
        // the frozen matrices at model.dtype (bf16, else fp32, as the GPU model); the activations,
        // the adapter and its gradients stay fp32
        const DType weights = job.deck.model.dtype == DType::bf16 ? DType::bf16 : DType::f32;
        gpu_ = model::make_device_weights(m_, Device::cuda, weights, device_arena_bytes(job));
        factors_ = std::make_unique<model::LoraFactors>(gpu_->ctx(), m_, lm_);
        views_ = factors_->attach(gpu_->views());
        log::info(cat("GPU: ",
                      weights == DType::bf16 ? "bf16" : "fp32",
                      " weights, ",
                      fixed(static_cast<double>(gpu_->weight_bytes()) / 1e9, 2),
                      " GB; the adapter's factors, gradients and AdamW moments on the GPU"));
        trainable_ = factors_->trainable();
    } else {
        views_ = model::host_views(m_);
        trainable_ = model::host_trainable(lm_);
    }
    opt_ = std::make_unique<AdamW>(
        ft_.optimizer, ctx(), lm_.tensors(0), trainable_.factors, trainable_.grads);
    const int64_t trainable = model::lora_local_params(lm_);
    const int64_t total = model::count_params(job.model).total;
    log::info(cat("model ready in ",
                  fixed(wall_seconds() - t0_, 2),
                  " s; LoRA r = ",
                  ft_.lora.rank,
                  ", alpha = ",
                  ft_.lora.alpha,
                  " on ",
                  lm_.modules.size(),
                  " projections: ",
                  trainable,
                  " trainable parameters, ",
                  fixed(100.0 * static_cast<double>(trainable) / static_cast<double>(total), 4),
                  "% of ",
                  total));
    for (size_t i = 0; i < job.model.layers.size(); ++i)
        if (job.model.layers[i].ffn != model::Ffn::dense)
            hist_.moe_layers.push_back(static_cast<int64_t>(i));
    hist_.n_expert = job.model.moe.n_routed_experts;
    if (hist_.moe_layers.empty())
        return;
    probe_ = eval_set(ft_.domain_data, micro_, ft_.seq_len);
    std::vector<DocImages> images;
    probe_batch_ = load_rows(probe_.rows, 0, micro_, {&*probe_.stream}, ft_.seq_len, &images);
    splice_images(m_, images, probe_batch_);
    base_dist_ = model::router_distributions(on(), probe_batch_);
}

std::vector<io::CkptEntry> Trainer::entries() {
    std::vector<io::CkptEntry> e;
    for (const model::TensorSpec& t : lm_.tensors(0))
        e.push_back(checkpoint_entry(t, m_.shard));
    for (const model::TensorSpec& t : opt_->state())
        e.push_back(checkpoint_entry(t, m_.shard));
    for (io::CkptEntry& h : hist_.entries())
        e.push_back(h);
    return e;
}

int64_t Trainer::resume() {
    const std::string latest = io::latest_checkpoint(ckpt_root_);
    if (latest.empty())
        return 0;
    const nlohmann::json state = nlohmann::json::parse(
        nlohmann::json::parse(io::read_manifest(latest)).at("state_json").get<std::string>());
    if (state["model_config_sha256"] != config_sha_)
        HYMOE_FAIL(Exit::checkpoint,
                   latest,
                   ": written for another model config (its sha256 ",
                   state["model_config_sha256"].get<std::string>(),
                   ", this deck's ",
                   config_sha_,
                   ")");
    const auto done = state["steps_done"].get<int64_t>();
    hist_.resize(done, state["evals_done"].get<int64_t>());
    std::vector<io::CkptEntry> e = entries();
    std::string state_json;
    io::load_checkpoint(grid_.comms.world, latest, e, state_json);
    if (factors_)
        factors_->upload_factors();
    opt_->upload_state();
    std::vector<DocCursor> cursors;
    for (const auto& c : state["cursors"])
        cursors.push_back({c[0].get<int64_t>(), c[1].get<int64_t>()});
    mix_.seek(cursors, state["mix_row"].get<int64_t>());
    log::info(cat("resuming from ", latest, " after step ", done));
    return done;
}

void Trainer::save(int64_t steps_done, bool best) {
    nlohmann::json state;
    state["steps_done"] = steps_done;
    state["evals_done"] = hist_.eval_step.size();
    state["mix_row"] = mix_.rows_planned();
    state["model_config_sha256"] = config_sha_;
    state["dropout"] = "keyed by (seed, step, micro-batch, module): no other random state";
    for (const DocCursor& c : mix_.cursors())
        state["cursors"].push_back({c.epoch, c.pos});
    factors_to_host();
    opt_->download_state();
    io::save_checkpoint(grid_.comms.world,
                        ckpt_root_,
                        steps_done,
                        entries(),
                        state.dump(),
                        ft_.checkpoint_keep,
                        best);
    saved_ = steps_done;
    log::info(cat("checkpoint: ", ckpt_root_, "/step_", steps_done, best ? " (best)" : ""));
}

void Trainer::evaluate_at(int64_t steps_done) {
    const NoDropout eval_mode(lm_);
    auto measure = [&](const EvalSet& e, double& l, double& acc) {
        l = acc = std::nan("");
        if (e.rows.empty())
            return;
        const model::LossSums s = evaluate(on(), e, ft_.seq_len, micro_, grid_);
        const auto n = static_cast<double>(std::max<int64_t>(s.targets, 1));
        l = s.loss / n;
        acc = static_cast<double>(s.correct) / n;
    };
    double dl, da, gl, ga;
    measure(eval_domain_, dl, da);
    measure(eval_general_, gl, ga);
    hist_.eval_step.push_back(static_cast<double>(steps_done));
    hist_.domain_loss.push_back(dl), hist_.domain_accuracy.push_back(da);
    hist_.general_loss.push_back(gl), hist_.general_accuracy.push_back(ga);
    log::info(cat("eval at step ",
                  steps_done,
                  ": domain loss ",
                  fixed(dl, 4),
                  ", accuracy ",
                  fixed(da, 4),
                  "; general loss ",
                  fixed(gl, 4),
                  ", accuracy ",
                  fixed(ga, 4)));
}

double Trainer::metric(size_t eval_index) const {
    return (ft_.eval_metric == "general_loss" ? hist_.general_loss : hist_.domain_loss)[eval_index];
}

void Trainer::factors_to_host() {
    if (factors_ && host_behind_)
        factors_->download_factors();
    host_behind_ = false;
}

std::string Trainer::check(double loss, int bad_layer) {
    const int64_t world = grid_.layout.world();
    const int64_t worst =
        comm::all_reduce_value(bad_layer < 0 ? INT64_MAX : int64_t{bad_layer} * world + grid_.rank,
                               grid_.comms.world,
                               comm::ReduceOp::min);
    if (worst != INT64_MAX)
        return cat("a non-finite gradient in layer ", worst / world, " on rank ", worst % world);
    if (!std::isfinite(loss))
        return cat("a non-finite loss (", loss, ")");
    double mean = 0;
    for (double r : recent_)
        mean += r / static_cast<double>(recent_.size());
    if (ft_.loss_spike > 0 && recent_.size() >= 5 && loss > ft_.loss_spike * mean)
        return cat("loss ", loss, " is above ", ft_.loss_spike, " × the recent mean ", mean);
    return "";
}

StepOutcome Trainer::train_step(int64_t step) {
    const std::vector<RowPlan> plan = mix_.plan(micro_ * dp_ * accum_);
    std::vector<model::TrainBatch> batches;
    for (int64_t a = 0; a < accum_; ++a) {
        std::vector<DocImages> images;
        const int64_t micro_index = a * dp_ + grid_.me.dp;  // in the step, over all replicas
        batches.push_back(mix_.load(plan, micro_index * micro_, micro_, &images));
        splice_images(m_, images, batches.back());
        batches.back().dropout_seed = job_.deck.job.seed ^ (static_cast<uint64_t>(step) << 20) ^
                                      static_cast<uint64_t>(micro_index);
    }
    std::vector<double> counts = {0, 0};  // targets, tokens of the global batch
    for (const model::TrainBatch& b : batches) {
        counts[0] += static_cast<double>(
            std::count_if(b.targets.begin(), b.targets.end(), [](int64_t t) { return t >= 0; }));
        counts[1] += static_cast<double>(b.tokens.size());
    }
    comm::all_reduce_sum(counts, grid_.comms.dp);
    const double targets = std::max(counts[0], 1.0);
    StepOutcome out;
    out.tokens = counts[1];
    out.load.resize(job_.model.layers.size());
    for (Tensor& g : trainable_.grads)
        ops::fill_zero(ctx(), g);
    model::TrainOptions o;
    o.recompute = ft_.recompute;
    o.grad_scale = 1.0 / targets;  // the step's mean loss over every replica's targets
    o.expert_load = &out.load;
    for (model::LoraModule& mod : lm_.modules)
        if (mod.slot->dropout > 0.0f)
            o.dropout_slots.push_back(mod.slot);
    std::vector<double> loss = {model::train_forward_backward(on(), batches, o).loss};
    sum_lora_gradients(lm_, ctx(), trainable_.grads, grid_.comms);
    comm::all_reduce_sum(loss, grid_.comms.dp);
    out.loss = loss[0] / targets;
    const LoraGradNorm norm = lora_grad_norm(lm_, ctx(), trainable_.grads, grid_.comms);
    out.grad_norm = std::sqrt(norm.sum_of_squares);
    const std::string bad = check(out.loss, norm.nonfinite_layer);
    if (!bad.empty()) {
        if (ft_.on_nonfinite == "stop")
            HYMOE_FAIL(Exit::bad_input,
                       "step ",
                       step + 1,
                       ": ",
                       bad,
                       " (finetune.on_nonfinite: stop; the last checkpoint is kept)");
        log::info(cat("warning: step ",
                      step + 1,
                      ": ",
                      bad,
                      "; batch skipped (finetune.on_nonfinite: skip)"));
        out.skipped = true;
        return out;
    }
    recent_.push_back(out.loss);
    if (recent_.size() > 20)
        recent_.erase(recent_.begin());
    const double clip = ft_.optimizer.grad_clip > 0
                            ? std::min(1.0, ft_.optimizer.grad_clip / (out.grad_norm + 1e-6))
                            : 1.0;
    opt_->step(learning_rate(ft_.optimizer, step, ft_.steps), clip, step + 1);
    host_behind_ = true;
    return out;
}

void Trainer::record(int64_t step, const StepOutcome& out, double seconds) {
    // this run's steps: the ETA of the step lines (a resumed run's first line has one too)
    run_seconds_ += seconds;
    ++run_steps_;
    // expert load as shares per MoE layer (summed over every rank: each assignment is counted
    // once, by the etp rank 0 that computed it) and routing drift on the probe (per stage)
    const auto L = static_cast<int64_t>(hist_.moe_layers.size()), E = hist_.n_expert;
    std::vector<double> shares(static_cast<size_t>(L * E));
    for (int64_t l = 0; l < L; ++l)
        for (int64_t e = 0; e < E && !out.load[hist_.moe_layers[l]].empty(); ++e)
            shares[l * E + e] = static_cast<double>(out.load[hist_.moe_layers[l]][e]);
    comm::all_reduce_sum(shares, grid_.comms.world);
    for (int64_t l = 0; l < L; ++l) {
        double s = 0;
        for (int64_t e = 0; e < E; ++e)
            s += shares[l * E + e];
        for (int64_t e = 0; e < E && s > 0; ++e)
            shares[l * E + e] /= s;
    }
    std::vector<double> ov(static_cast<size_t>(L)), kl(static_cast<size_t>(L));
    if (L > 0) {
        const NoDropout eval_mode(lm_);  // the factor views read the slots' dropout too
        drift(base_dist_,
              model::router_distributions(on(), probe_batch_),
              hist_.moe_layers,
              job_.model.moe.top_k,
              ov.data(),
              kl.data());
        std::vector<double> both(ov);  // each MoE layer's stage has its figures; the others 0
        both.insert(both.end(), kl.begin(), kl.end());
        comm::all_reduce_sum(both, grid_.comms.pp);
        std::copy_n(both.begin(), L, ov.begin());
        std::copy_n(both.begin() + L, L, kl.begin());
    }
    const double lr = learning_rate(ft_.optimizer, step, ft_.steps);
    hist_.step.push_back(static_cast<double>(step + 1));
    hist_.loss.push_back(out.loss), hist_.lr.push_back(lr),
        hist_.grad_norm.push_back(out.grad_norm);
    hist_.tokens.push_back(out.tokens), hist_.seconds.push_back(seconds);
    hist_.tokens_per_s.push_back(out.tokens / seconds);
    hist_.skipped.push_back(out.skipped ? 1 : 0);
    hist_.load.insert(hist_.load.end(), shares.begin(), shares.end());
    hist_.overlap.insert(hist_.overlap.end(), ov.begin(), ov.end());
    hist_.kl.insert(hist_.kl.end(), kl.begin(), kl.end());
}

void Trainer::log_line(int64_t steps_done) const {
    // the interval: the steps after the previous multiple of log_every, up to steps_done
    const int64_t every = ft_.log_every, first = (steps_done - 1) / every * every;
    double loss = 0, norm = 0, tokens = 0, seconds = 0;
    int64_t good = 0, skipped = 0;
    for (int64_t i = first; i < steps_done; ++i) {
        const auto k = static_cast<size_t>(i);
        tokens += hist_.tokens[k], seconds += hist_.seconds[k];
        if (hist_.skipped[k] != 0) {
            ++skipped;
            continue;
        }
        loss += hist_.loss[k], norm += hist_.grad_norm[k], ++good;
    }
    const double n = good > 0 ? static_cast<double>(good) : std::nan("");
    const size_t L = hist_.moe_layers.size();
    log::info(
        cat("step ",
            steps_done,
            "/",
            ft_.steps,
            ": loss ",
            fixed(loss / n, 4),
            steps_done - first > 1 ? cat(" (mean of steps ", first + 1, "-", steps_done, ")") : "",
            ", lr ",
            sci(hist_.lr[static_cast<size_t>(steps_done - 1)]),
            ", grad norm ",
            fixed(norm / n, 4),
            ", ",
            fixed(tokens / seconds, 1),
            " tokens/s",
            skipped > 0 ? cat(", ", skipped, " skipped") : "",
            L > 0 ? cat(", router top-k overlap ",
                        fixed(hist_.overlap[static_cast<size_t>(steps_done - 1) * L], 3),
                        " (layer ",
                        hist_.moe_layers[0],
                        ")")
                  : "",
            ", ETA ",
            fixed(static_cast<double>(ft_.steps - steps_done) * run_seconds_ /
                      static_cast<double>(std::max<int64_t>(run_steps_, 1)),
                  0),
            " s"));
}

void Trainer::write_results(const std::string& status) const {
    if (grid_.rank == 0)
        hist_.write(job_.deck.job.output + "/results.h5",
                    {&job_.deck, job_.layout, model::describe(job_.model), started_},
                    {status, ft_.eval_metric, watch_.best_step});
}

int Trainer::run() {
    const int64_t start = resume();
    saved_ = start > 0 ? start : -1;
    for (size_t i = 0; i < hist_.eval_step.size(); ++i)  // the resumed history's verdicts
        watch_.add(static_cast<int64_t>(hist_.eval_step[i]), metric(i));
    if (ft_.eval_every > 0 && start == 0)
        evaluate_at(0);  // the base model
    const StopSignals stop_signals;
    const double max_seconds = 0.99 * 3600 * job_.deck.job.max_hours;
    bool early = start < ft_.steps && watch_.should_stop();  // a rerun of one that stopped early
    int64_t done = start;
    for (int64_t step = start; step < ft_.steps && !early; ++step) {
        const double ts = wall_seconds();
        const StepOutcome out = train_step(step);
        record(step, out, wall_seconds() - ts);
        done = step + 1;
        const bool last = done == ft_.steps, interval = done % ft_.log_every == 0;
        if (interval || last)
            log_line(done);
        bool evaluated = false, best = false;
        if (ft_.eval_every > 0 && (done % ft_.eval_every == 0 || last)) {
            evaluate_at(done);
            evaluated = true;
            best = watch_.add(done, metric(hist_.eval_step.size() - 1)) && ft_.checkpoint_best;
            early = watch_.should_stop() && !last;
        }
        const bool stopping =
            comm::all_reduce_value(
                stop_signal() != 0 || (max_seconds > 0 && wall_seconds() - t0_ >= max_seconds),
                grid_.comms.world,
                comm::ReduceOp::max) != 0;
        const bool finishing = last || early;
        if (!interval && !last && (early || stopping))  // the steps since the last line
            log_line(done);
        if (best) {  // the adapter first: a crash before the checkpoint redoes both
            factors_to_host();
            export_adapters(job_, m_, lm_, grid_, "best");
            log::info(cat("best ",
                          ft_.eval_metric,
                          " so far (",
                          fixed(watch_.best, 4),
                          "): ",
                          job_.deck.job.output,
                          "/adapters/best and checkpoints/best"));
        }
        if (best || (ft_.checkpoint_every > 0 && done % ft_.checkpoint_every == 0) ||
            (stopping && !finishing))
            save(done, best);
        if (stopping && !finishing) {
            write_results("stopped");
            log::info(cat("stopped after step ",
                          done,
                          " (",
                          stop_signal() ? signal_name(stop_signal()) : "job.max_hours",
                          "): rerun the same deck to resume (exit 75)"));
            return static_cast<int>(Exit::stopped);
        }
        if ((interval || evaluated || saved_ == done) && !finishing)
            write_results("running");
    }
    if (early)
        log::info(cat("early stopping after step ",
                      done,
                      ": ",
                      ft_.eval_metric,
                      " has not improved by more than ",
                      ft_.early_stopping_min_delta,
                      " for ",
                      watch_.stale,
                      " evaluations (finetune.early_stopping.patience: ",
                      ft_.early_stopping_patience,
                      "); best ",
                      fixed(watch_.best, 4),
                      " at step ",
                      watch_.best_step));
    if (saved_ != done)
        save(done, false);
    factors_to_host();
    export_adapters(job_, m_, lm_, grid_, "final");
    write_results(early ? "early_stopped" : "done");
    comm::barrier(grid_.comms.world);
    log::info(cat("done: ",
                  done,
                  early ? cat(" of ", ft_.steps) : "",
                  " steps in ",
                  fixed(wall_seconds() - t0_, 1),
                  " s; adapters in ",
                  job_.deck.job.output,
                  "/adapters/final",
                  watch_.best_step > 0 && ft_.checkpoint_best
                      ? cat(", the best (step ", watch_.best_step, ") in adapters/best")
                      : ""));
    return 0;
}

}  // namespace

int run_lora(const Job& job, const parallel::Grid& grid, bool on_gpu) {
    check_train_data_vocab(job);  // before the model is built
    return Trainer(job, grid, on_gpu).run();
}

}  // namespace hymoe::runtime
