/* cpu_backend.c - the CPU backend: its op table, memory (host allocations), and weight upload
 * (every checkpoint dtype dequantized to fp32 at load, FP8 with its 128x128 block scales).
 *
 * Owner: model. "Device" memory is 64-byte-aligned host memory; upload/download are memcpy and
 * sync is a no-op. The op implementations live in cpu_ops.c, cpu_matmul.c, cpu_attention.c
 * and cpu_moe.c; they run on a thread pool created here (n_threads, DEEPINFER_THREADS, or
 * all cores). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

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

/* Converts rows [row0, row0 + rows) of a host matrix to fp32, dequantizing FP8 blocks. */
static void convert_part(float *dst, const di_host_matrix *p) {
    size_t es = di_dtype_size(p->dtype);
    for (int r = 0; r < p->rows; r++) {
        size_t src_row = (size_t)p->row0 + r;
        float *d = dst + (size_t)r * p->cols;
        di_convert_to_f32(d, (const char *)p->data + src_row * p->cols * es, p->dtype, (size_t)p->cols);
        if (p->dtype == DI_DTYPE_F8_E4M3) {
            size_t sc_cols = ((size_t)p->cols + p->block_cols - 1) / p->block_cols;
            const float *srow = p->scale + src_row / p->block_rows * sc_cols;
            for (int c = 0; c < p->cols; c++) d[c] *= srow[c / p->block_cols];
        }
    }
}

static di_status check_part(const di_host_matrix *p, const di_host_matrix *first_of_index) {
    const char *nm = p->name ? p->name : "(unnamed)";
    if (p->dtype != DI_DTYPE_F32 && p->dtype != DI_DTYPE_BF16 && p->dtype != DI_DTYPE_F16 &&
        p->dtype != DI_DTYPE_F8_E4M3)
        return di_error(DI_ERR_UNSUPPORTED, "tensor '%s': dtype %s is not a supported weight dtype "
                        "(expected F32, BF16, F16 or F8_E4M3)", nm, di_dtype_name(p->dtype));
    if (p->rows <= 0 || p->cols <= 0 || p->row0 < 0 || !p->data)
        return di_error(DI_ERR_INVALID_ARG, "tensor '%s': empty or invalid matrix (rows %d from %d, cols %d)",
                        nm, p->rows, p->row0, p->cols);
    if (p->dtype == DI_DTYPE_F8_E4M3 && (!p->scale || p->block_rows <= 0 || p->block_cols <= 0))
        return di_error(DI_ERR_FORMAT, "tensor '%s': F8_E4M3 weight without weight_scale_inv block scales", nm);
    if (first_of_index && (p->rows != first_of_index->rows || p->cols != first_of_index->cols))
        return di_error(DI_ERR_FORMAT, "tensor '%s': shape [%d, %d] differs from '%s' [%d, %d] it is stacked with",
                        nm, p->rows, p->cols, first_of_index->name ? first_of_index->name : "?",
                        first_of_index->rows, first_of_index->cols);
    return DI_OK;
}

static di_status cpu_weight_upload(di_backend *be, int n, int n_parts, const di_host_matrix *parts,
                                   di_weight_layout layout, di_weight *out) {
    memset(out, 0, sizeof *out);
    if (n <= 0 || n_parts <= 0) return di_error(DI_ERR_INVALID_ARG, "weight_upload: n=%d n_parts=%d", n, n_parts);
    int rows = 0, cols = parts[0].cols;
    for (int p = 0; p < n_parts; p++) rows += parts[p].rows;
    for (int i = 0; i < n; i++)
        for (int p = 0; p < n_parts; p++) {
            const di_host_matrix *hm = &parts[(size_t)i * n_parts + p];
            DI_TRY(check_part(hm, i ? &parts[p] : NULL));
            if (hm->cols != cols)
                return di_error(DI_ERR_FORMAT, "tensor '%s': %d columns, but '%s' it is concatenated with has %d",
                                hm->name ? hm->name : "?", hm->cols, parts[0].name ? parts[0].name : "?", cols);
        }
    size_t per = (size_t)rows * cols, total = per * (size_t)n;
    if (total / (size_t)n != per || total > ((size_t)1 << 40))
        return di_error(DI_ERR_NOMEM, "tensor '%s': weight of %d x [%d, %d] is too large", parts[0].name, n, rows, cols);
    float *data = NULL, *tmp = NULL;
    DI_TRY(cpu_alloc(be, total * sizeof(float), (void **)&data));
    if (layout == DI_WEIGHT_TRANSPOSED && !(tmp = malloc(per * sizeof(float)))) {
        free(data);
        return di_error(DI_ERR_NOMEM, "tensor '%s': out of memory transposing", parts[0].name);
    }
    for (int i = 0; i < n; i++) {
        float *dst = data + (size_t)i * per, *buf = layout == DI_WEIGHT_TRANSPOSED ? tmp : dst;
        size_t row_off = 0;
        for (int p = 0; p < n_parts; p++) {
            const di_host_matrix *hm = &parts[(size_t)i * n_parts + p];
            convert_part(buf + row_off * cols, hm);
            row_off += (size_t)hm->rows;
        }
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
    cpu_state *st = be->impl;
    if (st) di_threadpool_free(st->pool);
    free(st);
    free(be);
}

di_status di_backend_cpu_create(int n_threads, di_backend **out) {
    *out = NULL;
    di_backend *be = calloc(1, sizeof *be);
    cpu_state *st = calloc(1, sizeof *st);
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
    be->embed = cpu_embed;
    be->rmsnorm = cpu_rmsnorm;
    be->add_rmsnorm = cpu_add_rmsnorm;
    be->silu_mul = cpu_silu_mul;
    be->add = cpu_add;
    be->gather_rows = cpu_gather_rows;
    be->matmul = cpu_matmul;
    be->bmm = cpu_bmm;
    be->rope = cpu_rope;
    be->kv_write = cpu_kv_write;
    be->kv_copy_blocks = cpu_kv_copy_blocks;
    be->mla_prefill = cpu_mla_prefill;
    be->mla_prefill_scratch_bytes = cpu_mla_prefill_scratch_bytes;
    be->mla_decode = cpu_mla_decode;
    be->moe_route = cpu_moe_route;
    be->moe_experts = cpu_moe_experts;
    be->moe_scratch_bytes = cpu_moe_scratch_bytes;
    *out = be;
    return DI_OK;
}
