// make bench: checkpoint write and read speed as ratios of the disk bandwidth measured in the
// same run (each rank writes the same bytes to a plain file sequentially and fsyncs it, then reads
// it back), and the time of a convert job on the mid preset (an HF folder of bf16 shards written
// first, one per layer, and kept in build/bench/mid-hf for the next run). Reports, asserts nothing.
// Run under mpirun; `--no-convert` skips part 2. Reads come from the page cache when the files fit
// in memory, for the plain file and the checkpoint alike.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <unistd.h>

#include <mpi.h>
#include <nlohmann/json.hpp>

#include "hymoe/core/error.h"
#include "hymoe/core/timer.h"
#include "hymoe/io/checkpoint.h"
#include "hymoe/io/safetensors.h"
#include "hymoe/model/model.h"
#include "hymoe/parallel/comms.h"
#include "hymoe/parallel/mpi_env.h"
#include "hymoe/runtime/run.h"

namespace fs = std::filesystem;
using namespace hymoe;

namespace {

// Best time of `reps` runs of f, the slowest rank deciding each run.
template <typename F>
double best_seconds(int reps, F&& f) {
    double best = 1e30;
    for (int i = 0; i < reps; ++i) {
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = wall_seconds();
        f();
        double t = wall_seconds() - t0;
        MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        best = std::min(best, t);
    }
    return best;
}

void plain_write(const std::string& path, const Tensor& t) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const char* p = static_cast<const char*>(t.data);
    for (size_t done = 0; done < t.bytes();) {
        const ssize_t w = ::write(fd, p + done, std::min<size_t>(t.bytes() - done, 16 << 20));
        HYMOE_CHECK(w > 0, "writing ", path);
        done += static_cast<size_t>(w);
    }
    ::fsync(fd);
    ::close(fd);
}

void plain_read(const std::string& path, Tensor& t) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    char* p = static_cast<char*>(t.data);
    for (size_t done = 0; done < t.bytes();) {
        const ssize_t r = ::read(fd, p + done, std::min<size_t>(t.bytes() - done, 16 << 20));
        HYMOE_CHECK(r > 0, "reading ", path);
        done += static_cast<size_t>(r);
    }
    ::close(fd);
}

// Rank 0: the mid preset as an HF folder, one bf16 shard per layer (and one for the rest), the
// values a cheap deterministic fill (the convert does not look at them).
// Kept between runs: written again only when the index is missing or the preset has changed.
void write_mid_folder(const std::string& dir) {
    const model::ModelConfig cfg = model::preset_config("mid");
    std::ifstream old(dir + "/config.json");
    const std::string old_cfg{std::istreambuf_iterator<char>(old), {}};
    if (old_cfg == model::to_json(cfg) && fs::exists(dir + "/model.safetensors.index.json"))
        return;
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::ofstream(dir + "/config.json") << model::to_json(cfg);
    model::Model m = model::make_model(cfg);
    model::TensorList all = model::model_tensors(m);
    nlohmann::json index = {{"weight_map", nlohmann::json::object()}};
    auto shard_of = [](const std::string& name) {
        const std::string p = "model.layers.";
        return name.rfind(p, 0) == 0
                   ? "layer-" + name.substr(p.size(), name.find('.', p.size()) - p.size())
                   : std::string("rest");
    };
    std::map<std::string, std::vector<model::TensorSpec*>> shards;
    for (model::TensorSpec& s : all)
        shards[shard_of(s.name)].push_back(&s);
    uint32_t x = 12345;
    for (auto& [shard, specs] : shards) {
        std::vector<std::pair<std::string, Tensor>> tensors;
        for (model::TensorSpec* s : specs) {
            *s->dest = Buffer(DType::f32, s->shape);
            float* v = s->dest->ptr<float>();
            for (int64_t i = 0; i < s->dest->view().numel(); ++i)
                x = x * 1664525u + 1013904223u, v[i] = static_cast<float>(x >> 8) * 1e-9f - 0.008f;
            tensors.emplace_back(s->name, s->dest->view());
            index["weight_map"][s->name] = shard + ".safetensors";
        }
        io::write_safetensors(dir + "/" + shard + ".safetensors", tensors, {}, DType::bf16);
        for (model::TensorSpec* s : specs)
            *s->dest = Buffer();
    }
    std::ofstream(dir + "/model.safetensors.index.json") << index.dump(1);
}

}  // namespace

int main(int argc, char** argv) {
    parallel::MpiEnv mpi(&argc, &argv);
    const int n = parallel::world_size(), rank = parallel::world_rank();
    const bool do_convert = !(argc > 1 && std::string(argv[1]) == "--no-convert");
    const std::string dir = "build/bench/checkpoint";
    try {
        auto grid = parallel::make_grid(parallel::Layout{n, 1, 1, 1, 1});
        const comm::Comm& world = grid.comms.world;
        if (rank == 0) {
            fs::remove_all(dir);
            fs::create_directories(dir);
        }
        MPI_Barrier(MPI_COMM_WORLD);

        // ---- 1. checkpoint write and read against plain sequential I/O of the same bytes
        const int64_t rows = 64 * 1024, cols = 1024;  // 256 MiB of f32 per rank
        Buffer w(DType::f32, {rows, cols}), back(DType::f32, {rows, cols});
        for (int64_t i = 0; i < rows * cols; ++i)
            w.ptr<float>()[i] = static_cast<float>(i % 1000) + static_cast<float>(rank);
        const double bytes = static_cast<double>(w.view().bytes()) * n;
        const std::string plain = dir + "/plain_" + std::to_string(rank) + ".bin";
        const double t_pw = best_seconds(3, [&] { plain_write(plain, w.view()); });
        const double t_pr = best_seconds(3, [&] { plain_read(plain, back.view()); });
        fs::remove(plain);
        std::vector<io::CkptEntry> entries = {{"w", w.view(), 0, rank * rows, n * rows, true, ""}};
        int64_t step = 0;
        const double t_cw = best_seconds(
            3, [&] { io::save_checkpoint(world, dir + "/ckpt", ++step, entries, "{}", 1); });
        std::vector<io::CkptEntry> into = {{"w", back.view(), 0, rank * rows, n * rows, true, ""}};
        std::string state;
        const std::string latest = io::latest_checkpoint(dir + "/ckpt");
        const double t_cr =
            best_seconds(3, [&] { io::load_checkpoint(world, latest, into, state); });
        HYMOE_CHECK(std::memcmp(w.ptr<float>(), back.ptr<float>(), w.view().bytes()) == 0,
                    "the checkpoint read back differs");
        if (rank == 0) {
            std::printf("checkpoint bench, %d ranks, 256 MiB of f32 per rank (best of 3)\n", n);
            std::printf("  plain sequential write + fsync   %7.2f GB/s   (reference)\n",
                        bytes / t_pw / 1e9);
            std::printf("  checkpoint write (sha256, fsync) %7.2f GB/s   %.2f of plain write\n",
                        bytes / t_cw / 1e9,
                        t_pw / t_cw);
            std::printf("  plain sequential read            %7.2f GB/s   (reference)\n",
                        bytes / t_pr / 1e9);
            std::printf("  checkpoint read (sha256 checked) %7.2f GB/s   %.2f of plain read\n",
                        bytes / t_cr / 1e9,
                        t_pr / t_cr);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank == 0)
            fs::remove_all(dir + "/ckpt");

        // ---- 2. convert the mid preset (tp = ep = the rank count)
        if (do_convert) {
            const std::string hf = "build/bench/mid-hf";
            if (rank == 0)
                write_mid_folder(hf);
            MPI_Barrier(MPI_COMM_WORLD);
            std::ofstream(dir + "/convert.yaml")
                << "job: {kind: convert, name: mid, output: mid-ckpt}\n"
                   "model: {config: ../mid-hf/config.json, weights: ../mid-hf}\n"
                << "parallel: {tp: " << n << ", ep: " << n << "}\n";
            runtime::CommandLine cli;
            cli.deck_path = dir + "/convert.yaml";
            const runtime::Job job = runtime::load_job(cli, n);
            const parallel::Grid g = parallel::make_grid(job.layout);
            const double t0 = wall_seconds();
            runtime::run_job(job, g);
            MPI_Barrier(MPI_COMM_WORLD);
            const double t = wall_seconds() - t0;
            if (rank == 0) {
                int64_t src = 0, out = 0;
                for (const auto& e : fs::directory_iterator(hf))
                    src += static_cast<int64_t>(e.file_size());
                for (const auto& e : fs::directory_iterator(dir + "/mid-ckpt"))
                    out += static_cast<int64_t>(e.file_size());
                std::printf(
                    "convert of the mid preset (%.2f GB bf16 safetensors -> %.2f GB "
                    "checkpoint at tp%d ep%d): %.1f s, %.2f GB/s\n",
                    src / 1e9,
                    out / 1e9,
                    n,
                    n,
                    t,
                    src / t / 1e9);
            }
            MPI_Barrier(MPI_COMM_WORLD);
            if (rank == 0)
                fs::remove_all(dir);
        }
    } catch (const Error& e) {
        std::fprintf(stderr, "[rank %d] %s\n", rank, e.what());
        parallel::abort_world(static_cast<int>(e.code()));
    }
    return 0;
}
