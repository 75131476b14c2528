// The router's score backward and the cross-entropy rows on the device
// (hymoe/backend/cuda_router_loss.h), fp32 in and out: one thread per token, and one block per row
// of logits with block reductions (argmax to the first maximum; Σ e^{z − max} in double).
#include "hymoe/backend/cuda_router_loss.h"
#include "kernels.h"

namespace hymoe::backend::cuda {

namespace {

// One thread per token: du over its k experts, then its row of dlogit.
__global__ void router_backward_kernel(const float* s,
                                       const int64_t* idx,
                                       const float* dw,
                                       const float* bias,
                                       ops::RouterGradRule rule,
                                       int64_t n_tok,
                                       int64_t n_exp,
                                       int64_t k,
                                       float* dlogit) {
    for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < n_tok;
         t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const float* st = s + t * n_exp;
        const int64_t* id = idx + t * k;
        const float* g = dw + t * k;
        float* dl = dlogit + t * n_exp;
        float sum = 0.0f;
        for (int64_t i = 0; i < k; ++i)
            sum += bias ? st[id[i]] + bias[id[i]] : st[id[i]];
        const float inv = 1.0f / (sum + rule.eps);
        float mean = 0.0f;
        if (rule.renormalize)
            for (int64_t i = 0; i < k; ++i)
                mean += g[i] * (bias ? st[id[i]] + bias[id[i]] : st[id[i]]) * inv;
        auto du = [&](int64_t i) {
            return rule.renormalize ? rule.rho * inv * (g[i] - mean) : rule.rho * g[i];
        };
        if (rule.sigmoid) {
            for (int64_t e = 0; e < n_exp; ++e)
                dl[e] = 0.0f;
            for (int64_t i = 0; i < k; ++i)
                dl[id[i]] = du(i) * st[id[i]] * (1.0f - st[id[i]]);
        } else {
            float c = 0.0f;
            for (int64_t i = 0; i < k; ++i)
                c += du(i) * st[id[i]];
            for (int64_t e = 0; e < n_exp; ++e)
                dl[e] = -st[e] * c;
            for (int64_t i = 0; i < k; ++i)
                dl[id[i]] += st[id[i]] * du(i);
        }
    }
}

// One block per row: the first maximum, Σ e^{z − max} in double, the loss, then the gradient.
__global__ void cross_entropy_kernel(
    float* logits, const int64_t* targets, int64_t V, double scale, double* loss, int64_t* best) {
    __shared__ float top[kBlock];
    __shared__ int64_t at[kBlock];
    __shared__ double part[kBlock];
    float* z = logits + blockIdx.x * V;
    float m = -INFINITY;
    int64_t a = V;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
        if (z[v] > m || a == V) {  // ascending v: strictly greater keeps the first maximum
            m = z[v];
            a = v;
        }
    top[threadIdx.x] = m;
    at[threadIdx.x] = a;
    __syncthreads();
    for (int o = kBlock / 2; o > 0; o >>= 1) {
        if (static_cast<int>(threadIdx.x) < o) {
            const float om = top[threadIdx.x + o];
            const int64_t oa = at[threadIdx.x + o];
            if (oa < V && (at[threadIdx.x] == V || om > top[threadIdx.x] ||
                           (om == top[threadIdx.x] && oa < at[threadIdx.x]))) {
                top[threadIdx.x] = om;
                at[threadIdx.x] = oa;
            }
        }
        __syncthreads();
    }
    const double zmax = top[0];
    double sum = 0;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
        sum += exp(static_cast<double>(z[v]) - zmax);
    part[threadIdx.x] = sum;
    __syncthreads();
    for (int o = kBlock / 2; o > 0; o >>= 1) {
        if (static_cast<int>(threadIdx.x) < o)
            part[threadIdx.x] += part[threadIdx.x + o];
        __syncthreads();
    }
    sum = part[0];
    const int64_t target = targets[blockIdx.x];
    if (threadIdx.x == 0) {
        loss[blockIdx.x] = log(sum) + zmax - static_cast<double>(z[target]);
        best[blockIdx.x] = at[0];
    }
    __syncthreads();  // z[target] read before it is overwritten
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
        const float gv = static_cast<float>(scale * exp(static_cast<double>(z[v]) - zmax) / sum);
        z[v] = v == target ? gv - static_cast<float>(scale) : gv;
    }
}

}  // namespace

void router_scores_backward(const Stream& st,
                            const Tensor& s,
                            const Tensor& idx,
                            const Tensor& dw,
                            const Tensor& bias,
                            const ops::RouterGradRule& rule,
                            Tensor& dlogit) {
    check_float(s, "router_scores_backward", DType::f32);
    check_float(dw, "router_scores_backward", DType::f32);
    check_float(dlogit, "router_scores_backward", DType::f32);
    const int64_t n_tok = s.dim(0), n_exp = s.dim(1);
    const int64_t k = n_tok > 0 ? idx.numel() / n_tok : 0;
    HYMOE_CHECK(idx.dtype == DType::i64 && idx.numel() == n_tok * k && dw.numel() == n_tok * k &&
                    dlogit.shape == s.shape && (bias.data == nullptr || bias.numel() == n_exp),
                "router_scores_backward: s ",
                shape_string(s.shape),
                " idx ",
                shape_string(idx.shape),
                " dw ",
                shape_string(dw.shape));
    if (n_tok == 0)
        return;
    router_backward_kernel<<<grid_for(n_tok, kBlock), kBlock, 0, st.get()>>>(
        s.ptr<float>(),
        idx.ptr<int64_t>(),
        dw.ptr<float>(),
        bias.data ? bias.ptr<float>() : nullptr,
        rule,
        n_tok,
        n_exp,
        k,
        dlogit.ptr<float>());
    check_launch("router_scores_backward");
}

void cross_entropy_rows(const Stream& st,
                        Tensor& logits,
                        const Tensor& targets,
                        double scale,
                        double* loss,
                        int64_t* best) {
    check_float(logits, "cross_entropy_rows", DType::f32);
    const int64_t k = logits.dim(0), V = logits.dim(1);
    HYMOE_CHECK(targets.dtype == DType::i64 && targets.numel() == k && V > 0,
                "cross_entropy_rows: logits ",
                shape_string(logits.shape),
                " targets ",
                shape_string(targets.shape));
    if (k == 0)
        return;
    cross_entropy_kernel<<<static_cast<unsigned>(k), kBlock, 0, st.get()>>>(
        logits.ptr<float>(), targets.ptr<int64_t>(), V, scale, loss, best);
    check_launch("cross_entropy_rows");
}

}  // namespace hymoe::backend::cuda
