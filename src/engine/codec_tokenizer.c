/* codec_tokenizer.c - the engine's text codec over tokenizer/tokenizer.h: prompt encoding in
 * DI_TOK_HF mode with DI_TOK_ADD_SPECIAL (BOS as tokenizer_config.json says; added tokens
 * spelled in a raw prompt become their ids, as Hugging Face encode does), and one streaming
 * detokenizer per completion (DI_TOK_SKIP_SPECIAL when skip_special_tokens). */
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "engine/codec.h"
#include "tokenizer/tokenizer.h"

/* The tokenizer module is built on another branch; until it is merged these resolve to NULL
 * and di_codec_tokenizer_create reports that the tokenizer is not built. */
#pragma weak di_tokenizer_load
#pragma weak di_tokenizer_free
#pragma weak di_tokenizer_encode
#pragma weak di_ids_free
#pragma weak di_detok_create
#pragma weak di_detok_free
#pragma weak di_detok_push
#pragma weak di_detok_flush

static di_status encode(void *ctx, const char *text, size_t len, int32_t **ids, size_t *n) {
    di_ids v = {0};
    di_status s = di_tokenizer_encode(ctx, text, len, DI_TOK_HF | DI_TOK_ADD_SPECIAL, &v);
    if (s != DI_OK) {
        di_ids_free(&v);
        return s;
    }
    *ids = v.data;
    *n = v.n;
    return DI_OK;
}

static void *detok_create(void *ctx, int skip_special) {
    return di_detok_create(ctx, skip_special ? DI_TOK_SKIP_SPECIAL : 0);
}

static di_status detok_push(void *d, int32_t id, char **buf, size_t *len, size_t *cap) {
    return di_detok_push(d, id, buf, len, cap);
}

static di_status detok_flush(void *d, char **buf, size_t *len, size_t *cap) { return di_detok_flush(d, buf, len, cap); }

static void detok_free(void *d) { di_detok_free(d); }

static void destroy(void *ctx) { di_tokenizer_free(ctx); }

di_status di_codec_tokenizer_create(const char *path, di_codec *out) {
    memset(out, 0, sizeof *out);
    if (!di_tokenizer_load || !di_tokenizer_encode || !di_detok_create)
        return di_error(DI_ERR_UNSUPPORTED, "%s: the tokenizer module is not built into this binary", path);
    di_tokenizer *t = NULL;
    DI_TRY(di_tokenizer_load(path, &t));
    out->ctx = t;
    out->encode = encode;
    out->detok_create = detok_create;
    out->detok_push = detok_push;
    out->detok_flush = detok_flush;
    out->detok_free = detok_free;
    out->destroy = destroy;
    return DI_OK;
}

void di_codec_destroy(di_codec *c) {
    if (c && c->destroy && c->ctx) c->destroy(c->ctx);
    if (c) memset(c, 0, sizeof *c);
}
