// The CPU forms of the MoE ops (hymoe/backend/ops_moe.h) and the host plan of the expert groups
// (backend/moe_groups.h): plain loops, fp32, each row's slots in slot order.
#include <algorithm>
#include <vector>

#include "hymoe/backend/moe_groups.h"
#include "hymoe/backend/ops_moe.h"
#include "hymoe/core/error.h"
#include "hymoe/core/f32x4.h"

namespace hymoe {

namespace backend {

std::vector<int64_t> MoeGroups::rows_per_expert() const {
    std::vector<int64_t> rows(offset.size() - 1);
    for (size_t e = 0; e < rows.size(); ++e)
        rows[e] = offset[e + 1] - offset[e];
    return rows;
}

MoeGroups moe_group_rows(const int32_t* expert, int64_t n, int64_t k, int64_t n_exp) {
    MoeGroups g;
    g.offset.assign(static_cast<size_t>(n_exp) + 1, 0);
    for (int64_t a = 0; a < n * k; ++a) {
        const int32_t e = expert[a];
        HYMOE_CHECK(e < n_exp, "moe_group_rows: expert ", e, " of ", n_exp);
        if (e >= 0)
            ++g.offset[static_cast<size_t>(e) + 1];
    }
    for (size_t e = 0; e + 1 < g.offset.size(); ++e)
        g.offset[e + 1] += g.offset[e];
    std::vector<int64_t> cursor(g.offset.begin(), g.offset.end() - 1);  // [E]
    g.row.assign(static_cast<size_t>(n * k), -1);
    for (int64_t a = 0; a < n * k; ++a)  // row-major, so each expert's rows ascend
        if (expert[a] >= 0)
            g.row[static_cast<size_t>(a)] = cursor[static_cast<size_t>(expert[a])]++;
    return g;
}

}  // namespace backend

namespace ops {

namespace {

void check_moe(
    const char* op, const Tensor& rows_side, const Tensor& row, int64_t k, const Tensor& n_side) {
    HYMOE_CHECK(row.dtype == DType::i64 && k > 0 && row.numel() == n_side.dim(0) * k &&
                    rows_side.dtype == DType::f32 && n_side.dtype == DType::f32 &&
                    rows_side.dim(1) == n_side.dim(1),
                op,
                ": grouped ",
                shape_string(rows_side.shape),
                ", rows ",
                shape_string(n_side.shape),
                ", row map ",
                shape_string(row.shape),
                ", k ",
                k);
}

}  // namespace

void moe_gather(const Tensor& x, const Tensor& row, const float* weight, int64_t k, Tensor& in) {
    check_moe("moe_gather", in, row, k, x);
    const int64_t width = x.dim(1), n_assign = row.numel();
    const int64_t* map = row.ptr<int64_t>();
    for (int64_t a = 0; a < n_assign; ++a) {
        const int64_t r = map[a];
        if (r < 0)
            continue;
        const float* from = x.ptr<float>() + a / k * width;
        float* to = in.ptr<float>() + r * width;
        const float scale = weight ? weight[a] : 1.0f;
        for (int64_t c = 0; c < width; ++c)
            to[c] = scale * from[c];
    }
}

// Per element ((0 + s_0·o_0) + s_1·o_1) + …, each product rounded before its sum (the arithmetic
// of the plain loop), 16 columns at a time held in registers across the slots.
void moe_combine(const Tensor& out, const Tensor& row, const float* weight, int64_t k, Tensor& y) {
    check_moe("moe_combine", out, row, k, y);
    const int64_t width = y.dim(1), n = y.dim(0), wide = width / 16 * 16;
    const int64_t* map = row.ptr<int64_t>();
    std::vector<const float*> from(static_cast<size_t>(k));  // [k] the computed slots' rows
    std::vector<float> scale(static_cast<size_t>(k));        // [k] their weights
    for (int64_t t = 0; t < n; ++t) {
        size_t m = 0;
        for (int64_t i = 0; i < k; ++i) {
            const int64_t r = map[t * k + i];
            if (r < 0)
                continue;
            from[m] = out.ptr<float>() + r * width;
            scale[m++] = weight ? weight[t * k + i] : 1.0f;
        }
        float* yt = y.ptr<float>() + t * width;
        for (int64_t j = 0; j < wide; j += 16) {
            f32x4 a0 = {}, a1 = {}, a2 = {}, a3 = {};
            for (size_t i = 0; i < m; ++i) {
                const float* o = from[i] + j;
                const float wt = scale[i];
                a0 += wt * load4(o);
                a1 += wt * load4(o + 4);
                a2 += wt * load4(o + 8);
                a3 += wt * load4(o + 12);
            }
            store4(yt + j, a0);
            store4(yt + j + 4, a1);
            store4(yt + j + 8, a2);
            store4(yt + j + 12, a3);
        }
        for (int64_t j = wide; j < width; ++j) {
            float acc = 0.0f;
            for (size_t i = 0; i < m; ++i)
                acc += scale[i] * from[i][j];
            yt[j] = acc;
        }
    }
}

}  // namespace ops

}  // namespace hymoe
