/* backend_host.c - host-side weight preparation shared by the CPU and CUDA backends (see
 * backend_host.h): checking the parts of a weight_upload call and converting them to fp32. */
#include "backend/backend_host.h"

#include <pthread.h>

#include "core/status.h"

/* float8_e4m3fn -> float for all 256 codes (exact; filled once from di_fp8e4m3_to_f32). */
static float g_fp8_lut[256];
static pthread_once_t g_fp8_once = PTHREAD_ONCE_INIT;
static void fill_fp8_lut(void) {
    for (int i = 0; i < 256; i++) g_fp8_lut[i] = di_fp8e4m3_to_f32((uint8_t)i);
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

di_status di_weight_parts_check(int n, int n_parts, const di_host_matrix *parts, int *rows, int *cols) {
    if (n <= 0 || n_parts <= 0) return di_error(DI_ERR_INVALID_ARG, "weight_upload: n=%d n_parts=%d", n, n_parts);
    int r = 0, c = parts[0].cols;
    for (int p = 0; p < n_parts; p++) r += parts[p].rows;
    for (int i = 0; i < n; i++)
        for (int p = 0; p < n_parts; p++) {
            const di_host_matrix *hm = &parts[(size_t)i * n_parts + p];
            DI_TRY(check_part(hm, i ? &parts[p] : NULL));
            if (hm->cols != c)
                return di_error(DI_ERR_FORMAT, "tensor '%s': %d columns, but '%s' it is concatenated with has %d",
                                hm->name ? hm->name : "?", hm->cols, parts[0].name ? parts[0].name : "?", c);
        }
    size_t per = (size_t)r * c, total = per * (size_t)n;
    if (total / (size_t)n != per || total > ((size_t)1 << 40))
        return di_error(DI_ERR_NOMEM, "tensor '%s': weight of %d x [%d, %d] is too large", parts[0].name, n, r, c);
    *rows = r;
    *cols = c;
    return DI_OK;
}

void di_host_matrix_to_f32(float *dst, const di_host_matrix *p) {
    pthread_once(&g_fp8_once, fill_fp8_lut);
    size_t es = di_dtype_size(p->dtype);
    for (int r = 0; r < p->rows; r++) {
        size_t src_row = (size_t)p->row0 + r;
        float *d = dst + (size_t)r * p->cols;
        const void *src = (const char *)p->data + src_row * p->cols * es;
        if (p->dtype == DI_DTYPE_F8_E4M3) {
            const uint8_t *q = src;
            size_t sc_cols = ((size_t)p->cols + p->block_cols - 1) / p->block_cols;
            const float *srow = p->scale + src_row / p->block_rows * sc_cols;
            for (int c = 0; c < p->cols; c++) d[c] = g_fp8_lut[q[c]] * srow[c / p->block_cols];
        } else {
            di_convert_to_f32(d, src, p->dtype, (size_t)p->cols);
        }
    }
}

void di_host_matrices_to_f32(float *dst, const di_host_matrix *parts, int n_parts) {
    size_t row_off = 0;
    for (int p = 0; p < n_parts; p++) {
        di_host_matrix_to_f32(dst + row_off * (size_t)parts[p].cols, &parts[p]);
        row_off += (size_t)parts[p].rows;
    }
}
