// One MLA/DSA layer's latent cache as the backend's ops address it (ops_mla.h), on any device:
// for every cached token u of a sequence, its latent c_kv [r_kv], rope key k_r [d_r] and, for
// DSA, indexer key k_idx [d_I]. Paged (model::KvPool on the host, the GPU model's device pages):
// token u of block-table row b is slot u % page_tokens of page block_table[b·max_pages +
// u / page_tokens], a row [c_kv | k_r | k_idx] of `dtype` at the page's first element + slot ·
// row_stride; a page's first element is base + page·page_stride (one allocation: the device) or
// page_ptr[page] (one allocation a page: the host store). Planar (a host cache of its own, one
// sequence): the three columns in three f32 arrays, planes[0..2] [n, r_kv], [n, d_r], [n, d_I].
// Plain data: the pointers are on the device of the ops that read it (page_ptr, a host array,
// only in host views); the view does not own them.
#pragma once

#include <cstdint>

#include "hymoe/tensor/tensor.h"

namespace hymoe::backend {

struct LatentCache {
    DType dtype = DType::f32;            // of the stored rows: f32, bf16 or f16 (planar: f32)
    int64_t r_kv = 0, d_r = 0, d_i = 0;  // columns of a row; d_i = 0: no indexer key (MLA)
    // paged
    int page_tokens = 0;
    int64_t row_stride = 0;  // elements from one token row of a page to the next
    void* base = nullptr;    // page p at base + p·page_stride (elements) when not null
    int64_t page_stride = 0;
    void* const* page_ptr = nullptr;       // else page p at page_ptr[p] (host)
    const int32_t* block_table = nullptr;  // [n_seq, max_pages] page ids in token order
    int max_pages = 0;
    // planar (no pages): c_kv, k_r, k_idx of one sequence
    float* planes[3] = {nullptr, nullptr, nullptr};

    bool paged() const { return block_table != nullptr; }
    int64_t width() const { return r_kv + d_r + d_i; }  // elements of a row's columns
};

// The columns of a row: c_kv at 0, k_r at r_kv, k_idx at r_kv + d_r.
enum class LatentCol { c_kv = 0, k_r = 1, k_idx = 2 };

// Host views only: where column `col` [latent_col_width] of token u of block-table row b starts.
inline int64_t latent_col_offset(const LatentCache& c, LatentCol col) {
    return col == LatentCol::c_kv ? 0 : col == LatentCol::k_r ? c.r_kv : c.r_kv + c.d_r;
}
inline int64_t latent_col_width(const LatentCache& c, LatentCol col) {
    return col == LatentCol::c_kv ? c.r_kv : col == LatentCol::k_r ? c.d_r : c.d_i;
}
inline void* latent_at(const LatentCache& c, int64_t b, int64_t u, LatentCol col) {
    const int64_t w = latent_col_width(c, col);
    if (!c.paged())
        return c.planes[static_cast<int>(col)] + u * w;
    const int32_t page = c.block_table[b * c.max_pages + u / c.page_tokens];
    const int64_t el =
        (u % c.page_tokens) * c.row_stride + latent_col_offset(c, col);  // in the page
    const auto size = static_cast<int64_t>(dtype_size(c.dtype));
    char* first = c.base != nullptr ? static_cast<char*>(c.base) + page * c.page_stride * size
                                    : static_cast<char*>(c.page_ptr[page]);
    return first + el * size;
}

// Host views only: that column widened to fp32 into out, or written from in (narrowed to the
// view's dtype, rounding to nearest even: model::KvPool's read_row and write_row).
void latent_read(const LatentCache& c, int64_t b, int64_t u, LatentCol col, float* out);
void latent_write(const LatentCache& c, int64_t b, int64_t u, LatentCol col, const float* in);

}  // namespace hymoe::backend
