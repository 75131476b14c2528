// The lora job's evaluation and routing drift (train_monitor.h).
#include "train_monitor.h"

#include <algorithm>
#include <cmath>

#include "hymoe/backend/ops.h"
#include "hymoe/parallel/comm.h"

namespace hymoe::runtime {

EvalSet eval_set(const std::string& path, int64_t rows, int64_t seq_len) {
    EvalSet e;
    if (path.empty())
        return e;
    e.stream.emplace(path, 0, 0, false);
    for (int64_t r = 0; r < rows; ++r)
        e.rows.push_back(plan_row(*e.stream, 0, seq_len));
    return e;
}

model::LossSums evaluate(const model::TrainOn& on,
                         const EvalSet& e,
                         int64_t seq_len,
                         int64_t micro,
                         const parallel::Grid& grid) {
    model::LossSums s;
    const int64_t n = static_cast<int64_t>(e.rows.size());
    for (int64_t r = grid.me.dp * micro; r < n; r += micro * grid.layout.dp) {
        const int64_t count = std::min(micro, n - r);
        std::vector<DocImages> images;
        model::TrainBatch b = load_rows(e.rows, r, count, {&*e.stream}, seq_len, &images);
        splice_images(on.m, images, b);
        s.add(model::evaluate_loss(on, b));
    }
    std::vector<double> v = {s.loss,
                             static_cast<double>(s.targets),
                             static_cast<double>(s.correct),
                             static_cast<double>(s.seqs),
                             static_cast<double>(s.seqs_correct)};
    comm::all_reduce_sum(v, grid.comms.dp);
    s.loss = v[0], s.targets = static_cast<int64_t>(v[1]), s.correct = static_cast<int64_t>(v[2]);
    s.seqs = static_cast<int64_t>(v[3]), s.seqs_correct = static_cast<int64_t>(v[4]);
    return s;
}

void drift(const std::vector<Buffer>& base,
           const std::vector<Buffer>& now,
           const std::vector<int64_t>& layers,
           int64_t k,
           double* overlap,
           double* kl) {
    for (size_t l = 0; l < layers.size(); ++l) {
        const Buffer& a = base[layers[l]];
        const Buffer& b = now[layers[l]];
        overlap[l] = kl[l] = 0;
        if (a.view().data == nullptr)  // a layer of another pipeline stage
            continue;
        const int64_t n = a.view().dim(0), E = a.view().dim(1);
        double ov = 0, div = 0;
        std::vector<int64_t> ia(static_cast<size_t>(k)), ib(static_cast<size_t>(k));
        for (int64_t t = 0; t < n; ++t) {
            const float* p = a.ptr<float>() + t * E;
            const float* q = b.ptr<float>() + t * E;
            ops::top_k(p, E, k, ia.data());
            ops::top_k(q, E, k, ib.data());
            int64_t common = 0;
            for (int64_t x : ia)
                common += std::count(ib.begin(), ib.end(), x);
            ov += static_cast<double>(common) / static_cast<double>(k);
            for (int64_t e = 0; e < E; ++e)
                if (p[e] > 0)
                    div += static_cast<double>(p[e]) *
                           std::log(static_cast<double>(p[e]) /
                                    std::max(static_cast<double>(q[e]), 1e-30));
        }
        if (n > 0)
            overlap[l] = ov / static_cast<double>(n), kl[l] = div / static_cast<double>(n);
    }
}

}  // namespace hymoe::runtime
