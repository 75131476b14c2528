// The CUDA form of ops::vision_attention (backend/ops_vision.h): per image, its heads in groups
// whose scores [heads, m, m] fit the room (ops::heads_at_once), each head's two products cuBLAS
// GEMMs on strided views of qkv (fp32) and one softmax launch over the group's scores.
#include <algorithm>
#include <cmath>

#include "hymoe/backend/cuda_gemm.h"
#include "hymoe/backend/cuda_ops.h"
#include "hymoe/backend/cuda_vision.h"
#include "hymoe/core/error.h"

namespace hymoe::backend::cuda {

void vision_attention(const Ctx& ctx,
                      const Tensor& qkv,
                      const std::vector<int64_t>& lengths,
                      int64_t n_head,
                      int64_t scores_bytes,
                      Tensor& o) {
    const int64_t C = o.dim(1), dh = C / n_head;
    HYMOE_CHECK(qkv.dtype == DType::f32 && o.dtype == DType::f32 && qkv.dim(1) == 3 * C &&
                    qkv.dim(0) == o.dim(0) && C % n_head == 0,
                "vision_attention: qkv ",
                shape_string(qkv.shape),
                " o ",
                shape_string(o.shape),
                " over ",
                n_head,
                " heads");
    const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
    int64_t off = 0;
    for (int64_t m : lengths) {
        const int64_t at_once = ops::heads_at_once(m, n_head, scores_bytes);
        const float* q = qkv.ptr<float>() + off * 3 * C;  // [m, 3C] q | k | v
        Scratch scratch(ctx);
        Tensor scores = scratch(DType::f32, {at_once * m, m});
        for (int64_t h0 = 0; h0 < n_head; h0 += at_once) {
            const int64_t hn = std::min(at_once, n_head - h0);
            for (int64_t i = 0; i < hn; ++i)  // scores [hn, m, m] = τ q_h k_hᵀ
                ctx.blas->gemm(DType::f32,
                               DType::f32,
                               false,
                               true,
                               m,
                               m,
                               dh,
                               scale,
                               q + (h0 + i) * dh,
                               3 * C,
                               q + C + (h0 + i) * dh,
                               3 * C,
                               0.0f,
                               scores.ptr<float>() + i * m * m,
                               m);
            Tensor rows = scores;
            rows.shape = {hn * m, m};
            softmax_rows(*ctx.stream, rows);
            for (int64_t i = 0; i < hn; ++i)  // o_h [m, dh] = P_h v_h
                ctx.blas->gemm(DType::f32,
                               DType::f32,
                               false,
                               false,
                               m,
                               dh,
                               m,
                               1.0f,
                               scores.ptr<float>() + i * m * m,
                               m,
                               q + 2 * C + (h0 + i) * dh,
                               3 * C,
                               0.0f,
                               o.ptr<float>() + (off * C + (h0 + i) * dh),
                               C);
        }
        off += m;
    }
}

}  // namespace hymoe::backend::cuda
