// The attention block's math kernels on the CPU (backend/ops_attention.h), moved here from the
// model blocks unchanged: one head's softmax attention (ops::attention_core); the DSA indexer's
// fp32 scores are in indexer_scores.cpp, its top-k selection and mask in indexer_select.cpp.
#include <vector>

#include "hymoe/backend/ops.h"
#include "hymoe/backend/ops_attention.h"
#include "hymoe/core/error.h"

namespace hymoe::ops {

void attention_core(
    const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, float tau, Tensor& o) {
    const int64_t n_q = q.dim(0), n_k = k.dim(0), d_qk = q.dim(1), d_v = v.dim(1);
    HYMOE_CHECK(k.dim(1) == d_qk && v.dim(0) == n_k && mask.dim(0) == n_q && mask.dim(1) == n_k &&
                    o.dim(0) == n_q && o.dim(1) == d_v,
                "attention_core: q ",
                shape_string(q.shape),
                " k ",
                shape_string(k.shape),
                " v ",
                shape_string(v.shape),
                " mask ",
                shape_string(mask.shape),
                " o ",
                shape_string(o.shape));
    std::vector<float> p(static_cast<size_t>(n_q * n_k));
    ops::gemm(false,
              true,
              n_q,
              n_k,
              d_qk,
              tau,
              q.ptr<float>(),
              d_qk,
              k.ptr<float>(),
              d_qk,
              0.0f,
              p.data(),
              n_k);
    const float* mp = mask.ptr<float>();
    for (int64_t i = 0; i < n_q * n_k; ++i)
        p[i] += mp[i];
    ops::softmax_rows(p.data(), n_q, n_k);
    ops::gemm(false,
              false,
              n_q,
              d_v,
              n_k,
              1.0f,
              p.data(),
              n_k,
              v.ptr<float>(),
              d_v,
              0.0f,
              o.ptr<float>(),
              d_v);
}

}  // namespace hymoe::ops
