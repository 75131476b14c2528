// Prints a fused kernel's plan (hymoe/backend/cuda_fused.h) as a Python dict, for the numpy
// emulations of the kernels (tests/emulate/*.py, run by tests/emulate/run.sh):
//   plans kda K V | plans indexer n_q max_visible H d top_k one_sequence n_sm | plans mla H r_kv
//   d_r
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "hymoe/backend/cuda_fused.h"

using namespace hymoe::backend::cuda;

int main(int argc, char** argv) {
    auto arg = [&](int i) { return i < argc ? std::atoi(argv[i]) : 0; };
    if (argc >= 4 && !std::strcmp(argv[1], "kda")) {
        const KdaChunkLayout L = kda_chunk_layout(arg(2), arg(3));
        std::printf(
            "{'supported':%d,'bv':%d,'ld_k':%d,'ld_c':%d,'ld_v':%d,'ld_cf':%d,'ld_s':%d,'a32':%d,"
            "'q16':%d,'k16':%d,'qi16':%d,'ki16':%d,'r16':%d,'qg16':%d,'kg16':%d,'kl16':%d,"
            "'akk32':%d,'aqk32':%d,'t16':%d,'aqk16':%d,'w16':%d,'vp16':%d,'v16':%d,'x32':%d,"
            "'s32':%d,'s16':%d,'beta':%d,'dec':%d,'bytes':%d}\n",
            L.supported,
            L.bv,
            L.ld_k,
            L.ld_c,
            L.ld_v,
            L.ld_cf,
            L.ld_s,
            L.a32,
            L.q16,
            L.k16,
            L.qi16,
            L.ki16,
            L.r16,
            L.qg16,
            L.kg16,
            L.kl16,
            L.akk32,
            L.aqk32,
            L.t16,
            L.aqk16,
            L.w16,
            L.vp16,
            L.v16,
            L.x32,
            L.s32,
            L.s16,
            L.beta,
            L.dec,
            L.bytes);
        return 0;
    }
    if (argc >= 9 && !std::strcmp(argv[1], "indexer")) {
        const IndexerPlan P =
            indexer_topk_plan(arg(2), arg(3), arg(4), arg(5), arg(6), arg(7) != 0, arg(8));
        std::printf(
            "{'supported':%d,'qb':%d,'n_split':%d,'BK':%d,'cap':%d,'ld_q':%d,'ld_logit':%d,"
            "'q_off':%d,'k_off':%d,'logit_off':%d,'cand_off':%d,'w_off':%d,'smem':%d,'merge':%d}\n",
            P.supported,
            P.queries_per_block,
            P.n_split,
            P.key_tile,
            P.capacity,
            P.ld_q,
            P.ld_logit,
            P.q_off,
            P.k_off,
            P.logit_off,
            P.cand_off,
            P.w_off,
            P.smem_bytes,
            P.merge_smem_bytes);
        return 0;
    }
    if (argc >= 5 && !std::strcmp(argv[1], "mla")) {
        const MlaSparsePlan P = mla_sparse_plan(arg(2), arg(3), arg(4));
        std::printf(
            "{'supported':%d,'RB':%d,'BK':%d,'head_tiles':%d,'ld_lat':%d,'ld_score':%d,"
            "'ld_prob':%d,'q_off':%d,'k_off':%d,'score_off':%d,'prob_off':%d,'stat_off':%d,"
            "'key_off':%d,'smem':%d}\n",
            P.supported,
            P.row_blocks,
            P.key_tile,
            P.head_tiles,
            P.ld_lat,
            P.ld_score,
            P.ld_prob,
            P.q_off,
            P.k_off,
            P.score_off,
            P.prob_off,
            P.stat_off,
            P.key_off,
            P.smem_bytes);
        return 0;
    }
    std::fprintf(stderr,
                 "usage: plans kda K V | indexer n_q vis H d top one_seq n_sm | mla H r d_r\n");
    return 2;
}
