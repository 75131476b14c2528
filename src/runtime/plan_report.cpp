// The plan as people read it (the log: per-rank tables like LAMMPS' memory and timing summaries)
// and as programs read it (plan.h5: /plan/... and /search/..., every dataset with a "units" attr).
#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <string>
#include <vector>

#include "hymoe/core/error.h"
#include "hymoe/io/h5.h"
#include "hymoe/runtime/plan.h"

namespace hymoe::runtime {

namespace {

using i64 = int64_t;

std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* f, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, f);
    std::vsnprintf(buf, sizeof buf, f, ap);
    va_end(ap);
    return buf;
}

// Memory and data volumes are reported in GiB / MiB (2^30 / 2^20 bytes) everywhere, in the log,
// plan.h5's attributes and the analysis plots; rates and hardware.gpu_memory_gb keep the vendors'
// decimal GB (10^9 bytes).
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string count(double n) {
    if (n >= 1e12)
        return fmt("%.3fT", n / 1e12);
    if (n >= 1e9)
        return fmt("%.2fB", n / 1e9);
    if (n >= 1e6)
        return fmt("%.2fM", n / 1e6);
    if (n >= 1e3)
        return fmt("%.2fK", n / 1e3);
    return fmt("%.0f", n);
}

// "172.7 GFLOP"
std::string flop(double n) {
    const char* prefix[] = {"", "k", "M", "G", "T", "P", "E"};
    int i = 0;
    while (n >= 1000 && i < 6) {
        n /= 1000;
        ++i;
    }
    return fmt("%.1f %sFLOP", n, prefix[i]);
}

const char* kTimeModel =
    "time model: per stage and micro-batch t = max(compute, hbm) + tp + ep + pp; compute = "
    "FLOPs / tflops, hbm = (weights read + KV/state traffic) / hbm_tb_s, each collective = its "
    "bytes / NVLink inside a node or InfiniBand (ib_gbit_s x ib_links / 8 / gpus_per_node per "
    "GPU) across nodes; prefill chunks and decode micro-batches stream through the stages; "
    "training = (grad_accum + pp - 1) x (forward + backward) + dp all-reduce; peak rates, no "
    "overlap: a lower bound";

const char* step_name(int i) {
    static const char* names[] = {"prefill chunk", "decode step", "training step"};
    return names[i];
}

// Stages in columns: runs of consecutive stages with the same numbers share one.
struct Column {
    int first = 0, last = 0;
    std::string name() const {
        return first == last ? fmt("stage %d", first) : fmt("stages %d-%d", first, last);
    }
};

bool same(const StagePlan& a, const StagePlan& b) {
    const StageMemory &x = a.mem, &y = b.mem;
    return a.params == b.params && x.kv_cache == y.kv_cache && x.kda_state == y.kda_state &&
           x.act_prefill == y.act_prefill && x.act_decode == y.act_decode &&
           x.act_train == y.act_train && x.act_train_recompute == y.act_train_recompute &&
           x.lora == y.lora && x.peak == y.peak;
}

std::vector<Column> columns(const Plan& p) {
    std::vector<Column> all;
    for (const StagePlan& s : p.stages) {
        if (!all.empty() && same(p.stages[all.back().last], s))
            all.back().last = s.stage;
        else
            all.push_back({s.stage, s.stage});
    }
    if (all.size() <= 6)
        return all;
    // Too many: the first, the fullest and the last column.
    size_t full = 0;
    for (size_t i = 0; i < all.size(); ++i)
        if (p.stages[all[i].first].mem.peak > p.stages[all[full].first].mem.peak)
            full = i;
    std::vector<Column> some{all.front()};
    if (full != 0 && full + 1 != all.size())
        some.push_back(all[full]);
    some.push_back(all.back());
    return some;
}

std::string table_row(const std::string& label, const std::vector<std::string>& cells) {
    std::string s = fmt("  %-40s", label.c_str());
    for (const std::string& c : cells)
        s += fmt(" %12s", c.c_str());
    return s + "\n";
}

// The deck's name of a dtype.
const char* dtype_name(DType t) {
    return t == DType::bf16 ? "bf16" : t == DType::f16 ? "fp16" : "fp32";
}

std::string layout_text(const parallel::Layout& l) {
    return fmt("tp %d x pp %d x dp %d (experts: etp %d x ep %d x edp %d)",
               l.tp,
               l.pp,
               l.dp,
               l.etp,
               l.ep,
               l.edp());
}

std::string memory_table(const Plan& p) {
    const std::vector<Column> cols = columns(p);
    const PlanWorkload& w = p.work;
    std::vector<std::string> head;
    for (const Column& c : cols)
        head.push_back(c.name());
    double weights = 0;  // the unit: GiB, or MiB for models under 1 GiB a rank
    for (const StagePlan& st : p.stages)
        weights = std::max(weights, st.mem.weights);
    const double unit = weights < kGiB ? kGiB / 1024 : kGiB;
    std::string s =
        table_row(unit == kGiB ? "memory per rank (GiB)" : "memory per rank (MiB)", head);
    auto row = [&](const std::string& label, auto get) {
        std::vector<std::string> cells;
        for (const Column& c : cols) {
            const double v = get(p.stages[c.first]);
            cells.push_back(v == 0 ? std::string("-") : fmt("%.2f", v / unit));
        }
        s += table_row(label, cells);
    };
    const double b = static_cast<double>(dtype_size(w.dtype));
    for (int i = 0; i < kPlanBlocks; ++i) {
        bool any = false;
        for (const StagePlan& st : p.stages)
            any = any || st.params[i] != 0;
        if (any)
            row(std::string("weights: ") + to_string(static_cast<PlanBlock>(i)),
                [&](const StagePlan& st) { return static_cast<double>(st.params[i]) * b; });
    }
    row(std::string("weights (") + dtype_name(w.dtype) + ")",
        [](const StagePlan& st) { return st.mem.weights; });
    if (w.inference) {
        row("KV pages (latent, rope, index keys)",
            [](const StagePlan& st) { return st.mem.kv_cache; });
        if (w.offload != "none")
            row("KV pages offloaded (" + w.offload + ", not in total)",
                [](const StagePlan& st) { return st.mem.kv_host; });
        row("KDA states (fp32)", [](const StagePlan& st) { return st.mem.kda_state; });
        row("activations: prefill chunk", [](const StagePlan& st) { return st.mem.act_prefill; });
        row("activations: decode step", [](const StagePlan& st) { return st.mem.act_decode; });
    }
    if (w.training) {
        row(std::string("activations: training") + (w.recompute ? "" : " (deck)"),
            [](const StagePlan& st) { return st.mem.act_train; });
        row(std::string("activations: recompute") + (w.recompute ? " (deck)" : ""),
            [](const StagePlan& st) { return st.mem.act_train_recompute; });
        row("LoRA A/B (fp32)", [](const StagePlan& st) { return st.mem.lora; });
        row("LoRA gradients (fp32)", [](const StagePlan& st) { return st.mem.lora_grads; });
        row("AdamW m, v (fp32)", [](const StagePlan& st) { return st.mem.adam; });
    }
    row("runtime reserve", [](const StagePlan& st) { return st.mem.reserve; });
    if (w.inference)
        row("inference total", [](const StagePlan& st) { return st.mem.inference; });
    if (w.training)
        row("training total", [](const StagePlan& st) { return st.mem.training; });
    row("peak", [](const StagePlan& st) { return st.mem.peak; });
    int full = 0;
    for (const StagePlan& st : p.stages)
        if (st.mem.peak > p.stages[full].mem.peak)
            full = st.stage;
    if (p.fits) {
        s +=
            fmt("  GPU memory %.1f GiB (hardware.gpu_memory_gb %g GB): fits; headroom %.1f GiB on "
                "the fullest rank (stage %d)",
                p.capacity_bytes / kGiB,
                p.hw.gpu_memory_gb,
                (p.capacity_bytes - p.peak_bytes) / kGiB,
                full);
        if (w.inference && p.spare_pages > 0)
            s += fmt(", room for %lld more KV pages", static_cast<long long>(p.spare_pages));
        s += "\n";
    } else {
        s +=
            fmt("  GPU memory %.1f GiB (hardware.gpu_memory_gb %g GB): does NOT fit: %.1f GiB > "
                "%.1f GiB on stage %d\n",
                p.capacity_bytes / kGiB,
                p.hw.gpu_memory_gb,
                p.peak_bytes / kGiB,
                p.capacity_bytes / kGiB,
                full);
    }
    return s;
}

std::vector<const StepPlan*> steps(const Plan& p) {
    std::vector<const StepPlan*> v;
    v.push_back(p.work.inference ? &p.prefill : nullptr);
    v.push_back(p.work.inference ? &p.decode : nullptr);
    v.push_back(p.work.training ? &p.train : nullptr);
    return v;
}

std::string comm_table(const Plan& p) {
    std::vector<const StepPlan*> st = steps(p);
    std::vector<std::string> head;
    for (int i = 0; i < 3; ++i)
        if (st[i])
            head.push_back(step_name(i));
    std::string s = table_row("comm per rank, slowest stage (MiB)", head);
    for (PlanPhase ph : {PlanPhase::tp, PlanPhase::ep, PlanPhase::pp, PlanPhase::dp}) {
        std::vector<std::string> cells;
        for (int i = 0; i < 3; ++i)
            if (st[i])
                cells.push_back(
                    fmt("%.2f", st[i]->comm_bytes[static_cast<size_t>(ph)] / (kGiB / 1024)));
        s += table_row(to_string(ph), cells);
    }
    return s;
}

std::string time_table(const Plan& p) {
    std::vector<const StepPlan*> st = steps(p);
    std::string s = fmt("  %-16s %9s %9s %9s %9s %9s %9s %9s %10s  %s\n",
                        "time per step",
                        "tokens",
                        "TFLOP",
                        "compute",
                        "hbm",
                        "tp",
                        "ep",
                        "pp",
                        "dp",
                        "step (ms), dominant");
    for (int i = 0; i < 3; ++i) {
        if (!st[i])
            continue;
        const StepPlan& c = *st[i];
        s += fmt(
            "  %-16s %9lld %9.2f", step_name(i), static_cast<long long>(c.tokens), c.flops / 1e12);
        for (double v : c.seconds)
            s += fmt(" %9.3f", v * 1e3);
        s += fmt(" %10.3f  %s\n", c.total * 1e3, to_string(c.dominant));
    }
    return s;
}

std::string workload_text(const Plan& p) {
    const PlanWorkload& w = p.work;
    std::string s;
    if (w.inference)
        s +=
            fmt("  inference per dp replica: %lld sequences; prompt budget %lld "
                "(inference.batch.max_tokens) + %lld new tokens = context %lld; prefill chunks "
                "of %lld; KV %lld pages x %lld tokens (%s)%s\n",
                static_cast<long long>(w.seqs),
                static_cast<long long>(w.prompt),
                static_cast<long long>(w.new_tokens),
                static_cast<long long>(w.context),
                static_cast<long long>(std::min(w.chunk, w.prompt)),
                static_cast<long long>(w.pages),
                static_cast<long long>(w.page_tokens),
                w.pages_auto ? "auto: every sequence at full context" : "kv_cache.pages",
                w.offload == "none" ? "" : (", offload " + w.offload).c_str());
    if (w.training)
        s +=
            fmt("  training per dp replica: micro-batches of %lld x %lld tokens, %lld per step, "
                "recompute %s, LoRA rank %d (1F1B pipeline)\n",
                static_cast<long long>(w.micro_batch),
                static_cast<long long>(w.seq_len),
                static_cast<long long>(w.grad_accum),
                w.recompute ? "on" : "off",
                w.lora_rank);
    return s;
}

}  // namespace

std::string plan_report(const Plan& p, const std::string& title) {
    const parallel::Layout& l = p.layout;
    const int world = l.world(), gpn = p.hw.gpus_per_node;
    std::string s = fmt("plan %s: %s on %d GPU%s (%d node%s of %d)\n",
                        title.c_str(),
                        layout_text(l).c_str(),
                        world,
                        world == 1 ? "" : "s",
                        (world + gpn - 1) / gpn,
                        (world + gpn - 1) / gpn == 1 ? "" : "s",
                        gpn);
    s += "  every rank of a pipeline stage has the same plan (tp slices are equal, dp replicas are "
         "copies, each ep rank hosts the same number of experts); columns are stages, equal "
         "stages merged\n";
    s += workload_text(p);
    s += fmt("  parameters %s total, %s active per token; forward ",
             count(static_cast<double>(p.total_params)).c_str(),
             count(static_cast<double>(p.active_params)).c_str());
    if (p.work.inference)
        s += fmt("%s per token (prefill, context %lld), %s (decode, context %lld)",
                 flop(p.flops_per_token_prefill).c_str(),
                 static_cast<long long>(p.prefill.context),
                 flop(p.flops_per_token_decode).c_str(),
                 static_cast<long long>(p.decode.context));
    if (p.work.inference && p.work.training)
        s += ", ";
    if (p.work.training)
        s += fmt("%s per token (training, context %lld)",
                 flop(p.flops_per_token_train).c_str(),
                 static_cast<long long>(p.train.context));
    if (!p.work.inference && !p.work.training)
        s += "not planned (no inference or finetune workload)";
    s += fmt("; a token's experts reach %.2f of %d ep ranks\n", p.experts_reached, l.ep);
    s += memory_table(p);
    s += comm_table(p);
    s += time_table(p);
    if (p.work.inference && !p.work.training_primary)
        s +=
            fmt("  inference batch (prefill of the prompts + %lld decode steps): %.2f s per dp "
                "replica, %.0f tokens/s over the job; dominated by %s\n",
                static_cast<long long>(p.work.new_tokens),
                p.batch_seconds,
                p.seconds_per_token > 0 ? 1.0 / p.seconds_per_token : 0.0,
                to_string(p.dominant));
    else if (p.work.training)
        s += fmt("  training: %.2f s per step, %.0f tokens/s over the job; dominated by %s\n",
                 p.train.total,
                 p.seconds_per_token > 0 ? 1.0 / p.seconds_per_token : 0.0,
                 to_string(p.dominant));
    s += std::string("  ") + kTimeModel + "\n";
    return s;
}

std::string search_report(const LayoutSearch& sr, size_t top) {
    const size_t total = sr.fitting.size() + sr.rejected.size();
    std::string s =
        fmt("layout search: %d GPUs, %zu layouts: %zu fit, %zu rejected; ranked by "
            "time per token over the job\n",
            sr.gpus,
            total,
            sr.fitting.size(),
            sr.rejected.size());
    s += fmt("  %4s %4s %4s %4s %4s %4s %4s %8s %11s %11s %11s %12s  %s\n",
             "rank",
             "tp",
             "pp",
             "dp",
             "ep",
             "etp",
             "edp",
             "GiB/GPU",
             "prefill ms",
             "decode ms",
             "train ms",
             "tokens/s",
             "dominant");
    for (size_t i = 0; i < sr.fitting.size() && i < top; ++i) {
        const LayoutCandidate& c = sr.fitting[i];
        const parallel::Layout& l = c.layout;
        auto ms = [](double t) { return t > 0 ? fmt("%.3f", t * 1e3) : std::string("-"); };
        s += fmt("  %4zu %4d %4d %4d %4d %4d %4d %8.1f %11s %11s %11s %12.0f  %s\n",
                 i + 1,
                 l.tp,
                 l.pp,
                 l.dp,
                 l.ep,
                 l.etp,
                 l.edp(),
                 c.peak_bytes / kGiB,
                 ms(c.prefill_seconds).c_str(),
                 ms(c.decode_seconds).c_str(),
                 ms(c.train_seconds).c_str(),
                 c.seconds_per_token > 0 ? 1.0 / c.seconds_per_token : 0.0,
                 to_string(c.dominant));
    }
    if (sr.fitting.empty())
        s += "  no layout fits\n";
    if (!sr.reasons.empty())
        s += "  rejected, by binding constraint (count, rule, first example):\n";
    for (const auto& [rule, n] : sr.reasons) {
        const LayoutCandidate* ex = nullptr;
        for (const LayoutCandidate& c : sr.rejected)
            if (c.rule == rule) {
                ex = &c;
                break;
            }
        s += fmt("  %6d  %-44s tp %d pp %d dp %d ep %d etp %d: %s\n",
                 n,
                 rule.c_str(),
                 ex->layout.tp,
                 ex->layout.pp,
                 ex->layout.dp,
                 ex->layout.ep,
                 ex->layout.etp,
                 ex->reason.c_str());
    }
    return s;
}

std::string job_plan_report(const JobPlan& jp) {
    std::string s = plan_report(jp.plan, "at the deck's layout");
    if (jp.search) {
        s += search_report(*jp.search);
        if (jp.search->best)
            s += plan_report(*jp.search->best, "of the best layout found");
    }
    return s;
}

// ---- plan.h5 ------------------------------------------------------------------------------------

namespace {

void ints(io::H5Writer& f,
          const std::string& name,
          const std::vector<i64>& v,
          Shape shape,
          const std::string& units) {
    Buffer buf(DType::i64, shape);
    std::copy(v.begin(), v.end(), buf.ptr<int64_t>());
    f.array(name, buf.view());
    f.attr(name, "units", units);
}

void floats(io::H5Writer& f,
            const std::string& name,
            const std::vector<double>& v,
            Shape shape,
            const std::string& units) {
    Buffer buf(DType::f32, shape);
    for (size_t i = 0; i < v.size(); ++i)
        buf.ptr<float>()[i] = static_cast<float>(v[i]);
    f.array(name, buf.view());
    f.attr(name, "units", units);
}

i64 whole(double bytes) {
    return static_cast<i64>(bytes + 0.5);
}

const std::vector<std::string> kMemoryItems = {"weights",
                                               "kv_cache",
                                               "kv_host",
                                               "kda_state",
                                               "act_prefill",
                                               "act_decode",
                                               "act_train",
                                               "act_train_recompute",
                                               "lora",
                                               "lora_grads",
                                               "adam",
                                               "reserve",
                                               "inference",
                                               "training",
                                               "peak"};

std::vector<double> memory_values(const StageMemory& m) {
    return {m.weights,
            m.kv_cache,
            m.kv_host,
            m.kda_state,
            m.act_prefill,
            m.act_decode,
            m.act_train,
            m.act_train_recompute,
            m.lora,
            m.lora_grads,
            m.adam,
            m.reserve,
            m.inference,
            m.training,
            m.peak};
}

void write_plan(io::H5Writer& f, const std::string& g, const Plan& p) {
    const i64 pp = static_cast<i64>(p.stages.size());
    const double b = static_cast<double>(dtype_size(p.work.dtype));
    std::vector<std::string> blocks, phases;
    for (int i = 0; i < kPlanBlocks; ++i)
        blocks.push_back(to_string(static_cast<PlanBlock>(i)));
    for (int i = 0; i < kPlanPhases; ++i)
        phases.push_back(to_string(static_cast<PlanPhase>(i)));
    const parallel::Layout& l = p.layout;
    ints(f, g + "/layout", {l.tp, l.dp, l.pp, l.ep, l.etp, l.edp()}, {6}, "ranks");
    f.attr(g + "/layout", "columns", "tp dp pp ep etp edp");
    f.strings(g + "/blocks", blocks);
    std::vector<i64> model, params, bytes, stages, memory;
    for (i64 n : p.model_params)
        model.push_back(n);
    ints(f, g + "/model_params", model, {kPlanBlocks}, "parameters (each weight once)");
    for (const StagePlan& s : p.stages) {
        stages.insert(stages.end(),
                      {s.first_layer, s.n_layer, s.n_kda, s.n_mla, s.n_dsa, s.n_dense, s.n_moe});
        for (i64 n : s.params) {
            params.push_back(n);
            bytes.push_back(whole(static_cast<double>(n) * b));
        }
        for (double v : memory_values(s.mem))
            memory.push_back(whole(v));
    }
    ints(f, g + "/stages", stages, {pp, 7}, "layers");
    f.attr(g + "/stages", "columns", "first_layer n_layer n_kda n_mla n_dsa n_dense n_moe");
    ints(f, g + "/params", params, {pp, kPlanBlocks}, "parameters per rank");
    f.attr(g + "/params", "columns", "/blocks; rows: pipeline stages");
    ints(f, g + "/weight_bytes", bytes, {pp, kPlanBlocks}, "bytes per rank");
    f.attr(g + "/weight_bytes", "dtype", to_string(p.work.dtype));
    f.strings(g + "/memory_items", kMemoryItems);
    ints(f,
         g + "/memory_bytes",
         memory,
         {pp, static_cast<i64>(kMemoryItems.size())},
         "bytes per rank");
    f.attr(g + "/memory_bytes", "columns", "/memory_items; rows: pipeline stages");
    f.strings(g + "/steps", {"prefill", "decode", "train"});
    f.strings(g + "/phases", phases);
    std::vector<double> seconds, comm, flops, hbm, total;
    std::vector<i64> tokens;
    for (const StepPlan* c : {&p.prefill, &p.decode, &p.train}) {
        seconds.insert(seconds.end(), c->seconds.begin(), c->seconds.end());
        comm.insert(comm.end(), c->comm_bytes.begin(), c->comm_bytes.end());
        flops.push_back(c->flops);
        hbm.push_back(c->hbm_bytes);
        total.push_back(c->total);
        tokens.push_back(c->tokens);
    }
    floats(f, g + "/step_seconds", seconds, {3, kPlanPhases}, "s");
    f.attr(g + "/step_seconds", "columns", "/phases; rows: /steps (zeros: not planned)");
    floats(f, g + "/step_comm_bytes", comm, {3, kPlanPhases}, "bytes sent per rank");
    floats(f, g + "/step_flops", flops, {3}, "FLOP per rank");
    floats(f, g + "/step_hbm_bytes", hbm, {3}, "bytes per rank");
    floats(f, g + "/step_total_seconds", total, {3}, "s");
    ints(f, g + "/step_tokens", tokens, {3}, "tokens per dp replica");
    ints(f, g + "/total_params", {p.total_params}, {1}, "parameters");
    ints(f, g + "/active_params", {p.active_params}, {1}, "parameters per token");
    floats(f,
           g + "/flops_per_token",
           {p.flops_per_token_prefill, p.flops_per_token_decode, p.flops_per_token_train},
           {3},
           "FLOP per token (forward, whole model; at the prefill, decode, training contexts of "
           "/step_contexts)");
    ints(f,
         g + "/step_contexts",
         {p.prefill.context, p.decode.context, p.train.context},
         {3},
         "tokens (average attention context of the step; 0: not planned)");
    ints(f, g + "/peak_bytes", {whole(p.peak_bytes)}, {1}, "bytes per rank");
    ints(f, g + "/capacity_bytes", {whole(p.capacity_bytes)}, {1}, "bytes per GPU");
    ints(f, g + "/fits", {p.fits ? 1 : 0}, {1}, "boolean");
    floats(f, g + "/seconds_per_token", {p.seconds_per_token}, {1}, "s per token over the job");
    floats(f, g + "/batch_seconds", {p.batch_seconds}, {1}, "s (inference batch per dp replica)");
    f.text(g + "/dominant", to_string(p.dominant));
    f.text(g + "/time_model", kTimeModel);
}

void write_search(io::H5Writer& f, const LayoutSearch& sr) {
    std::vector<const LayoutCandidate*> all;
    for (const LayoutCandidate& c : sr.fitting)
        all.push_back(&c);
    for (const LayoutCandidate& c : sr.rejected)
        all.push_back(&c);
    const i64 n = static_cast<i64>(all.size());
    ints(f, "/search/gpus", {sr.gpus}, {1}, "GPUs");
    if (n == 0)
        return;
    std::vector<i64> layouts, fits, peak;
    std::vector<double> spt, pre, dec, tr;
    std::vector<std::string> reason, dominant;
    for (const LayoutCandidate* c : all) {
        const parallel::Layout& l = c->layout;
        layouts.insert(layouts.end(), {l.tp, l.dp, l.pp, l.ep, l.etp, l.edp()});
        fits.push_back(c->fits ? 1 : 0);
        peak.push_back(whole(c->peak_bytes));
        spt.push_back(c->seconds_per_token);
        pre.push_back(c->prefill_seconds);
        dec.push_back(c->decode_seconds);
        tr.push_back(c->train_seconds);
        reason.push_back(c->reason);
        dominant.push_back(c->peak_bytes > 0 ? to_string(c->dominant) : "");
    }
    ints(f, "/search/layouts", layouts, {n, 6}, "ranks");
    f.attr("/search/layouts",
           "columns",
           "tp dp pp ep etp edp; rows: fitting layouts best first, then the rejected ones");
    ints(f, "/search/fits", fits, {n}, "boolean");
    ints(f, "/search/peak_bytes", peak, {n}, "bytes per rank (0: rejected by a rule)");
    floats(f, "/search/seconds_per_token", spt, {n}, "s per token over the job");
    floats(f, "/search/prefill_seconds", pre, {n}, "s");
    floats(f, "/search/decode_seconds", dec, {n}, "s");
    floats(f, "/search/train_seconds", tr, {n}, "s");
    f.strings("/search/reason", reason);
    f.strings("/search/dominant", dominant);
    if (!sr.reasons.empty()) {
        std::vector<std::string> rules;
        std::vector<i64> counts;
        for (const auto& [rule, k] : sr.reasons) {
            rules.push_back(rule);
            counts.push_back(k);
        }
        f.strings("/search/rules", rules);
        ints(f, "/search/rule_counts", counts, {static_cast<i64>(counts.size())}, "layouts");
    }
    if (sr.best)
        write_plan(f, "/search/best", *sr.best);
}

}  // namespace

void write_job_plan(io::H5Writer& file, const JobPlan& jp) {
    write_plan(file, "/plan", jp.plan);
    if (jp.search)
        write_search(file, *jp.search);
}

}  // namespace hymoe::runtime
