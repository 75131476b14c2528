// DecodeGraphs (hymoe/backend/cuda_graph.h): per-bucket capture of the caller's decode step
// (thread-local capture mode, so other threads' CUDA calls are not caught), instantiation, replay,
// and refresh by cudaGraphExecUpdate with re-instantiation as the fallback.
#include "check.h"
#include "hymoe/backend/cuda_graph.h"

namespace hymoe::backend::cuda {

DecodeGraphs::DecodeGraphs(DecodeBuckets buckets, Step step)
    : buckets_(std::move(buckets)),
      step_(std::move(step)),
      exec_(static_cast<size_t>(buckets_.count()), nullptr) {}

DecodeGraphs::~DecodeGraphs() {
    for (CUgraphExec_st* e : exec_)
        if (e)
            cudaGraphExecDestroy(e);
}

int DecodeGraphs::captured() const {
    int n = 0;
    for (CUgraphExec_st* e : exec_)
        n += e != nullptr;
    return n;
}

namespace {

// Owners that destroy what they hold unless it is released.
struct GraphOwner {
    cudaGraph_t graph = nullptr;
    ~GraphOwner() {
        if (graph)
            cudaGraphDestroy(graph);
    }
};
struct ExecOwner {
    cudaGraphExec_t exec = nullptr;
    ~ExecOwner() {
        if (exec)
            cudaGraphExecDestroy(exec);
    }
    cudaGraphExec_t release() {
        cudaGraphExec_t e = exec;
        exec = nullptr;
        return e;
    }
};

}  // namespace

// Takes `update` over: it comes back updated, or is destroyed (freed once any launch in flight
// completes) and replaced.
CUgraphExec_st* DecodeGraphs::capture(const Stream& s, int bucket, CUgraphExec_st* update) {
    ExecOwner old{update};
    GraphOwner captured;
    HYMOE_CUDA_CHECK(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeThreadLocal),
                     "decode graph: begin capture of bucket ",
                     bucket);
    try {
        step_(s, bucket);
    } catch (...) {
        cudaStreamEndCapture(s.get(), &captured.graph);  // leave the stream usable
        throw;
    }
    HYMOE_CUDA_CHECK(cudaStreamEndCapture(s.get(), &captured.graph),
                     "decode graph: end capture of bucket ",
                     bucket,
                     " (a call in the step is not capture-safe)");
    if (old.exec) {
        cudaGraphExecUpdateResultInfo info{};
        if (cudaGraphExecUpdate(old.exec, captured.graph, &info) == cudaSuccess) {
            ++updated_;
            return old.release();
        }
        (void)cudaGetLastError();  // a refused update is not an error: rebuild instead
    }
    ExecOwner fresh;
    HYMOE_CUDA_CHECK(cudaGraphInstantiate(&fresh.exec, captured.graph, 0),
                     "decode graph: instantiate bucket ",
                     bucket);
    if (update)
        ++reinstantiated_;
    return fresh.release();
}

int DecodeGraphs::run(const Stream& s, int n) {
    const int i = buckets_.index_for(n);
    const int bucket = buckets_.sizes()[static_cast<size_t>(i)];
    CUgraphExec_st*& exec = exec_[static_cast<size_t>(i)];
    if (exec == nullptr)
        exec = capture(s, bucket, nullptr);
    HYMOE_CUDA_CHECK(cudaGraphLaunch(exec, s.get()), "decode graph: launch bucket ", bucket);
    return bucket;
}

void DecodeGraphs::refresh(const Stream& s) {
    for (size_t i = 0; i < exec_.size(); ++i) {
        CUgraphExec_st* old = exec_[i];
        exec_[i] = nullptr;  // capture owns it now
        if (old)
            exec_[i] = capture(s, buckets_.sizes()[i], old);
    }
}

}  // namespace hymoe::backend::cuda
