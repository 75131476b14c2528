// job.device's decision without MPI or a GPU (runtime/device_choice.h): the limits a job meets
// in order (build, kind; every layout is taken; experts moved at ep > 1, adapters at ep >
// 1, offload, batch invariance; adapters at ep = 1 are no limit), and for each choice (cpu, auto,
// cuda) what a limit or a missing GPU does: cuda is Exit::invalid with the one sentence naming
// job.device's place in the deck, auto is the CPU with the log line, cpu says nothing; and
// job.device_memory (0.9 unless given) split evenly among the ranks sharing a GPU (arena_share;
// tests/mpi/test_device_share.cpp gathers the sharers).
#include <optional>
#include <string>

#include <boost/test/unit_test.hpp>

#include "hymoe/core/error.h"
#include "hymoe/model/config.h"
#include "hymoe/runtime/device_choice.h"

namespace rt = hymoe::runtime;

namespace {

// A job from deck text whose paths resolve from inputs/ (the quickstart prompts are there).
rt::Job job_of(const std::string& text) {
    rt::Job job;
    job.deck = hymoe::deck::parse_deck(text, "inputs/device.yaml", {});
    const auto& p = job.deck.parallel;
    job.layout = hymoe::parallel::Layout{p.tp, p.dp, p.pp, p.ep, p.etp};
    job.model = hymoe::model::preset_config("tiny");  // the decks' model: KDA, MLA, MoE
    return job;
}

std::string infer_deck(const std::string& device, const std::string& extra = "") {
    return "job: {kind: infer, device: " + device +
           "}\n"
           "model: {preset: tiny, init: random}\n"
           "inference: {dataset: data/quickstart.jsonl" +
           extra + "}\n";
}

// The message of decide_device's error (and that it is a collective Exit::invalid).
std::string refusal(const rt::Job& job, const std::optional<std::string>& limit, bool gpus) {
    try {
        rt::decide_device(job.deck, limit, gpus);
    } catch (const hymoe::Error& e) {
        BOOST_TEST((e.code() == hymoe::Exit::invalid));
        BOOST_TEST((e.scope() == hymoe::Scope::collective));
        return e.what();
    }
    return "no error";
}

}  // namespace

BOOST_AUTO_TEST_SUITE(device_choice)

BOOST_AUTO_TEST_CASE(limits_in_order) {
    const rt::Job plain = job_of(infer_deck("cuda"));
    BOOST_TEST(rt::device_limit(plain, false).value() ==
               "this hymoe was built without CUDA (make CUDA=1 builds it)");
    BOOST_TEST(!rt::device_limit(plain, true).has_value());
    rt::Job dp = plain;  // dp replicas each hold the whole model: allowed
    dp.layout.dp = 4;
    BOOST_TEST(!rt::device_limit(dp, true).has_value());

    rt::Job tp = plain;  // every layout the CPU runs: tp, pp, ep (over tp and dp), etp
    tp.layout.tp = 2;
    BOOST_TEST(!rt::device_limit(tp, true).has_value());
    BOOST_TEST(rt::device_limit(tp, false).value().starts_with("this hymoe was built without"));
    rt::Job ep = plain;
    ep.layout.dp = 4;
    ep.layout.ep = 4;
    BOOST_TEST(!rt::device_limit(ep, true).has_value());
    rt::Job folded = ep;  // ep groups folded over tp and dp, experts cut over etp
    folded.layout = hymoe::parallel::Layout{2, 2, 2, 2, 2};
    BOOST_TEST(!rt::device_limit(folded, true).has_value());
    rt::Job moving = ep;  // experts moved by the rebalancer, on the GPU's model too
    moving.deck.parallel.rebalance_every = 16;
    BOOST_TEST(!rt::device_limit(moving, true).has_value());

    rt::Job lora = plain;  // the GPU trainer, adapter dropout included
    lora.deck.job.kind = hymoe::deck::JobKind::lora;
    lora.deck.finetune.lora.dropout = 0.05;
    BOOST_TEST(!rt::device_limit(lora, true).has_value());
    rt::Job convert = plain;
    convert.deck.job.kind = hymoe::deck::JobKind::convert;
    BOOST_TEST(rt::device_limit(convert, true).value() ==
               "convert jobs run on the CPU only (the GPU runs infer and lora jobs)");

    rt::Job adapters = plain;  // the GPU model runs them
    adapters.deck.inference.adapters["legal"] = "somewhere";
    BOOST_TEST(!rt::device_limit(adapters, true).has_value());
    BOOST_TEST(
        rt::device_limit(adapters, false).value().starts_with("this hymoe was built without"));
    rt::Job adapters_ep = adapters;  // and at ep > 1, on the hosted experts
    adapters_ep.layout.dp = 2;
    adapters_ep.layout.ep = 2;
    BOOST_TEST(!rt::device_limit(adapters_ep, true).has_value());
    const rt::Job offload = job_of(infer_deck("cuda", ", kv_cache: {offload: file}"));
    BOOST_TEST(!rt::device_limit(offload, true).has_value());  // the host tier over the file
    const rt::Job host = job_of(infer_deck("cuda", ", kv_cache: {offload: host}"));
    BOOST_TEST(!rt::device_limit(host, true).has_value());  // the GPU's host tier
    BOOST_TEST(rt::device_limit(host, false).value().starts_with("this hymoe was built without"));
    const rt::Job cached = job_of(infer_deck("cuda", ", prefix_cache: {enabled: true}"));
    BOOST_TEST(!rt::device_limit(cached, true).has_value());  // snapshots copied off the GPU
    const rt::Job invariant = job_of(infer_deck("cuda", ", batch_invariant: true"));
    BOOST_TEST(!rt::device_limit(invariant, true).has_value());  // the invariant GEMM
}

BOOST_AUTO_TEST_CASE(cuda_is_refused_in_one_sentence) {
    const rt::Job job = job_of(infer_deck("cuda"));
    BOOST_TEST(refusal(job, std::string("a reason"), true) ==
               "inputs/device.yaml:1:28: job.device: cuda, but a reason");
    BOOST_TEST(refusal(job, std::nullopt, false) ==
               "inputs/device.yaml:1:28: job.device: cuda, but not every rank sees a GPU (use "
               "auto to fall back to the CPU)");
    const rt::DeviceDecision ok = rt::decide_device(job.deck, std::nullopt, true);
    BOOST_TEST(ok.cuda);
}

BOOST_AUTO_TEST_CASE(auto_falls_back_with_a_line_and_cpu_stays_quiet) {
    const rt::Job job = job_of(infer_deck("auto"));
    rt::DeviceDecision d = rt::decide_device(job.deck, std::string("a reason"), true);
    BOOST_TEST(!d.cuda);
    BOOST_TEST(d.note == "job.device: auto runs on the CPU, because a reason");
    d = rt::decide_device(job.deck, std::nullopt, false);
    BOOST_TEST(!d.cuda);
    BOOST_TEST(d.note == "job.device: auto runs on the CPU, because not every rank sees a GPU");
    d = rt::decide_device(job.deck, std::nullopt, true);
    BOOST_TEST(d.cuda);

    const rt::Job cpu = job_of(infer_deck("cpu"));
    for (bool gpus : {false, true}) {
        d = rt::decide_device(cpu.deck, std::nullopt, gpus);
        BOOST_TEST(!d.cuda);
        BOOST_TEST(d.note.empty());
    }
    d = rt::decide_device(cpu.deck, std::string("a reason"), true);
    BOOST_TEST(!d.cuda);
    BOOST_TEST(d.note.empty());
}

BOOST_AUTO_TEST_CASE(device_memory_is_split_among_the_ranks_sharing_a_gpu) {
    BOOST_TEST(job_of(infer_deck("cuda")).deck.job.device_memory == 0.9);
    const rt::Job half = job_of(
        "job: {kind: infer, device: cuda, device_memory: 0.5}\n"
        "model: {preset: tiny, init: random}\n"
        "inference: {dataset: data/quickstart.jsonl}\n");
    BOOST_TEST(half.deck.job.device_memory == 0.5);
    const size_t free = 1000;
    BOOST_TEST(rt::arena_share(free, 0.9, 1) == 900u);
    BOOST_TEST(rt::arena_share(free, 0.9, 2) == 450u);  // two ranks on one GPU: half each
    BOOST_TEST(rt::arena_share(free, 1.0, 3) == 333u);  // three: never more than the whole
    BOOST_TEST(rt::arena_share(free, 0.5, 4) == 125u);
    BOOST_CHECK_THROW(rt::arena_share(free, 0.9, 0), hymoe::Error);
    BOOST_CHECK_THROW(rt::arena_share(free, 0.0, 1), hymoe::Error);
}

BOOST_AUTO_TEST_SUITE_END()
