// The lora job (runtime/trainer.h): setup, the step loop with its guard, evaluation, monitoring,
// checkpoints and resume, and the adapters out.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "hymoe/core/error.h"
#include "hymoe/core/log.h"
#include "hymoe/core/sha256.h"
#include "hymoe/core/stop.h"
#include "hymoe/core/timer.h"
#include "hymoe/io/checkpoint.h"
#include "hymoe/io/meta.h"
#include "hymoe/model/lora_model.h"
#include "hymoe/model/train.h"
#include "hymoe/runtime/engine.h"
#include "hymoe/runtime/lora_adapters.h"
#include "hymoe/runtime/optimizer.h"
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

// The first layer (in layer order) with a non-finite adapter gradient on this rank, or −1.
int nonfinite_layer(model::LoraModel& lm) {
    for (const model::LoraModule& mod : lm.modules) {
        const model::LoraPair& p = mod.slot->adapters[0];
        for (const Buffer* g : {&p.dA, &p.dB})
            for (int64_t i = 0; i < g->view().numel(); ++i)
                if (!std::isfinite(g->ptr<float>()[i]))
                    return mod.layer;
    }
    return -1;
}

void zero_grads(model::LoraModel& lm) {
    for (const model::TensorSpec& g : lm.tensors(0, true))
        std::fill_n(g.dest->ptr<float>(), shape_numel(g.shape), 0.0f);
}

// Sums the adapter gradients over the dp replicas: one all-reduce of them packed together.
void all_reduce_grads(model::LoraModel& lm, const comm::Comm& dp) {
    if (dp.size() == 1)
        return;
    const model::TensorList grads = lm.tensors(0, true);
    int64_t n = 0;
    for (const model::TensorSpec& g : grads)
        n += shape_numel(g.shape);
    Buffer packed(DType::f32, {n});
    int64_t at = 0;
    for (const model::TensorSpec& g : grads) {
        std::copy_n(g.dest->ptr<float>(), shape_numel(g.shape), packed.ptr<float>() + at);
        at += shape_numel(g.shape);
    }
    comm::all_reduce(packed.view(), dp);
    at = 0;
    for (const model::TensorSpec& g : grads) {
        std::copy_n(packed.ptr<float>() + at, shape_numel(g.shape), g.dest->ptr<float>());
        at += shape_numel(g.shape);
    }
}

io::CkptEntry entry_of(const model::TensorSpec& t, const model::ModelShard& shard) {
    io::CkptEntry e{t.name, t.dest->view(), t.split_dim, 0, 0, true, ""};
    if (t.split_dim >= 0) {
        const int64_t n = t.shape[t.split_dim];
        e.begin = n * shard.part(t.split_over);
        e.full = n * shard.parts(t.split_over);
    }
    return e;
}

}  // namespace

int run_lora(const Job& job, const parallel::Grid& grid) {
    const deck::FinetuneSection& ft = job.deck.finetune;
    if (job.layout.tp * job.layout.pp * job.layout.ep > 1)
        HYMOE_FAIL(Exit::invalid,
                   job.deck.locate("parallel"),
                   ": lora jobs run on data-parallel replicas of the whole model here "
                   "(tp = pp = ep = 1; dp any)");
    const double t0 = wall_seconds();
    model::Model m = build_model(job, grid);
    model::LoraModel lm = model::attach_lora(m, ft.lora.target_modules, ft.lora.per_expert);
    const double scale =
        ft.lora.alpha / (ft.lora.rslora ? std::sqrt(static_cast<double>(ft.lora.rank))
                                        : static_cast<double>(ft.lora.rank));
    model::add_lora_adapter(
        lm, m.shard, ft.lora.rank, static_cast<float>(scale), job.deck.job.seed ^ 0x10AAu, true);
    for (model::LoraModule& mod : lm.modules)
        mod.slot->dropout = static_cast<float>(ft.lora.dropout);
    const int64_t trainable = model::lora_local_params(lm);
    const int64_t total = model::count_params(job.model).total;
    log::info(cat("model ready in ",
                  fixed(wall_seconds() - t0, 2),
                  " s; LoRA r = ",
                  ft.lora.rank,
                  ", alpha = ",
                  ft.lora.alpha,
                  " on ",
                  lm.modules.size(),
                  " projections: ",
                  trainable,
                  " trainable parameters, ",
                  fixed(100.0 * static_cast<double>(trainable) / static_cast<double>(total), 4),
                  "% of ",
                  total));
    AdamW opt(ft.optimizer, lm.tensors(0), lm.tensors(0, true));
    const int64_t micro = ft.micro_batch, dp = job.layout.dp, accum = ft.grad_accum;
    TrainMix mix(ft.domain_data,
                 ft.general_ratio > 0 ? ft.general_data : "",
                 ft.domain_ratio,
                 ft.seq_len,
                 job.deck.job.seed);
    const int64_t eval_rows = ft.eval_batches * micro * dp;
    const EvalSet eval_domain = eval_set(ft.eval_domain, eval_rows, ft.seq_len);
    const EvalSet eval_general = eval_set(ft.eval_general, eval_rows, ft.seq_len);

    // the probe batch of routing drift: the first micro_batch rows of the domain data, in order;
    // the base distributions are those of step 0 (B = 0: the adapters add nothing yet)
    TrainHistory hist;
    for (size_t i = 0; i < job.model.layers.size(); ++i)
        if (job.model.layers[i].ffn != model::Ffn::dense)
            hist.moe_layers.push_back(static_cast<int64_t>(i));
    hist.n_expert = job.model.moe.n_routed_experts;
    const auto L = static_cast<int64_t>(hist.moe_layers.size()), E = hist.n_expert;
    EvalSet probe = eval_set(ft.domain_data, L > 0 ? micro : 0, ft.seq_len);
    model::TrainBatch probe_batch;
    if (L > 0) {
        std::vector<DocImages> images;
        probe_batch = load_rows(probe.rows, 0, micro, {&*probe.stream}, ft.seq_len, &images);
        splice_images(m, images, probe_batch);
    }
    const std::vector<Buffer> base_dist =
        L > 0 ? model::router_distributions(m, probe_batch) : std::vector<Buffer>{};

    // resume from the newest checkpoint of this output folder
    const std::string ckpt_root = job.deck.job.output + "/checkpoints";
    const std::string config_sha = sha256_hex(model::to_json(job.model));
    auto entries = [&] {
        std::vector<io::CkptEntry> e;
        for (const model::TensorSpec& t : lm.tensors(0))
            e.push_back(entry_of(t, m.shard));
        for (const model::TensorSpec& t : opt.state())
            e.push_back(entry_of(t, m.shard));
        for (io::CkptEntry& h : hist.entries())
            e.push_back(h);
        return e;
    };
    int64_t start = 0;
    const std::string latest = io::latest_checkpoint(ckpt_root);
    if (!latest.empty()) {
        const nlohmann::json state = nlohmann::json::parse(
            nlohmann::json::parse(io::read_manifest(latest)).at("state_json").get<std::string>());
        if (state["model_config_sha256"] != config_sha)
            HYMOE_FAIL(Exit::checkpoint,
                       latest,
                       ": written for another model config (its sha256 ",
                       state["model_config_sha256"].get<std::string>(),
                       ", this deck's ",
                       config_sha,
                       ")");
        hist.resize(state["steps_done"].get<int64_t>(), state["evals_done"].get<int64_t>());
        std::vector<io::CkptEntry> e = entries();
        std::string state_json;
        io::load_checkpoint(grid.comms.world, latest, e, state_json);
        start = state["steps_done"].get<int64_t>();
        std::vector<DocCursor> cursors;
        for (const auto& c : state["cursors"])
            cursors.push_back({c[0].get<int64_t>(), c[1].get<int64_t>()});
        mix.seek(cursors, state["mix_row"].get<int64_t>());
        log::info(cat("resuming from ", latest, " after step ", start));
    }
    auto save = [&](int64_t steps_done) {
        nlohmann::json state;
        state["steps_done"] = steps_done;
        state["evals_done"] = hist.eval_step.size();
        state["mix_row"] = mix.rows_planned();
        state["model_config_sha256"] = config_sha;
        state["dropout"] = "keyed by (seed, step, micro-batch, module): no other random state";
        for (const DocCursor& c : mix.cursors())
            state["cursors"].push_back({c.epoch, c.pos});
        io::save_checkpoint(
            grid.comms.world, ckpt_root, steps_done, entries(), state.dump(), ft.checkpoint_keep);
        log::info(cat("checkpoint: ", ckpt_root, "/step_", steps_done));
    };

    // evaluation: domain and general loss and accuracy on the fixed eval rows
    auto run_eval = [&](int64_t steps_done) {
        auto measure = [&](const EvalSet& e, double& l, double& acc) {
            l = acc = std::nan("");
            if (e.rows.empty())
                return;
            const model::LossSums s = evaluate(m, e, ft.seq_len, micro, grid);
            const auto n = static_cast<double>(std::max<int64_t>(s.targets, 1));
            l = s.loss / n;
            acc = static_cast<double>(s.correct) / n;
        };
        double dl, da, gl, ga;
        measure(eval_domain, dl, da);
        measure(eval_general, gl, ga);
        hist.eval_step.push_back(static_cast<double>(steps_done));
        hist.domain_loss.push_back(dl), hist.domain_accuracy.push_back(da);
        hist.general_loss.push_back(gl), hist.general_accuracy.push_back(ga);
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
    };
    if (ft.eval_every > 0 && start == 0)
        run_eval(0);  // the base model

    const StopSignals stop_signals;
    const double max_seconds = 0.99 * 3600 * job.deck.job.max_hours;
    std::vector<double> recent;  // the last losses (spike guard)
    for (int64_t step = start; step < ft.steps; ++step) {
        const double ts = wall_seconds();
        const std::vector<RowPlan> plan = mix.plan(micro * dp * accum);
        std::vector<model::TrainBatch> batches;
        for (int64_t a = 0; a < accum; ++a) {
            std::vector<DocImages> images;
            batches.push_back(mix.load(plan, (a * dp + grid.me.dp) * micro, micro, &images));
            splice_images(m, images, batches.back());
        }
        std::vector<double> counts = {0, 0};  // targets, tokens of the global batch
        for (const model::TrainBatch& b : batches) {
            counts[0] += static_cast<double>(std::count_if(
                b.targets.begin(), b.targets.end(), [](int64_t t) { return t >= 0; }));
            counts[1] += static_cast<double>(b.tokens.size());
        }
        comm::all_reduce_sum(counts, grid.comms.dp);
        const auto all_targets = static_cast<int64_t>(counts[0]);
        const double all_tokens = counts[1];
        zero_grads(lm);
        model::LossSums sums;
        std::vector<std::vector<int64_t>> load(job.model.layers.size());
        model::TrainOptions o;
        o.recompute = ft.recompute;
        o.grad_scale = 1.0 / static_cast<double>(std::max<int64_t>(all_targets, 1));
        o.expert_load = &load;
        for (int64_t a = 0; a < accum; ++a) {
            for (model::LoraModule& mod : lm.modules)
                mod.slot->dropout_seed = job.deck.job.seed ^ (static_cast<uint64_t>(step) << 20) ^
                                         static_cast<uint64_t>(a * dp + grid.me.dp);
            sums.add(model::train_forward_backward(m, batches[a], o));
        }
        all_reduce_grads(lm, grid.comms.dp);
        std::vector<double> red = {sums.loss};
        comm::all_reduce_sum(red, grid.comms.dp);
        const double loss = red[0] / static_cast<double>(std::max<int64_t>(all_targets, 1));
        const double norm = std::sqrt(sum_of_squares(lm.tensors(0, true)));
        // the guard: a non-finite loss or gradient, or a loss spike, names the step, layer, rank
        const int bad_layer = nonfinite_layer(lm);
        const int64_t worst = comm::all_reduce_value(
            bad_layer < 0 ? INT64_MAX : int64_t{bad_layer} * grid.layout.world() + grid.rank,
            grid.comms.world,
            comm::ReduceOp::min);
        double mean_recent = 0;
        for (double r : recent)
            mean_recent += r / static_cast<double>(recent.size());
        const bool spike =
            ft.loss_spike > 0 && recent.size() >= 5 && loss > ft.loss_spike * mean_recent;
        const bool bad = !std::isfinite(loss) || worst != INT64_MAX || spike;
        if (bad) {
            const std::string what = spike                ? cat("loss ",
                                                 loss,
                                                 " is above ",
                                                 ft.loss_spike,
                                                 " × the recent mean ",
                                                 mean_recent)
                                     : worst != INT64_MAX ? cat("a non-finite gradient in layer ",
                                                                worst / grid.layout.world(),
                                                                " on rank ",
                                                                worst % grid.layout.world())
                                                          : cat("a non-finite loss (", loss, ")");
            if (ft.on_nonfinite == "stop")
                HYMOE_FAIL(Exit::bad_input,
                           "step ",
                           step + 1,
                           ": ",
                           what,
                           " (finetune.on_nonfinite: stop; the last checkpoint is kept)");
            log::info(cat("warning: step ",
                          step + 1,
                          ": ",
                          what,
                          "; batch skipped (finetune.on_nonfinite: skip)"));
        } else {
            recent.push_back(loss);
            if (recent.size() > 20)
                recent.erase(recent.begin());
            const double clip = ft.optimizer.grad_clip > 0
                                    ? std::min(1.0, ft.optimizer.grad_clip / (norm + 1e-6))
                                    : 1.0;
            opt.step(learning_rate(ft.optimizer, step, ft.steps), clip, step + 1);
        }
        // monitoring: expert load (shares, summed over dp) and routing drift on the probe
        std::vector<double> shares(static_cast<size_t>(L * E));
        for (int64_t l = 0; l < L; ++l)
            for (int64_t e = 0; e < E && !load[hist.moe_layers[l]].empty(); ++e)
                shares[l * E + e] = static_cast<double>(load[hist.moe_layers[l]][e]);
        comm::all_reduce_sum(shares, grid.comms.dp);
        for (int64_t l = 0; l < L; ++l) {
            double s = 0;
            for (int64_t e = 0; e < E; ++e)
                s += shares[l * E + e];
            for (int64_t e = 0; e < E && s > 0; ++e)
                shares[l * E + e] /= s;
        }
        std::vector<double> ov(static_cast<size_t>(L)), kl(static_cast<size_t>(L));
        if (L > 0)
            drift(base_dist,
                  model::router_distributions(m, probe_batch),
                  hist.moe_layers,
                  job.model.moe.top_k,
                  ov.data(),
                  kl.data());
        const double seconds = wall_seconds() - ts;
        const double lr = learning_rate(ft.optimizer, step, ft.steps);
        hist.step.push_back(static_cast<double>(step + 1));
        hist.loss.push_back(loss), hist.lr.push_back(lr), hist.grad_norm.push_back(norm);
        hist.tokens.push_back(all_tokens), hist.seconds.push_back(seconds);
        hist.tokens_per_s.push_back(all_tokens / seconds);
        hist.skipped.push_back(bad ? 1 : 0);
        hist.load.insert(hist.load.end(), shares.begin(), shares.end());
        hist.overlap.insert(hist.overlap.end(), ov.begin(), ov.end());
        hist.kl.insert(hist.kl.end(), kl.begin(), kl.end());
        log::info(cat("step ",
                      step + 1,
                      "/",
                      ft.steps,
                      ": loss ",
                      fixed(loss, 4),
                      ", lr ",
                      sci(lr),
                      ", grad norm ",
                      fixed(norm, 4),
                      ", ",
                      fixed(all_tokens / seconds, 1),
                      " tokens/s",
                      L > 0 ? cat(", router top-k overlap ",
                                  fixed(ov[0], 3),
                                  " (layer ",
                                  hist.moe_layers[0],
                                  ")")
                            : ""));
        const bool last = step + 1 == ft.steps;
        if (ft.eval_every > 0 && ((step + 1) % ft.eval_every == 0 || last))
            run_eval(step + 1);
        const bool stopping =
            comm::all_reduce_value(
                stop_signal() != 0 || (max_seconds > 0 && wall_seconds() - t0 >= max_seconds),
                grid.comms.world,
                comm::ReduceOp::max) != 0;
        if ((ft.checkpoint_every > 0 && (step + 1) % ft.checkpoint_every == 0) ||
            (stopping && !last))
            save(step + 1);
        if (stopping && !last) {
            log::info(cat("stopped after step ",
                          step + 1,
                          " (",
                          stop_signal() ? signal_name(stop_signal()) : "job.max_hours",
                          "): rerun the same deck to resume (exit 75)"));
            return static_cast<int>(Exit::stopped);
        }
    }
    if (ft.checkpoint_every == 0 || ft.steps % ft.checkpoint_every != 0)
        save(ft.steps);
    const io::RunMeta meta{&job.deck, job.layout, model::describe(job.model), log::utc_timestamp()};
    export_adapters(job, m, lm, grid);
    if (grid.rank == 0)
        hist.write(job.deck.job.output + "/results.h5", meta);
    comm::barrier(grid.comms.world);
    log::info(cat("done: ",
                  ft.steps,
                  " steps in ",
                  fixed(wall_seconds() - t0, 1),
                  " s; adapters in ",
                  job.deck.job.output,
                  "/adapters/final"));
    return 0;
}

}  // namespace hymoe::runtime
