/* cpu_internal.h - shared internals of the CPU backend: its private state, the fp32 GEMM
 * kernels every op builds on, and the per-file op entry points the table in cpu_backend.c
 * points at.
 *
 * Owner: model. Invariant: every kernel computes each output element with one fixed sequence
 * of fp32 operations that depends only on the operand shapes, never on thread count or on how
 * rows are tiled, so results are bit-reproducible and batch-invariant per build. */
#ifndef DI_BACKEND_CPU_INTERNAL_H
#define DI_BACKEND_CPU_INTERNAL_H
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "core/threadpool.h"

/* Work (multiply-adds) below which a parallel loop runs on the calling thread: waking the
 * pool costs tens of microseconds, more than small decode-sized ops take. Overridable with
 * DEEPINFER_CPU_PAR_MIN_WORK (tests set 0 to exercise the threaded paths on small shapes). */
#define CPU_PAR_MIN_WORK 1.5e6

typedef struct di_cpu_state {
    di_threadpool *pool;
    int n_threads;
    double par_min_work;
} di_cpu_state;

/* The pool, or NULL (serial) when the op's work is below the threshold. */
static inline di_threadpool *cpu_pool_for(di_backend *be, double work) {
    di_cpu_state *st = be->impl;
    return work < st->par_min_work ? NULL : st->pool;
}

/* Parallel-for over n independent items of `work` total multiply-adds (serial when small);
 * results never depend on the choice. */
static inline void cpu_parallel(di_backend *be, size_t n, di_parallel_fn fn, void *ctx, double work) {
    di_threadpool_run(cpu_pool_for(be, work), n, fn, ctx);
}

/* Instruction set of the GEMM / dot kernels ("baseline" or "avx2+fma"), chosen once per
 * process (DEEPINFER_CPU_ISA=baseline forces the baseline). */
void di_cpu_isa_init(void);
const char *di_cpu_isa(void);
int di_cpu_have_avx2(void);
/* The two instantiations of cpu_gemm_kernels.h (tests call both directly). */
void di_cpu_gemm_serial_base(float *y, int ldy, const float *x, int ldx, const float *W, int ldw,
                             int M, int N, int K, int accumulate);
float di_cpu_dot_base(const float *a, const float *b, int n);
void di_cpu_axpy_base(float *y, float a, const float *x, int n);
void di_cpu_gemm_serial_avx2(float *y, int ldy, const float *x, int ldx, const float *W, int ldw,
                             int M, int N, int K, int accumulate);
float di_cpu_dot_avx2(const float *a, const float *b, int n);
void di_cpu_axpy_avx2(float *y, float a, const float *x, int n);

/* y[M, N] (+)= x[M, K] · W[N, K]ᵀ, serial, fp32. Row strides ldy, ldx, ldw (elements). */
void di_cpu_gemm_serial(float *y, int ldy, const float *x, int ldx, const float *W, int ldw,
                     int M, int N, int K, int accumulate);
/* Same, split over the pool (tiles of rows of W and of x); pool NULL = serial. */
void di_cpu_gemm(di_threadpool *pool, float *y, int ldy, const float *x, int ldx, const float *W,
              int ldw, int M, int N, int K, int accumulate);
/* Fixed-order fp32 dot product (same lane layout as the GEMM kernels). */
float di_cpu_dot(const float *a, const float *b, int n);
/* y[i] += a * x[i] */
void di_cpu_axpy(float *y, float a, const float *x, int n);

/* op entry points (cpu_matmul.c) */
void di_cpu_matmul(di_backend *be, void *y, int ldy, const void *x, int ldx, const di_weight *W,
                int T, unsigned flags);
void di_cpu_bmm(di_backend *be, void *y, int ldy, int hsy, const void *x, int ldx, int hsx,
             const di_weight *W, int T);
/* (cpu_attention.c) */
void di_cpu_mla_prefill(di_backend *be, void *out, const void *q, int ldq, const void *cache,
                     const di_weight *W_kvb, const di_attn_batch *ab, int seq_begin, int seq_end,
                     const di_mla_dims *d, void *scratch, size_t scratch_bytes);
size_t di_cpu_mla_prefill_scratch_bytes(di_backend *be, const di_mla_dims *d, int max_tokens);
void di_cpu_mla_decode(di_backend *be, void *out, const void *qt, const void *qpe, int ldqpe,
                    int hsqpe, const void *cache, const di_attn_batch *ab, int seq_begin,
                    int seq_end, const di_mla_dims *d);
/* (cpu_moe.c) */
void di_cpu_moe_route(di_backend *be, int32_t *topk_idx, float *topk_w, const float *x,
                   const di_weight *W_g, const di_weight *bias, const di_route_params *rp, int T,
                   float *scratch);
void di_cpu_moe_experts(di_backend *be, void *out, const void *x, const int32_t *topk_idx,
                     const float *topk_w, int k, const di_weight *gate_up, const di_weight *down,
                     int T, void *scratch, size_t scratch_bytes);
size_t di_cpu_moe_scratch_bytes(di_backend *be, int max_tokens, int k, int D, int I, int E);
/* (cpu_indexer.c) */
void di_cpu_indexer_topk(di_backend *be, int32_t *sel_pos, int32_t *sel_count, const void *q,
                      const float *w, const void *index_cache, const di_attn_batch *ab, int seq_begin,
                      int seq_end, const di_indexer_dims *d, void *scratch, size_t scratch_bytes);
size_t di_cpu_indexer_scratch_bytes(di_backend *be, int max_tokens, int max_ctx);
/* (cpu_ops.c) */
void di_cpu_layernorm(di_backend *be, void *out, int ldo, const void *x, int ldx, const di_weight *w,
                   const di_weight *b, float eps, int T, int D);
void di_cpu_embed(di_backend *be, float *out, const di_weight *table, const int32_t *ids, int T);
void di_cpu_rmsnorm(di_backend *be, void *out, int ldo, const void *x, int ldx, const di_weight *w,
                 float eps, int T, int D);
void di_cpu_add_rmsnorm(di_backend *be, float *h, const void *delta, void *out, float *out_f32,
                        const di_weight *w, float eps, int T, int D);
void di_cpu_silu_mul(di_backend *be, void *out, const void *gu, int T, int I);
void di_cpu_add(di_backend *be, float *y, const void *x, size_t n);
void di_cpu_gather_rows(di_backend *be, float *out, const float *x, const int32_t *rows, int n, int D);
void di_cpu_rope(di_backend *be, void *x, int ldx, int n_heads, int hs, const int32_t *positions,
              int T, const di_rope_params *rp);
void di_cpu_kv_write(di_backend *be, void *cache, const void *kv, int ldkv,
                  const int32_t *slot_mapping, int T, int W);
void di_cpu_kv_copy_blocks(di_backend *be, void *cache, size_t layer_stride, int n_layers, int W,
                        const int32_t *src, const int32_t *dst, int n);
#endif
