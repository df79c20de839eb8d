/* dtype.h - element types and exact host conversions between them.
 *
 * F8_E4M3 is float8_e4m3fn (1 sign, 4 exponent bits with bias 7, 3 mantissa bits, no inf,
 * 0x7f/0xff = NaN, max 448). Conversions to float are exact; float -> bf16/f16/fp8 round to
 * nearest even (fp8 saturates to +-448, as DeepSeek's quantizer clamps first). */
#ifndef DI_CORE_DTYPE_H
#define DI_CORE_DTYPE_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum di_dtype {
    DI_DTYPE_F32 = 0,
    DI_DTYPE_BF16,
    DI_DTYPE_F16,
    DI_DTYPE_F8_E4M3,
    DI_DTYPE_I32,
    DI_DTYPE_I64,
    DI_DTYPE_U8,
    DI_DTYPE_COUNT
} di_dtype;

size_t di_dtype_size(di_dtype t);
const char *di_dtype_name(di_dtype t);          /* safetensors spelling: "F32", "BF16", ... */
int di_dtype_from_name(const char *name, di_dtype *out); /* 1 if known */

static inline float di_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t di_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
float di_f16_to_f32(uint16_t h);
uint16_t di_f32_to_f16(float f);
float di_fp8e4m3_to_f32(uint8_t v);
uint8_t di_f32_to_fp8e4m3(float f);

/* Converts n elements of type `src_t` to float. */
void di_convert_to_f32(float *dst, const void *src, di_dtype src_t, size_t n);
#endif
