/* cpu_backend.c - the CPU backend: its op table, memory (host allocations), and weight upload
 * (every checkpoint dtype dequantized to fp32 at load, FP8 with its 128x128 block scales, by
 * the host-side helpers of backend_host.c shared with the CUDA backend).
 *
 * Owner: model. "Device" memory is 64-byte-aligned host memory; upload/download are memcpy and
 * sync is a no-op. The op implementations live in cpu_ops.c, cpu_matmul.c, cpu_attention.c
 * cpu_moe.c and cpu_indexer.c; they run on a thread pool created here (n_threads, DEEPINFER_THREADS, or
 * all cores). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_host.h"
#include "backend/cpu/cpu_internal.h"
#include "core/status.h"

static di_status cpu_alloc(di_backend *be, size_t bytes, void **out) {
    (void)be;
    size_t n = (bytes + 63) & ~(size_t)63;
    if (n < bytes) return di_error(DI_ERR_NOMEM, "cpu backend: allocation of %zu bytes overflows", bytes);
    *out = aligned_alloc(64, n ? n : 64);
    if (!*out) return di_error(DI_ERR_NOMEM, "cpu backend: out of memory allocating %zu bytes", bytes);
    return DI_OK;
}

static void cpu_free(di_backend *be, void *p) { (void)be; free(p); }

static void cpu_upload(di_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (bytes) memmove(dst, src, bytes);
}

static di_status cpu_download(di_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (bytes) memmove(dst, src, bytes);
    return DI_OK;
}

static void cpu_memset(di_backend *be, void *dst, int byte, size_t bytes) {
    (void)be;
    if (bytes) memset(dst, byte, bytes);
}

static di_status cpu_sync(di_backend *be) { (void)be; return DI_OK; }

static di_status cpu_weight_upload(di_backend *be, int n, int n_parts, const di_host_matrix *parts,
                                   di_weight_layout layout, di_weight *out) {
    memset(out, 0, sizeof *out);
    int rows, cols;
    DI_TRY(di_weight_parts_check(n, n_parts, parts, &rows, &cols));
    size_t per = (size_t)rows * cols, total = per * (size_t)n;
    float *data = NULL, *tmp = NULL;
    DI_TRY(cpu_alloc(be, total * sizeof(float), (void **)&data));
    if (layout == DI_WEIGHT_TRANSPOSED && !(tmp = malloc(per * sizeof(float)))) {
        free(data);
        return di_error(DI_ERR_NOMEM, "tensor '%s': out of memory transposing", parts[0].name);
    }
    for (int i = 0; i < n; i++) {
        float *dst = data + (size_t)i * per, *buf = layout == DI_WEIGHT_TRANSPOSED ? tmp : dst;
        di_host_matrices_to_f32(buf, &parts[(size_t)i * n_parts], n_parts);
        if (layout == DI_WEIGHT_TRANSPOSED)
            for (int r = 0; r < rows; r++)
                for (int c = 0; c < cols; c++) dst[(size_t)c * rows + r] = buf[(size_t)r * cols + c];
    }
    free(tmp);
    out->n = n;
    out->rows = layout == DI_WEIGHT_TRANSPOSED ? cols : rows;
    out->cols = layout == DI_WEIGHT_TRANSPOSED ? rows : cols;
    out->dtype = DI_DTYPE_F32;
    out->data = data;
    out->bytes = total * sizeof(float);
    return DI_OK;
}

static void cpu_weight_free(di_backend *be, di_weight *w) {
    if (!w) return;
    cpu_free(be, w->data);
    cpu_free(be, w->scale);
    memset(w, 0, sizeof *w);
}

static void cpu_destroy(di_backend *be) {
    di_cpu_state *st = be->impl;
    if (st) di_threadpool_free(st->pool);
    free(st);
    free(be);
}

di_status di_backend_cpu_create(int n_threads, di_backend **out) {
    *out = NULL;
    di_backend *be = calloc(1, sizeof *be);
    di_cpu_state *st = calloc(1, sizeof *st);
    if (!be || !st) {
        free(be);
        free(st);
        return di_error(DI_ERR_NOMEM, "cpu backend: out of memory");
    }
    st->pool = di_threadpool_create(n_threads);
    if (!st->pool) {
        free(be);
        free(st);
        return di_error(DI_ERR_NOMEM, "cpu backend: cannot create the thread pool");
    }
    st->n_threads = di_threadpool_size(st->pool);
    di_cpu_isa_init();
    st->par_min_work = CPU_PAR_MIN_WORK;
    const char *pm = getenv("DEEPINFER_CPU_PAR_MIN_WORK");
    if (pm && *pm) st->par_min_work = atof(pm);
    be->name = "cpu";
    be->device = DI_DEVICE_CPU;
    be->impl = st;
    be->caps.act_dtype = DI_DTYPE_F32;
    be->caps.keeps_fp8 = 0;
    be->caps.memory_bytes = 0;
    be->caps.n_threads = st->n_threads;
    be->destroy = cpu_destroy;
    be->alloc = cpu_alloc;
    be->free = cpu_free;
    be->upload = cpu_upload;
    be->download = cpu_download;
    be->memset = cpu_memset;
    be->sync = cpu_sync;
    be->weight_upload = cpu_weight_upload;
    be->weight_free = cpu_weight_free;
    be->embed = di_cpu_embed;
    be->rmsnorm = di_cpu_rmsnorm;
    be->add_rmsnorm = di_cpu_add_rmsnorm;
    be->silu_mul = di_cpu_silu_mul;
    be->add = di_cpu_add;
    be->gather_rows = di_cpu_gather_rows;
    be->matmul = di_cpu_matmul;
    be->bmm = di_cpu_bmm;
    be->rope = di_cpu_rope;
    be->kv_write = di_cpu_kv_write;
    be->kv_copy_blocks = di_cpu_kv_copy_blocks;
    be->mla_prefill = di_cpu_mla_prefill;
    be->mla_prefill_scratch_bytes = di_cpu_mla_prefill_scratch_bytes;
    be->mla_decode = di_cpu_mla_decode;
    be->moe_route = di_cpu_moe_route;
    be->moe_experts = di_cpu_moe_experts;
    be->moe_scratch_bytes = di_cpu_moe_scratch_bytes;
    be->layernorm = di_cpu_layernorm;
    be->indexer_topk = di_cpu_indexer_topk;
    be->indexer_scratch_bytes = di_cpu_indexer_scratch_bytes;
    *out = be;
    return DI_OK;
}
