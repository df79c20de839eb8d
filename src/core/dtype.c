/* dtype.c - see dtype.h. */
#include "core/dtype.h"

#include <math.h>
#include <string.h>

static const char *k_names[DI_DTYPE_COUNT] = {"F32", "BF16", "F16", "F8_E4M3", "I32", "I64", "U8"};
static const size_t k_sizes[DI_DTYPE_COUNT] = {4, 2, 2, 1, 4, 8, 1};

size_t di_dtype_size(di_dtype t) { return (unsigned)t < DI_DTYPE_COUNT ? k_sizes[t] : 0; }
const char *di_dtype_name(di_dtype t) { return (unsigned)t < DI_DTYPE_COUNT ? k_names[t] : "?"; }

int di_dtype_from_name(const char *name, di_dtype *out) {
    for (int i = 0; i < DI_DTYPE_COUNT; i++)
        if (strcmp(name, k_names[i]) == 0) { *out = (di_dtype)i; return 1; }
    return 0;
}

float di_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: value = man * 2^-24 */
            float f = (float)man * 5.9604644775390625e-8f;
            return (h >> 15) ? -f : f;
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t di_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00;            /* NaN */
    if (a >= 0x477ff000u) return sign | 0x7c00;           /* overflow -> inf (>= 65520) */
    if (a < 0x38800000u) {                                /* subnormal or zero in f16 */
        float af;
        memcpy(&af, &a, 4);
        /* round to nearest even multiple of 2^-24 */
        float q = af * 16777216.0f;
        float r = nearbyintf(q);
        return sign | (uint16_t)r;
    }
    uint32_t mant_odd = (a >> 13) & 1u;
    a += 0xfffu + mant_odd;
    a -= 112u << 23;
    return sign | (uint16_t)(a >> 13);
}

float di_fp8e4m3_to_f32(uint8_t v) {
    int sign = v >> 7, exp = (v >> 3) & 0xf, man = v & 7;
    float r;
    if (exp == 0xf && man == 7) return NAN;
    if (exp == 0) r = ldexpf((float)man, -9);          /* subnormal: man/8 * 2^-6 */
    else r = ldexpf(1.0f + (float)man / 8.0f, exp - 7);
    return sign ? -r : r;
}

uint8_t di_f32_to_fp8e4m3(float f) {
    if (isnan(f)) return 0x7f;
    uint8_t sign = signbit(f) ? 0x80 : 0;
    float a = fabsf(f);
    if (a >= 448.0f) return sign | 0x7e;  /* saturate to max finite */
    /* brute-force nearest-even over the 127 non-negative finite codes; called at quantization
     * time only (mkmodel, activation-quant reference), never in a hot loop. Monotone search. */
    int lo = 0, hi = 0x7e;
    while (lo < hi) { /* smallest code with value >= a */
        int mid = (lo + hi) / 2;
        if (di_fp8e4m3_to_f32((uint8_t)mid) < a) lo = mid + 1; else hi = mid;
    }
    int c = lo;
    if (c > 0) {
        float above = di_fp8e4m3_to_f32((uint8_t)c), below = di_fp8e4m3_to_f32((uint8_t)(c - 1));
        float da = above - a, db = a - below;
        if (db < da || (db == da && ((c - 1) & 1) == 0)) c = c - 1;
    }
    return sign | (uint8_t)c;
}

void di_convert_to_f32(float *dst, const void *src, di_dtype t, size_t n) {
    switch (t) {
    case DI_DTYPE_F32: memcpy(dst, src, n * 4); break;
    case DI_DTYPE_BF16: { const uint16_t *s = src; for (size_t i = 0; i < n; i++) dst[i] = di_bf16_to_f32(s[i]); } break;
    case DI_DTYPE_F16: { const uint16_t *s = src; for (size_t i = 0; i < n; i++) dst[i] = di_f16_to_f32(s[i]); } break;
    case DI_DTYPE_F8_E4M3: { const uint8_t *s = src; for (size_t i = 0; i < n; i++) dst[i] = di_fp8e4m3_to_f32(s[i]); } break;
    case DI_DTYPE_I32: { const int32_t *s = src; for (size_t i = 0; i < n; i++) dst[i] = (float)s[i]; } break;
    case DI_DTYPE_I64: { const int64_t *s = src; for (size_t i = 0; i < n; i++) dst[i] = (float)s[i]; } break;
    case DI_DTYPE_U8: { const uint8_t *s = src; for (size_t i = 0; i < n; i++) dst[i] = (float)s[i]; } break;
    default: break;
    }
}
