/* cpu_ops.c - the CPU backend's row-wise ops: embedding, RMSNorm (plain and fused with the
 * residual add), LayerNorm (V3.2 indexer), SiLU-mul, add, row gather, RoPE, and the paged latent-cache write / block copy.
 *
 * Owner: model. All fp32. These ops are memory-bound and cheap next to the GEMMs, so they run
 * on the calling thread; each output depends only on its own row (batch-invariant). */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "core/status.h"

void di_cpu_embed(di_backend *be, float *out, const di_weight *table, const int32_t *ids, int T) {
    (void)be;
    int D = table->cols;
    const float *tab = table->data;
    float *o = out;
    for (int t = 0; t < T; t++) {
        DI_ASSERT(ids[t] >= 0 && ids[t] < table->rows);
        memcpy(o + (size_t)t * D, tab + (size_t)ids[t] * D, (size_t)D * sizeof(float));
    }
}

/* rmsnorm of one row: y = w ⊙ (x / sqrt(mean(x²) + eps)); the sum of squares in double. */
static void norm_row(float *y, const float *x, const float *w, float eps, int D) {
    double ss = 0.0;
    for (int i = 0; i < D; i++) ss += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(ss / D + (double)eps));
    for (int i = 0; i < D; i++) y[i] = w[i] * (x[i] * inv);
}

void di_cpu_rmsnorm(di_backend *be, void *out, int ldo, const void *x, int ldx, const di_weight *w,
                 float eps, int T, int D) {
    (void)be;
    DI_ASSERT(w->cols == D && w->n == 1);
    for (int t = 0; t < T; t++)
        norm_row((float *)out + (size_t)t * ldo, (const float *)x + (size_t)t * ldx, w->data, eps, D);
}

void di_cpu_layernorm(di_backend *be, void *out, int ldo, const void *x, int ldx, const di_weight *w,
                   const di_weight *b, float eps, int T, int D) {
    (void)be;
    DI_ASSERT(w->cols == D && b->cols == D);
    const float *wf = w->data, *bf = b->data;
    for (int t = 0; t < T; t++) {
        const float *xr = (const float *)x + (size_t)t * ldx;
        float *yr = (float *)out + (size_t)t * ldo;
        double mean = 0.0, var = 0.0;
        for (int i = 0; i < D; i++) mean += xr[i];
        mean /= D;
        for (int i = 0; i < D; i++) var += ((double)xr[i] - mean) * ((double)xr[i] - mean);
        float inv = (float)(1.0 / sqrt(var / D + (double)eps)), mf = (float)mean;
        for (int i = 0; i < D; i++) yr[i] = (xr[i] - mf) * inv * wf[i] + bf[i];
    }
}

/* act is f32 here, so out and out_f32 hold the same values */
void di_cpu_add_rmsnorm(di_backend *be, float *h, const void *delta, void *out, float *out_f32,
                        const di_weight *w, float eps, int T, int D) {
    (void)be;
    DI_ASSERT(w->cols == D && w->n == 1 && (void *)h != out && h != out_f32);
    const float *df = delta;
    for (int t = 0; t < T; t++) {
        float *row = h + (size_t)t * D, *o = (float *)out + (size_t)t * D;
        if (df)
            for (int i = 0; i < D; i++) row[i] += df[(size_t)t * D + i];
        norm_row(o, row, w->data, eps, D);
        if (out_f32) memcpy(out_f32 + (size_t)t * D, o, (size_t)D * sizeof(float));
    }
}

void di_cpu_silu_mul(di_backend *be, void *out, const void *gu, int T, int I) {
    (void)be;
    float *o = out;
    const float *g = gu;
    for (int t = 0; t < T; t++) {
        const float *gt = g + (size_t)t * 2 * I, *ut = gt + I;
        float *ot = o + (size_t)t * I;
        for (int i = 0; i < I; i++) ot[i] = gt[i] / (1.0f + expf(-gt[i])) * ut[i];
    }
}

void di_cpu_add(di_backend *be, float *y, const void *x, size_t n) {
    (void)be;
    const float *xf = x;
    for (size_t i = 0; i < n; i++) y[i] += xf[i];
}

void di_cpu_gather_rows(di_backend *be, float *out, const float *x, const int32_t *rows, int n, int D) {
    (void)be;
    for (int i = 0; i < n; i++) memmove(out + (size_t)i * D, x + (size_t)rows[i] * D, (size_t)D * sizeof(float));
}

enum { ROPE_MAX_HALF = 512 };

void di_cpu_rope(di_backend *be, void *x, int ldx, int n_heads, int hs, const int32_t *positions,
              int T, const di_rope_params *rp) {
    (void)be;
    int half = rp->dim / 2;
    DI_ASSERT(rp->dim % 2 == 0 && half <= ROPE_MAX_HALF);
    float cs[ROPE_MAX_HALF], sn[ROPE_MAX_HALF];
    for (int t = 0; t < T; t++) {
        /* angle in fp32 (as HF: inv_freq · position), cos/sin rounded once to fp32 */
        float pos = (float)positions[t];
        for (int i = 0; i < half; i++) {
            float phi = pos * rp->inv_freq[i];
            cs[i] = (float)cos((double)phi) * rp->mscale;
            sn[i] = (float)sin((double)phi) * rp->mscale;
        }
        for (int h = 0; h < n_heads; h++) {
            float *v = (float *)x + (size_t)t * ldx + (size_t)h * hs;
            for (int i = 0; i < half; i++) {
                int a = rp->interleave ? 2 * i : i, b = rp->interleave ? 2 * i + 1 : i + half;
                float xa = v[a], xb = v[b];
                v[a] = xa * cs[i] - xb * sn[i];
                v[b] = xb * cs[i] + xa * sn[i];
            }
        }
    }
}

void di_cpu_kv_write(di_backend *be, void *cache, const void *kv, int ldkv,
                  const int32_t *slot_mapping, int T, int W) {
    (void)be;
    for (int t = 0; t < T; t++) {
        if (slot_mapping[t] < 0) continue;
        memcpy((float *)cache + (size_t)slot_mapping[t] * W, (const float *)kv + (size_t)t * ldkv,
               (size_t)W * sizeof(float));
    }
}

void di_cpu_kv_copy_blocks(di_backend *be, void *cache, size_t layer_stride, int n_layers, int W,
                        const int32_t *src, const int32_t *dst, int n) {
    (void)be;
    size_t block = (size_t)DI_KV_BLOCK_SIZE * W;
    for (int l = 0; l < n_layers; l++) {
        float *base = (float *)cache + (size_t)l * layer_stride;
        for (int i = 0; i < n; i++)
            if (src[i] != dst[i])
                memcpy(base + (size_t)dst[i] * block, base + (size_t)src[i] * block, block * sizeof(float));
    }
}
