// The attention core on the device (hymoe/backend/cuda_gemm.h), ops::attention_core's three
// steps on one stream: the masked, scaled scores by one GEMM accumulating onto a copy of the
// mask, the row softmax kernel, and the product with the values.
#include "hymoe/backend/cuda_gemm.h"
#include "hymoe/backend/cuda_ops.h"
#include "kernels.h"

namespace hymoe::backend::cuda {

void attention_core(Blas& blas,
                    const Tensor& q,
                    const Tensor& k,
                    const Tensor& v,
                    const Tensor& mask,
                    float tau,
                    Tensor& scratch,
                    Tensor& o) {
    for (const Tensor* t :
         {&q, &k, &v, &mask, static_cast<const Tensor*>(&scratch), static_cast<const Tensor*>(&o)})
        check_float(*t, "attention_core", DType::f32);
    const int64_t n_q = q.dim(0), n_k = k.dim(0), d_qk = q.dim(1), d_v = v.dim(1);
    HYMOE_CHECK(k.dim(1) == d_qk && v.dim(0) == n_k && mask.dim(0) == n_q && mask.dim(1) == n_k &&
                    scratch.numel() == n_q * n_k && o.dim(0) == n_q && o.dim(1) == d_v,
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
    copy_on_device(scratch.data, mask.data, mask.bytes(), blas.stream());
    blas.gemm(DType::f32,
              DType::f32,
              false,
              true,
              n_q,
              n_k,
              d_qk,
              tau,
              q.data,
              d_qk,
              k.data,
              d_qk,
              1.0f,
              scratch.data,
              n_k);
    Tensor p = scratch;
    p.shape = {n_q, n_k};
    softmax_rows(blas.stream(), p);
    blas.gemm(DType::f32,
              DType::f32,
              false,
              false,
              n_q,
              d_v,
              n_k,
              1.0f,
              p.data,
              n_k,
              v.data,
              d_v,
              0.0f,
              o.data,
              d_v);
}

}  // namespace hymoe::backend::cuda
