/* mkmodel.h - deterministic random DeepSeek checkpoints (what `deepinfer mkmodel` writes).
 *
 * Owner: io. A checkpoint is config.json + safetensors in the exact Hub layout of
 * di_model_tensor_specs (one tensor per expert, fp32 e_score_correction_bias, optional FP8
 * 128x128 block-quantized projections with weight_scale_inv, optional MTP layer) + a tokenizer
 * (tokenizer.json + tokenizer_config.json).
 *
 * Determinism: the same config, seed and dtype give the same bytes on any machine and with any
 * thread count. Every value is produced by integer arithmetic only:
 *   key(name)  = fnv1a64(name) ^ splitmix64(seed)
 *   r(i)       = splitmix64(key + (i + 1) * 0x9e3779b97f4a7c15)            (element i, row-major)
 *   u(i)       = ((int64)(r(i) >> 40) - 2^23) * 2^-23                      (exact, in [-1, 1))
 *   value(i)   = center + (float)u(i) * (float)a                           (one rounding)
 * with (center, a) fixed per tensor role (see mkmodel.c), then rounded to bf16 by integer
 * rounding or quantized to FP8 (scale = amax/448 per block, q = fp8(value/scale), stored
 * weight_scale_inv = scale). tools/golden/mkmodel_check.py re-derives values from this spec. */
#ifndef DI_IO_MKMODEL_H
#define DI_IO_MKMODEL_H
#include <stddef.h>
#include <stdint.h>
#include "deepinfer.h"
#include "io/config.h"

#define DI_MK_AUTO_SHARD ((size_t)4 << 30)

typedef enum di_mk_dtype { DI_MK_BF16 = 0, DI_MK_F32, DI_MK_FP8 } di_mk_dtype;

typedef struct di_mkmodel_opts {
    uint64_t seed;
    di_mk_dtype dtype;          /* bf16: all bf16; f32: all f32; fp8: projections FP8, rest bf16 */
    int mtp;                    /* number of MTP layers to write (sets num_nextn_predict_layers) */
    size_t shard_bytes;         /* shards of at most this many bytes + index; 0: a single
                                   model.safetensors, or DI_MK_AUTO_SHARD shards if larger */
    const char *tokenizer_dir;  /* copy tokenizer.json + tokenizer_config.json from here (NULL:
                                   write the built-in byte-level BPE tokenizer) */
    int n_threads;              /* 0 = default */
} di_mkmodel_opts;

/* Named presets: tiny-v3, tiny-v3-nolora, tiny-v3-fp8, tiny-v3-neox, tiny-v2-lite,
 * tiny-v2-grouped, tiny-v32, demo-v3, v2lite-8l. *default_dtype is the dtype the preset implies (fp8 for
 * the *-fp8 and demo presets). */
di_status di_mkmodel_preset(const char *name, di_model_config *cfg, di_mk_dtype *default_dtype);
/* Name of preset i (0, 1, ...), NULL past the last; the preset's one-line description (NULL if
 * no such preset). */
const char *di_mkmodel_preset_name(size_t i);
const char *di_mkmodel_preset_help(const char *name);

/* Writes the checkpoint for cfg (whose fp8 / num_nextn_predict_layers fields are overridden by
 * opts) into dir (created if missing). */
di_status di_mkmodel_write(const di_model_config *cfg, const di_mkmodel_opts *opts, const char *dir);

/* Smallest vocabulary the built-in tokenizer fits in: 3 specials + 256 bytes + 17 added tokens. */
#define DI_MK_MIN_TOKENIZER_VOCAB 276
/* The tokenizer files for a vocabulary of at most vocab_size ids (byte-level BPE with merges
 * learned from a built-in text, DeepSeek-V3's pre-tokenizer and special tokens, and its chat
 * template): writes dir/tokenizer.json and dir/tokenizer_config.json. */
di_status di_mkmodel_write_tokenizer(int vocab_size, const char *dir);

/* The RNG of the spec above (exposed for tests). */
uint64_t di_mk_key(const char *name, uint64_t seed);
float di_mk_uniform(uint64_t key, uint64_t i); /* u(i) in [-1, 1) */
/* Fast float -> FP8 e4m3fn (RNE, saturating), equal to di_f32_to_fp8e4m3. */
uint8_t di_mk_f32_to_fp8(float f);
#endif
