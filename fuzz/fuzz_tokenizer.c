/* fuzz_tokenizer.c - libFuzzer target for the tokenizer (see fuzz/Makefile).
 *
 * Input byte 0 picks the tokenizer (DeepSeek-V3 / Qwen3) and the test; the rest is the payload.
 *   text:  encode in HF and safe mode. Invalid UTF-8 must be rejected with DI_ERR_FORMAT and
 *          nothing appended. Valid UTF-8 must round-trip: decode(encode(s)) == s for DeepSeek-V3
 *          (no normalizer), and for Qwen3 (NFC) decode(encode(s)) must be a fixed point of
 *          encode+decode; the streaming detokenizer must equal decode; segment-parallel encoding
 *          with tiny work sizes must equal serial encoding.
 *   ids:   payload bytes as little-endian u16/u24 ids: decode and streaming decode agree, with and
 *          without skipping special tokens, and the output is valid UTF-8.
 *   json:  the payload as a tokenizer.json: loading fails cleanly or the tokenizer encodes a
 *          short string without crashing.
 * Tokenizers come from $DI_FUZZ_TOKENIZERS (default build/tests/data/tokenizers). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/threadpool.h"
#include "core/utf8.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/tokenizer.h"

static di_tokenizer *g_tok[2];
static di_threadpool *g_pool;

static void die(const char *what) {
    fprintf(stderr, "fuzz_tokenizer: %s (%s)\n", what, di_last_error());
    abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    const char *dir = getenv("DI_FUZZ_TOKENIZERS");
    if (!dir) dir = "build/tests/data/tokenizers";
    const char *names[2] = {"deepseek-v3", "qwen3"};
    for (int i = 0; i < 2; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (di_tokenizer_load(path, &g_tok[i]) != DI_OK) die("cannot load the tokenizers; set DI_FUZZ_TOKENIZERS");
    }
    g_pool = di_threadpool_create(2);
    di_tok_parallel_set_sizes(1, 24, 24, 16);
    return 0;
}

static char *decode(const di_tokenizer *t, const di_ids *ids, unsigned flags, size_t *len) {
    char *out = NULL;
    if (di_tokenizer_decode(t, ids->data, ids->n, flags, &out, len) != DI_OK) die("decode failed");
    return out;
}

static char *stream(const di_tokenizer *t, const di_ids *ids, unsigned flags, size_t *len) {
    di_detok *d = di_detok_create(t, flags);
    char *buf = NULL;
    size_t cap = 0;
    *len = 0;
    for (size_t i = 0; i < ids->n; i++)
        if (di_detok_push(d, ids->data[i], &buf, len, &cap) != DI_OK) die("detok push failed");
    if (di_detok_flush(d, &buf, len, &cap) != DI_OK) die("detok flush failed");
    di_detok_free(d);
    return buf;
}

static void check_text(int k, const char *s, size_t n) {
    const di_tokenizer *t = g_tok[k];
    int valid = di_utf8_valid(s, n, NULL);
    for (int safe = 0; safe < 2; safe++) {
        unsigned flags = safe ? DI_TOK_SAFE : DI_TOK_HF;
        di_ids ids = {0}, par = {0};
        di_status st = di_tokenizer_encode(t, s, n, flags, &ids);
        if (!valid) {
            if (st != DI_ERR_FORMAT || ids.n) die("invalid UTF-8 not rejected cleanly");
            continue;
        }
        if (st != DI_OK) die("encode failed on valid UTF-8");
        if (di_tokenizer_encode_parallel(t, s, n, flags, g_pool, &par) != DI_OK) die("parallel encode failed");
        if (par.n != ids.n || (ids.n && memcmp(par.data, ids.data, ids.n * sizeof *ids.data))) die("parallel != serial");
        size_t dl, sl;
        char *d = decode(t, &ids, 0, &dl), *sd = stream(t, &ids, 0, &sl);
        if (dl != sl || memcmp(d, sd, dl)) die("streaming != decode");
        if (k == 0 && (dl != n || memcmp(d, s, n))) die("round trip failed (DeepSeek-V3)");
        if (k == 1) { /* NFC text: encode+decode is idempotent */
            di_ids again = {0};
            size_t l2;
            if (di_tokenizer_encode(t, d, dl, flags, &again) != DI_OK) die("re-encode failed");
            char *d2 = decode(t, &again, 0, &l2);
            if (l2 != dl || memcmp(d2, d, dl)) die("round trip not idempotent (Qwen3)");
            free(d2);
            di_ids_free(&again);
        }
        if (safe)
            for (size_t i = 0; i < ids.n; i++)
                if (di_tokenizer_is_added(t, ids.data[i])) die("safe mode produced an added token");
        free(d);
        free(sd);
        di_ids_free(&ids);
        di_ids_free(&par);
    }
}

static void check_ids(int k, const uint8_t *p, size_t n) {
    const di_tokenizer *t = g_tok[k];
    di_ids ids = {0};
    for (size_t i = 0; i + 2 < n; i += 3) di_ids_push(&ids, (int32_t)(p[i] | p[i + 1] << 8 | (p[i + 2] & 3) << 16) - 1000);
    for (int skip = 0; skip < 2; skip++) {
        unsigned flags = skip ? DI_TOK_SKIP_SPECIAL : 0;
        size_t dl, sl;
        char *d = decode(t, &ids, flags, &dl), *sd = stream(t, &ids, flags, &sl);
        if (dl != sl || memcmp(d, sd, dl)) die("streaming != decode (ids)");
        if (!di_utf8_valid(d, dl, NULL)) die("decode produced invalid UTF-8");
        free(d);
        free(sd);
    }
    di_ids_free(&ids);
}

static void check_json(const char *s, size_t n) {
    di_tokenizer *t = NULL;
    if (di_tokenizer_load_json(s, n, "fuzz.json", &t) != DI_OK) return;
    di_ids ids = {0};
    di_tokenizer_encode(t, "Hello, world! 123 <s>", 21, DI_TOK_ADD_SPECIAL, &ids);
    char *out = NULL;
    if (di_tokenizer_decode(t, ids.data, ids.n, 0, &out, NULL) != DI_OK) die("decode failed (json)");
    free(out);
    di_ids_free(&ids);
    di_tokenizer_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int k = data[0] & 1, test = (data[0] >> 1) % 8;
    const char *s = (const char *)data + 1;
    size_t n = size - 1;
    if (test < 6) check_text(k, s, n);
    else if (test == 6) check_ids(k, data + 1, n);
    else check_json(s, n);
    return 0;
}
