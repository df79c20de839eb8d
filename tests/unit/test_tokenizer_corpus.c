/* test_tokenizer_corpus.c - bit-exactness against Hugging Face `tokenizers` on the committed
 * corpus (tests/data/tokenizer_corpus, made by tools/tokenizer/gen_corpus.py) for the real
 * DeepSeek-V3 and Qwen3 tokenizers:
 *   - HF mode ids == HF encode(text, add_special_tokens=False), for all 5,917 strings;
 *   - safe mode ids == HF with added-token matching removed, and never contain a special id;
 *   - round trip: decode(encode(text)) == text, or HF's own decode where normalization
 *     (Qwen3 NFC) changed the text, in both modes;
 *   - the streaming detokenizer fed one id at a time == decode of the whole sequence;
 *   - decode of 3,000 random id sequences (broken UTF-8, added tokens, unknown ids) ==
 *     HF decode with and without skip_special_tokens, whole and streamed. */
#include "test_util.h"
#include "tok_test_util.h"

typedef struct { const char *dir, *key; di_tokenizer *t; } di_tok_case;

static int g_reported = 0;

static void report(const char *what, const char *key, size_t line, const char *cat, const char *text, size_t tlen) {
    if (g_reported++ >= 12) return;
    fprintf(stderr, "  %s mismatch: tokenizer %s, corpus line %zu (%s): \"", what, key, line, cat ? cat : "?");
    tt_print_escaped(stderr, text, tlen, 160);
    fprintf(stderr, "\"\n");
}

static char *stream_decode(const di_tokenizer *t, const int32_t *ids, size_t n, unsigned flags, size_t *len) {
    di_detok *d = di_detok_create(t, flags);
    char *buf = NULL;
    size_t cap = 0;
    *len = 0;
    for (size_t i = 0; i < n; i++)
        if (di_detok_push(d, ids[i], &buf, len, &cap) != DI_OK) break;
    di_detok_flush(d, &buf, len, &cap);
    di_detok_free(d);
    return buf;
}

static void check_roundtrip(const di_tok_case *tc, const di_ids *ids, const json_t *rec, const char *deckey, const char *text,
                            size_t tlen, size_t line, const char *cat, int *bad_rt, int *bad_stream) {
    char *dec = NULL;
    size_t dlen = 0;
    if (di_tokenizer_decode(tc->t, ids->data, ids->n, 0, &dec, &dlen) != DI_OK) { (*bad_rt)++; return; }
    const json_t *want = json_object_get(rec, deckey);
    const char *w = want ? json_string_value(want) : text;
    size_t wl = want ? json_string_length(want) : tlen;
    if (dlen != wl || memcmp(dec, w, wl) != 0) {
        (*bad_rt)++;
        report("round-trip", tc->key, line, cat, text, tlen);
    }
    size_t slen;
    char *s = stream_decode(tc->t, ids->data, ids->n, 0, &slen);
    if (!s || slen != dlen || memcmp(s, dec, dlen) != 0) {
        (*bad_stream)++;
        report("streaming", tc->key, line, cat, text, tlen);
    }
    free(s);
    free(dec);
}

static void test_corpus(void) {
    di_tok_case cases[2] = {{"deepseek-v3", "ds", NULL}, {"qwen3", "qw", NULL}};
    json_t *corpus = tt_read_jsonl(tt_build_path("tests/data/tokenizer_corpus/corpus.jsonl"));
    CHECK(corpus != NULL);
    if (!corpus) return;
    CHECK(json_array_size(corpus) >= 5000);
    for (int k = 0; k < 2; k++) {
        di_tok_case *tc = &cases[k];
        tc->t = tt_load(tc->dir);
        CHECK(tc->t != NULL);
        if (!tc->t) continue;
        char key_safe[16], key_dec[16], key_safe_dec[24];
        snprintf(key_safe, sizeof key_safe, "%s_safe", tc->key);
        snprintf(key_dec, sizeof key_dec, "%s_dec", tc->key);
        snprintf(key_safe_dec, sizeof key_safe_dec, "%s_safe_dec", tc->key);
        int bad_hf = 0, bad_safe = 0, bad_rt = 0, bad_stream = 0, special_in_safe = 0, errors = 0;
        di_ids ids = {0};
        for (size_t i = 0; i < json_array_size(corpus); i++) {
            json_t *rec = json_array_get(corpus, i);
            const char *text = json_string_value(json_object_get(rec, "text"));
            size_t tlen = json_string_length(json_object_get(rec, "text"));
            const char *cat = json_string_value(json_object_get(rec, "cat"));
            json_t *ref = json_object_get(rec, tc->key);
            json_t *ref_safe = json_object_get(rec, key_safe);
            if (!ref_safe) ref_safe = ref;
            ids.n = 0;
            if (di_tokenizer_encode(tc->t, text, tlen, DI_TOK_HF, &ids) != DI_OK) {
                errors++;
                fprintf(stderr, "  encode error on line %zu: %s\n", i + 1, di_last_error());
                continue;
            }
            if (!tt_ids_equal(&ids, ref)) {
                bad_hf++;
                report("HF-mode ids", tc->key, i + 1, cat, text, tlen);
                if (g_reported <= 12) tt_print_diff(stderr, &ids, ref);
            }
            check_roundtrip(tc, &ids, rec, key_dec, text, tlen, i + 1, cat, &bad_rt, &bad_stream);
            ids.n = 0;
            if (di_tokenizer_encode(tc->t, text, tlen, DI_TOK_SAFE, &ids) != DI_OK) { errors++; continue; }
            if (!tt_ids_equal(&ids, ref_safe)) {
                bad_safe++;
                report("safe-mode ids", tc->key, i + 1, cat, text, tlen);
                if (g_reported <= 12) tt_print_diff(stderr, &ids, ref_safe);
            }
            for (size_t q = 0; q < ids.n; q++) special_in_safe += di_tokenizer_is_special(tc->t, ids.data[q]) != 0;
            check_roundtrip(tc, &ids, rec, key_safe_dec, text, tlen, i + 1, cat, &bad_rt, &bad_stream);
        }
        fprintf(stderr, "%s: %zu strings: HF-mode mismatches %d, safe-mode mismatches %d, round-trip %d, streaming %d, "
                "special ids in safe mode %d, errors %d\n", tc->key, json_array_size(corpus), bad_hf, bad_safe, bad_rt,
                bad_stream, special_in_safe, errors);
        CHECK_EQ_INT(bad_hf, 0);
        CHECK_EQ_INT(bad_safe, 0);
        CHECK_EQ_INT(bad_rt, 0);
        CHECK_EQ_INT(bad_stream, 0);
        CHECK_EQ_INT(special_in_safe, 0);
        CHECK_EQ_INT(errors, 0);
        di_ids_free(&ids);
    }
    /* decode of random id sequences */
    json_t *dec = tt_read_jsonl(tt_build_path("tests/data/tokenizer_corpus/decode.jsonl"));
    CHECK(dec != NULL);
    int bad = 0, bad_stream = 0, n = 0;
    for (size_t i = 0; dec && i < json_array_size(dec); i++) {
        json_t *rec = json_array_get(dec, i);
        const char *key = json_string_value(json_object_get(rec, "tok"));
        di_tokenizer *t = !strcmp(key, "ds") ? cases[0].t : cases[1].t;
        if (!t) continue;
        json_t *arr = json_object_get(rec, "ids");
        di_ids ids = {0};
        for (size_t q = 0; q < json_array_size(arr); q++) di_ids_push(&ids, (int32_t)json_integer_value(json_array_get(arr, q)));
        for (int skip = 0; skip < 2; skip++) {
            json_t *want = json_object_get(rec, skip ? "text_skip" : "text");
            unsigned flags = skip ? DI_TOK_SKIP_SPECIAL : 0;
            char *out = NULL;
            size_t len = 0;
            n++;
            if (di_tokenizer_decode(t, ids.data, ids.n, flags, &out, &len) != DI_OK || len != json_string_length(want) ||
                memcmp(out, json_string_value(want), len) != 0) {
                if (bad++ < 5) {
                    fprintf(stderr, "  decode mismatch (line %zu, skip %d): got \"", i + 1, skip);
                    tt_print_escaped(stderr, out ? out : "", out ? len : 0, 200);
                    fprintf(stderr, "\"\n");
                }
            }
            size_t slen;
            char *s = stream_decode(t, ids.data, ids.n, flags, &slen);
            if (!s || !out || slen != len || memcmp(s, out, len) != 0) bad_stream++;
            free(s);
            free(out);
        }
        di_ids_free(&ids);
    }
    fprintf(stderr, "decode: %d checks, %d mismatches, %d streaming mismatches\n", n, bad, bad_stream);
    CHECK(n >= 6000);
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(bad_stream, 0);
    json_decref(dec);
    json_decref(corpus);
    for (int k = 0; k < 2; k++) di_tokenizer_free(cases[k].t);
}

TEST_MAIN(test_corpus)
