/* codec.h - the text side the engine needs: prompt text -> ids, and a streaming detokenizer
 * per completion. The real one wraps tokenizer/tokenizer.h (codec_tokenizer.c); tests plug in
 * their own. Without a codec an engine accepts only token-id prompts, produces empty text and
 * rejects stop strings.
 *
 * Owner: engine. detok_push appends only complete UTF-8 text to *buf (realloc'd, NUL-
 * terminated, *len / *cap updated); detok_flush emits held-back bytes (invalid sequences as
 * U+FFFD). encode adds BOS/EOS as the tokenizer config says and returns a malloc'd array. */
#ifndef DI_ENGINE_CODEC_H
#define DI_ENGINE_CODEC_H
#include <stddef.h>
#include <stdint.h>
#include "deepinfer.h"

typedef struct di_codec {
    void *ctx;
    di_status (*encode)(void *ctx, const char *text, size_t len, int32_t **ids, size_t *n);
    void *(*detok_create)(void *ctx, int skip_special);
    di_status (*detok_push)(void *detok, int32_t id, char **buf, size_t *len, size_t *cap);
    di_status (*detok_flush)(void *detok, char **buf, size_t *len, size_t *cap);
    void (*detok_free)(void *detok);
    void (*destroy)(void *ctx);
} di_codec;

/* A codec over the tokenizer in `path` (directory or tokenizer.json). */
di_status di_codec_tokenizer_create(const char *path, di_codec *out);
void di_codec_destroy(di_codec *c);
#endif
