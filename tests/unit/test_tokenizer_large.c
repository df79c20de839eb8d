/* test_tokenizer_large.c - ~1 MB inputs (tests/data/tokenizer_corpus/large.jsonl: mixed text,
 * prose, code, CJK, special-token text, 1 MB of spaces, digits, whitespace/newlines) encoded by
 * the real DeepSeek-V3 and Qwen3 tokenizers in HF and safe modes: the id count and FNV-1a hash
 * must equal Hugging Face's, and segment-parallel encoding on 2 and 3 threads must give the
 * same ids as serial encoding. Under AddressSanitizer (about 10x slower) the 3-thread run and
 * the safe mode of inputs without added-token text are left out to keep the test short. */
#include "core/threadpool.h"
#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#else
#define SANITIZED 0
#endif
#include "core/timer.h"
#include "test_util.h"
#include "tok_test_util.h"

static char *build_input(const json_t *rec, const json_t *corpus, size_t *len) {
    size_t cap = 1 << 21, n = 0;
    char *buf = malloc(cap);
    const json_t *rep = json_object_get(rec, "repeat");
    if (rep) {
        size_t count = (size_t)json_integer_value(json_object_get(rec, "count"));
        size_t rl = json_string_length(rep);
        buf = realloc(buf, rl * count + 1);
        for (size_t i = 0; i < count; i++) memcpy(buf + i * rl, json_string_value(rep), rl);
        *len = rl * count;
        return buf;
    }
    const char *sep = json_string_value(json_object_get(rec, "sep"));
    size_t sl = strlen(sep);
    const json_t *parts = json_object_get(rec, "parts");
    for (size_t i = 0; i < json_array_size(parts); i++) {
        const json_t *s = json_object_get(json_array_get(corpus, (size_t)json_integer_value(json_array_get(parts, i))), "text");
        size_t l = json_string_length(s);
        if (n + l + sl + 1 > cap) { while (n + l + sl + 1 > cap) cap *= 2; buf = realloc(buf, cap); }
        if (i) { memcpy(buf + n, sep, sl); n += sl; }
        memcpy(buf + n, json_string_value(s), l);
        n += l;
    }
    *len = n;
    return buf;
}

static void test_large(void) {
    json_t *corpus = tt_read_jsonl(tt_build_path("tests/data/tokenizer_corpus/corpus.jsonl"));
    json_t *large = tt_read_jsonl(tt_build_path("tests/data/tokenizer_corpus/large.jsonl"));
    CHECK(corpus && large);
    if (!corpus || !large) return;
    CHECK(json_array_size(large) >= 5);
    const char *dirs[2] = {"deepseek-v3", "qwen3"}, *keys[2] = {"ds", "qw"};
    di_threadpool *pools[2] = {di_threadpool_create(2), di_threadpool_create(3)};
    for (int k = 0; k < 2; k++) {
        di_tokenizer *t = tt_load(dirs[k]);
        CHECK(t != NULL);
        if (!t) continue;
        for (size_t r = 0; r < json_array_size(large); r++) {
            json_t *rec = json_array_get(large, r);
            size_t len;
            char *text = build_input(rec, corpus, &len);
            CHECK_EQ_INT(len, json_integer_value(json_object_get(rec, "bytes")));
            const char *rname = json_string_value(json_object_get(rec, "name"));
            int with_specials = !strcmp(rname, "mixed") || !strcmp(rname, "special");
            for (int safe = 0; safe < 2; safe++) {
                if (SANITIZED && safe && !with_specials) continue;
                char key[16];
                snprintf(key, sizeof key, "%s%s", keys[k], safe ? "_safe" : "");
                json_t *ref = json_object_get(rec, key);
                unsigned flags = safe ? DI_TOK_SAFE : DI_TOK_HF;
                di_ids ser = {0}, par = {0};
                double t0 = di_now_s();
                CHECK_OK(di_tokenizer_encode(t, text, len, flags, &ser));
                double t1 = di_now_s();
                char hash[32];
                snprintf(hash, sizeof hash, "%016llx", tt_fnv64(ser.data, ser.n));
                const char *name = json_string_value(json_object_get(rec, "name"));
                CHECK_MSG(ser.n == (size_t)json_integer_value(json_object_get(ref, "n")) &&
                              !strcmp(hash, json_string_value(json_object_get(ref, "fnv64"))),
                          "%s %s: %zu ids hash %s, HF %lld ids hash %s", key, name, ser.n, hash,
                          (long long)json_integer_value(json_object_get(ref, "n")), json_string_value(json_object_get(ref, "fnv64")));
                for (int p = 0; p < (SANITIZED ? 1 : 2); p++) {
                    par.n = 0;
                    CHECK_OK(di_tokenizer_encode_parallel(t, text, len, flags, pools[p], &par));
                    CHECK_MSG(par.n == ser.n && !memcmp(par.data, ser.data, ser.n * sizeof *ser.data),
                              "%s %s: parallel (%d threads) differs from serial", key, name, di_threadpool_size(pools[p]));
                }
                fprintf(stderr, "  %-8s %-3s %-4s %8zu bytes -> %7zu ids, serial %.1f MB/s\n", name, keys[k],
                        safe ? "safe" : "hf", len, ser.n, len / (t1 - t0) / 1e6);
                di_ids_free(&ser);
                di_ids_free(&par);
            }
            free(text);
        }
        di_tokenizer_free(t);
    }
    di_threadpool_free(pools[0]);
    di_threadpool_free(pools[1]);
    json_decref(corpus);
    json_decref(large);
}

TEST_MAIN(test_large)
