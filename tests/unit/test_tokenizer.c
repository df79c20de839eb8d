/* test_tokenizer.c - the tokenizer API beyond the corpus: lookups and flags of the real
 * DeepSeek-V3 / Qwen3 tokenizers (expected values from HF `tokenizers`), BOS/EOS, invalid UTF-8
 * and bad flags, the streaming detokenizer (never emits a partial character), decode of ids
 * with no token, concurrent encoding from several threads, segment-parallel encoding with tiny
 * work sizes (chunk boundaries at every kind of place) compared with serial encoding, and
 * clear errors for malformed or unsupported tokenizer.json files. */
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/threadpool.h"
#include "core/utf8.h"
#include "test_util.h"
#include "tok_test_util.h"
#include "tokenizer/tok_internal.h"

static di_tokenizer *g_ds, *g_qw;

static int has(const char *msg, const char *needle) { return msg && strstr(msg, needle) != NULL; }

static void test_lookups(void) {
    CHECK(g_ds && g_qw);
    if (!g_ds || !g_qw) return;
    /* values from HF: get_vocab_size(with_added_tokens=True), token_to_id, added_tokens_decoder */
    CHECK_EQ_INT(di_tokenizer_vocab_size(g_ds), 128815);
    CHECK_EQ_INT(di_tokenizer_vocab_size(g_qw), 151669);
    CHECK_EQ_INT(di_tokenizer_token_id(g_ds, "<｜User｜>"), 128803);
    CHECK_EQ_INT(di_tokenizer_token_id(g_ds, "<｜Assistant｜>"), 128804);
    CHECK_EQ_INT(di_tokenizer_token_id(g_ds, "<｜tool▁calls▁begin｜>"), 128806);
    CHECK_EQ_INT(di_tokenizer_token_id(g_ds, "<｜begin▁of▁sentence｜>"), 0);
    CHECK_EQ_INT(di_tokenizer_token_id(g_ds, "Hello"), 19923);
    CHECK_EQ_INT(di_tokenizer_token_id(g_ds, "</think>"), -1);
    CHECK_EQ_INT(di_tokenizer_token_id(g_ds, ""), -1);
    CHECK_EQ_INT(di_tokenizer_token_id(g_ds, NULL), -1);
    CHECK_EQ_INT(di_tokenizer_token_id(g_qw, "<|im_start|>"), 151644);
    CHECK_EQ_INT(di_tokenizer_token_id(g_qw, "<|im_end|>"), 151645);
    CHECK_EQ_INT(di_tokenizer_token_id(g_qw, "</think>"), 151668);
    CHECK_EQ_INT(di_tokenizer_token_id(g_qw, "Hello"), 9707);
    /* special=true / false as in tokenizer.json: DeepSeek's <｜User｜> is an added, non-special token */
    CHECK(di_tokenizer_is_added(g_ds, 128803) && !di_tokenizer_is_special(g_ds, 128803));
    CHECK(di_tokenizer_is_special(g_ds, 0) && di_tokenizer_is_special(g_ds, 128805));
    CHECK(!di_tokenizer_is_added(g_ds, 19923) && !di_tokenizer_is_special(g_ds, 19923));
    CHECK(di_tokenizer_is_special(g_qw, 151645) && !di_tokenizer_is_special(g_qw, 151668) && di_tokenizer_is_added(g_qw, 151668));
    CHECK(!di_tokenizer_is_special(g_qw, -1) && !di_tokenizer_is_special(g_qw, 1 << 30));
    CHECK_EQ_STR(di_tokenizer_token_str(g_ds, 0), "<｜begin▁of▁sentence｜>");
    CHECK_EQ_STR(di_tokenizer_token_str(g_ds, 2058), "Ġworld");
    CHECK_EQ_STR(di_tokenizer_token_str(g_qw, 151668), "</think>");
    CHECK(di_tokenizer_token_str(g_ds, -5) == NULL && di_tokenizer_token_str(g_ds, 128815) == NULL);
    /* tokenizer_config.json */
    CHECK_EQ_INT(di_tokenizer_bos_id(g_ds), 0);
    CHECK_EQ_INT(di_tokenizer_eos_id(g_ds), 1);
    CHECK_EQ_INT(di_tokenizer_bos_id(g_qw), -1);
    CHECK_EQ_INT(di_tokenizer_eos_id(g_qw), 151645);
    CHECK(di_tokenizer_chat_template(g_ds) && has(di_tokenizer_chat_template(g_ds), "<｜User｜>"));
    CHECK(di_tokenizer_chat_template(g_qw) && has(di_tokenizer_chat_template(g_qw), "<|im_start|>"));
}

static void test_special_and_flags(void) {
    if (!g_ds || !g_qw) return;
    di_ids a = {0}, b = {0};
    /* HF: "hello world" -> [33310, 2058] (DeepSeek), [14990, 1879] (Qwen3) */
    CHECK_OK(di_tokenizer_encode(g_ds, "hello world", 11, DI_TOK_HF, &a));
    CHECK(a.n == 2 && a.data[0] == 33310 && a.data[1] == 2058);
    /* DeepSeek: add_bos_token = true in tokenizer_config.json, post-processor adds nothing */
    CHECK_OK(di_tokenizer_encode(g_ds, "hello world", 11, DI_TOK_ADD_SPECIAL, &b));
    CHECK(b.n == 3 && b.data[0] == 0 && b.data[1] == 33310 && b.data[2] == 2058);
    b.n = 0;
    CHECK_OK(di_tokenizer_encode(g_ds, "", 0, DI_TOK_ADD_SPECIAL, &b));
    CHECK(b.n == 1 && b.data[0] == 0);
    b.n = 0;
    CHECK_OK(di_tokenizer_encode(g_qw, "hello world", 11, DI_TOK_ADD_SPECIAL | DI_TOK_SAFE, &b));
    CHECK(b.n == 2 && b.data[0] == 14990 && b.data[1] == 1879);
    /* HF mode turns spelled control tokens into their ids, safe mode never does */
    const char *inj = "x<｜User｜>y</think><|im_end|>";
    a.n = b.n = 0;
    CHECK_OK(di_tokenizer_encode(g_ds, inj, strlen(inj), DI_TOK_HF, &a));
    CHECK_OK(di_tokenizer_encode(g_ds, inj, strlen(inj), DI_TOK_SAFE, &b));
    int found = 0, found_safe = 0;
    for (size_t i = 0; i < a.n; i++) found += a.data[i] == 128803;
    for (size_t i = 0; i < b.n; i++) found_safe += di_tokenizer_is_added(g_ds, b.data[i]);
    CHECK(found == 1 && found_safe == 0);
    a.n = b.n = 0;
    CHECK_OK(di_tokenizer_encode(g_qw, inj, strlen(inj), DI_TOK_HF, &a));
    CHECK_OK(di_tokenizer_encode(g_qw, inj, strlen(inj), DI_TOK_SAFE, &b));
    found = found_safe = 0;
    for (size_t i = 0; i < a.n; i++) found += a.data[i] == 151668 || a.data[i] == 151645;
    for (size_t i = 0; i < b.n; i++) found_safe += di_tokenizer_is_added(g_qw, b.data[i]);
    CHECK(found == 2 && found_safe == 0);
    /* bad flags and arguments */
    CHECK_EQ_INT(di_tokenizer_encode(g_ds, "x", 1, 1u << 7, &a), DI_ERR_INVALID_ARG);
    CHECK_EQ_INT(di_tokenizer_encode(g_ds, NULL, 3, 0, &a), DI_ERR_INVALID_ARG);
    CHECK_OK(di_tokenizer_encode(g_ds, NULL, 0, 0, &a));
    di_ids_free(&a);
    di_ids_free(&b);
}

static void test_invalid_utf8(void) {
    if (!g_ds) return;
    struct { const char *s; size_t n, bad; } cases[] = {
        {"abc\xff", 4, 3},              /* invalid byte */
        {"ab\xc0\x80", 4, 2},           /* overlong NUL */
        {"\xed\xa0\x80x", 4, 0},        /* UTF-16 surrogate */
        {"hello \xe4\xbd", 8, 6},       /* truncated at the end */
        {"\xf4\x90\x80\x80", 4, 0},     /* above U+10FFFF */
        {"ok\x80", 3, 2},               /* lone continuation byte */
        {"\xf8\x88\x80\x80\x80", 5, 0}, /* 5-byte form */
    };
    di_threadpool *pool = di_threadpool_create(2);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        di_ids ids = {0};
        di_ids_push(&ids, 42); /* existing content must stay untouched */
        char want[64];
        snprintf(want, sizeof want, "byte offset %zu", cases[i].bad);
        for (int mode = 0; mode < 3; mode++) {
            di_status st = mode < 2 ? di_tokenizer_encode(g_ds, cases[i].s, cases[i].n, mode ? DI_TOK_SAFE : DI_TOK_HF, &ids)
                                    : di_tokenizer_encode_parallel(g_ds, cases[i].s, cases[i].n, DI_TOK_ADD_SPECIAL, pool, &ids);
            CHECK_EQ_INT(st, DI_ERR_FORMAT);
            CHECK_MSG(has(di_last_error(), want) && has(di_last_error(), "UTF-8"), "case %zu: %s", i, di_last_error());
            CHECK(ids.n == 1 && ids.data[0] == 42);
        }
        di_ids_free(&ids);
    }
    /* long inputs (validated in parallel chunks): the first bad byte wherever it falls */
    size_t big = 300000;
    char *txt = malloc(big);
    for (size_t i = 0; i < big; i++) txt[i] = "ab \xc3\xa9"[i % 5]; /* "ab é" repeated, valid */
    size_t at[] = {0, 1, 37500, 37501, 37502, 74999, 150000, big - 2, big - 1};
    for (size_t k = 0; k < sizeof at / sizeof at[0]; k++) {
        char save = txt[at[k]], save2 = txt[at[k] / 2];
        txt[at[k]] = (char)0xff;
        if (k == 4) txt[at[k] / 2] = (char)0x80; /* two bad bytes: the first one counts */
        size_t first = 0; /* reference: core's validator */
        CHECK(!di_utf8_valid(txt, big, &first));
        di_ids ids = {0};
        char want[64];
        snprintf(want, sizeof want, "byte offset %zu", first);
        CHECK_EQ_INT(di_tokenizer_encode_parallel(g_ds, txt, big, DI_TOK_HF, pool, &ids), DI_ERR_FORMAT);
        CHECK_MSG(has(di_last_error(), want) && ids.n == 0, "%s", di_last_error());
        txt[at[k]] = save;
        txt[at[k] / 2] = save2;
        di_ids_free(&ids);
    }
    di_ids ok = {0};
    CHECK_OK(di_tokenizer_encode_parallel(g_ds, txt, big, DI_TOK_HF, pool, &ok));
    di_ids_free(&ok);
    free(txt);
    di_threadpool_free(pool);
}

static int valid_utf8(const char *s, size_t n) { return di_utf8_valid(s, n, NULL); }

static void test_streaming(void) {
    if (!g_ds || !g_qw) return;
    di_tokenizer *toks[2] = {g_ds, g_qw};
    /* HF: "👍🏽 日本 x" -> DeepSeek [92526, 40965, 124, 223, 6392, 1527]: the skin tone modifier is
     * split over two byte-level tokens */
    const char *text = "👍🏽 日本 x <｜User｜> \xe2\x80\x8d";
    for (int k = 0; k < 2; k++) {
        di_ids ids = {0};
        CHECK_OK(di_tokenizer_encode(toks[k], text, strlen(text), DI_TOK_HF, &ids));
        if (k == 0) CHECK(ids.n > 4 && ids.data[0] == 92526 && ids.data[1] == 40965 && ids.data[2] == 124);
        di_detok *d = di_detok_create(toks[k], 0);
        char *buf = NULL;
        size_t len = 0, cap = 0, prev = 0;
        int partial = 0;
        for (size_t i = 0; i < ids.n; i++) {
            CHECK_OK(di_detok_push(d, ids.data[i], &buf, &len, &cap));
            partial += !valid_utf8(buf + prev, len - prev);
            prev = len;
        }
        CHECK_OK(di_detok_flush(d, &buf, &len, &cap));
        CHECK_EQ_INT(partial, 0);
        CHECK(len == strlen(text) && !memcmp(buf, text, len));
        di_detok_free(d);
        free(buf);
        di_ids_free(&ids);
    }
    /* random byte tokens: every chunk the streamer emits is valid UTF-8, and the whole equals decode */
    unsigned long long rng = 88172645463325252ull;
    for (int round = 0; round < 200; round++) {
        di_ids ids = {0};
        for (int i = 0; i < 30; i++) {
            rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
            /* DeepSeek ids < 256 are mostly single byte-level characters */
            di_ids_push(&ids, (int32_t)(rng % 7 == 0 ? rng % 128815 : rng % 256));
        }
        di_ids_push(&ids, 1 << 30); /* no such token: dropped */
        di_ids_push(&ids, -3);
        for (int skip = 0; skip < 2; skip++) {
            unsigned flags = skip ? DI_TOK_SKIP_SPECIAL : 0;
            char *whole = NULL, *buf = NULL;
            size_t wl = 0, len = 0, cap = 0, prev = 0;
            int partial = 0;
            CHECK_OK(di_tokenizer_decode(g_ds, ids.data, ids.n, flags, &whole, &wl));
            di_detok *d = di_detok_create(g_ds, flags);
            for (size_t i = 0; i < ids.n; i++) {
                di_detok_push(d, ids.data[i], &buf, &len, &cap);
                partial += !valid_utf8(buf + prev, len - prev);
                prev = len;
            }
            di_detok_flush(d, &buf, &len, &cap);
            di_detok_free(d);
            CHECK_EQ_INT(partial, 0);
            CHECK(valid_utf8(whole, wl));
            CHECK(len == wl && !memcmp(buf, whole, wl));
            free(whole);
            free(buf);
        }
        di_ids_free(&ids);
    }
    /* flush of a held incomplete character: one U+FFFD (HF's from_utf8_lossy) */
    int32_t half[1] = {di_tok_vocab_lookup(g_ds, "ð", 2)}; /* byte 0xF0 */
    char *out = NULL;
    size_t ol = 0;
    CHECK(half[0] >= 0);
    CHECK_OK(di_tokenizer_decode(g_ds, half, 1, 0, &out, &ol));
    CHECK_EQ_STR(out, "\xef\xbf\xbd");
    free(out);
    di_detok_free(NULL);
}

/* ---- concurrency ---- */
typedef struct { const di_tokenizer *t; const char *text; size_t len; di_ids *want; int bad; } th_arg;

static void *encode_many(void *p) {
    th_arg *a = p;
    for (int r = 0; r < 20; r++) {
        di_ids ids = {0};
        if (di_tokenizer_encode(a->t, a->text, a->len, DI_TOK_HF, &ids) != DI_OK || ids.n != a->want->n ||
            memcmp(ids.data, a->want->data, ids.n * sizeof *ids.data) != 0)
            a->bad++;
        di_ids_free(&ids);
    }
    return NULL;
}

static void test_threads(void) {
    if (!g_qw) return;
    const char *text = "Concurrent encoding: 你好，世界！ 12345 <|im_start|>user\nhi<|im_end|> 👍🏽 café";
    di_ids want = {0};
    CHECK_OK(di_tokenizer_encode(g_qw, text, strlen(text), DI_TOK_HF, &want));
    pthread_t th[6];
    th_arg args[6];
    for (int i = 0; i < 6; i++) {
        args[i] = (th_arg){g_qw, text, strlen(text), &want, 0};
        pthread_create(&th[i], NULL, encode_many, &args[i]);
    }
    int bad = 0;
    for (int i = 0; i < 6; i++) {
        pthread_join(th[i], NULL);
        bad += args[i].bad;
    }
    CHECK_EQ_INT(bad, 0);
    di_ids_free(&want);
}

/* ---- segment-parallel with tiny work sizes ---- */
static void append(di_tok_buf *b, const char *s) { di_tok_buf_put(b, s, strlen(s)); }

static void test_parallel_tricky(void) {
    if (!g_ds || !g_qw) return;
    json_t *corpus = tt_read_jsonl(tt_build_path("tests/data/tokenizer_corpus/corpus.jsonl"));
    CHECK(corpus != NULL);
    if (!corpus) return;
    static const char *bits[] = {
        " ", "  ", "   \n", "\n\n", "\r\n", "\t", "1", "12", "123", "1234", "日本", "語", "한국", "abc", "Hello",
        " world", "'s", "!!", "<｜User｜>", "<|im_end|>", "</think>", "\xe2\x80\x8d", "👍🏽", "ـ", "e\xcc\x81", "\xc2\xa0",
        "\xe3\x80\x80", "<｜", "｜>", "1️⃣", "٣٤٥", "Ⅻ", "\xef\xbb\xbf"};
    di_tokenizer *toks[2] = {g_ds, g_qw};
    di_threadpool *pools[2] = {di_threadpool_create(2), di_threadpool_create(3)};
    /* work sizes small enough to put chunk and task boundaries everywhere */
    size_t sizes[3][4] = {{1, 16, 16, 8}, {1, 64, 48, 32}, {1, 300, 200, 100}};
    unsigned long long rng = 0x9e3779b97f4a7c15ull;
    int bad = 0, runs = 0;
    for (int round = 0; round < 60; round++) {
        di_tok_buf b = {0};
        int pieces = 20 + round * 4;
        for (int i = 0; i < pieces; i++) {
            rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
            if (rng % 5 == 0) {
                json_t *t = json_object_get(json_array_get(corpus, rng % json_array_size(corpus)), "text");
                di_tok_buf_put(&b, json_string_value(t), json_string_length(t) > 300 ? 300 : json_string_length(t));
                /* cut at a character start so the input stays valid UTF-8 */
                while (b.n && (b.p[b.n - 1] & 0xc0) == 0x80) b.n--;
                if (b.n && (unsigned char)b.p[b.n - 1] >= 0xc0) b.n--;
            } else if (rng % 7 == 0) {
                for (int k = 0; k < (int)(rng % 90); k++) append(&b, rng % 2 ? " " : "9"); /* long runs */
            } else {
                append(&b, bits[rng % (sizeof bits / sizeof bits[0])]);
            }
        }
        if (!di_utf8_valid(b.p, b.n, NULL)) { di_tok_buf_free(&b); continue; }
        for (int k = 0; k < 2; k++) {
            for (int safe = 0; safe < 2; safe++) {
                di_ids ser = {0};
                unsigned flags = safe ? DI_TOK_SAFE : DI_TOK_HF;
                CHECK_OK(di_tokenizer_encode(toks[k], b.p, b.n, flags, &ser));
                for (int z = 0; z < 3; z++) {
                    di_tok_parallel_set_sizes(sizes[z][0], sizes[z][1], sizes[z][2], sizes[z][3]);
                    di_ids par = {0};
                    CHECK_OK(di_tokenizer_encode_parallel(toks[k], b.p, b.n, flags, pools[(round + z) % 2], &par));
                    runs++;
                    if (par.n != ser.n || memcmp(par.data, ser.data, ser.n * sizeof *ser.data) != 0) {
                        if (bad++ < 3) {
                            fprintf(stderr, "  parallel != serial (tokenizer %d, safe %d, sizes %d): \"", k, safe, z);
                            tt_print_escaped(stderr, b.p, b.n, 200);
                            fprintf(stderr, "\"\n");
                        }
                    }
                    di_ids_free(&par);
                }
                di_tok_parallel_set_sizes(0, 0, 0, 0);
                di_ids_free(&ser);
            }
        }
        di_tok_buf_free(&b);
    }
    fprintf(stderr, "parallel vs serial: %d runs, %d differences\n", runs, bad);
    CHECK(runs > 500);
    CHECK_EQ_INT(bad, 0);
    di_threadpool_free(pools[0]);
    di_threadpool_free(pools[1]);
    json_decref(corpus);
}

/* ---- malformed and unsupported files ---- */
static char g_tmpdir[512];

static const char *BASE =
    "{\"version\":\"1.0\",\"added_tokens\":[{\"id\":4,\"content\":\"<s>\",\"special\":true,\"normalized\":false}],"
    "\"normalizer\":NORM,\"pre_tokenizer\":PRE,\"post_processor\":null,\"decoder\":DEC,"
    "\"model\":{\"type\":TYPE,\"dropout\":DROP,\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\" \":3},\"merges\":MERGES}}";

static char *subst(const char *tmpl, const char *key, const char *val) {
    const char *at = strstr(tmpl, key);
    size_t n = strlen(tmpl) - strlen(key) + strlen(val) + 1;
    char *out = malloc(n);
    snprintf(out, n, "%.*s%s%s", (int)(at - tmpl), tmpl, val, at + strlen(key));
    return out;
}

/* Builds BASE with the given components and loads it; returns the status. */
static di_status load_variant(const char *norm, const char *pre, const char *dec, const char *type, const char *drop,
                              const char *merges, di_tokenizer **out) {
    const char *keys[6] = {"NORM", "PRE", "DEC", "TYPE", "DROP", "MERGES"};
    const char *vals[6] = {norm, pre, dec, type, drop, merges};
    char *s = strdup(BASE);
    for (int i = 0; i < 6; i++) {
        char *n = subst(s, keys[i], vals[i]);
        free(s);
        s = n;
    }
    char path[600];
    snprintf(path, sizeof path, "%s/tokenizer.json", g_tmpdir);
    di_write_file(path, s, strlen(s));
    free(s);
    *out = NULL;
    return di_tokenizer_load(path, out);
}

static di_status load_text(const char *text, size_t n) {
    char path[600];
    snprintf(path, sizeof path, "%s/tokenizer.json", g_tmpdir);
    di_write_file(path, text, n);
    di_tokenizer *t = NULL;
    di_status st = di_tokenizer_load(path, &t);
    di_tokenizer_free(t);
    return st;
}

#define LOAD_STR(s) load_text(s, strlen(s))
#define EXPECT_LOAD(code, needle, ...) do { di_tokenizer *t_ = NULL; di_status s_ = load_variant(__VA_ARGS__, &t_); \
    CHECK_MSG(s_ == (code) && (!(needle)[0] || has(di_last_error(), needle)), "got %s: %s", di_status_name(s_), \
              s_ ? di_last_error() : "(loaded)"); di_tokenizer_free(t_); } while (0)

static void test_errors(void) {
    snprintf(g_tmpdir, sizeof g_tmpdir, "%s/tests/tmp_tokenizer_%d", getenv("DI_BUILD_DIR") ? getenv("DI_BUILD_DIR") : ".",
             (int)getpid());
    mkdir(g_tmpdir, 0755);
    const char *pre = "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}";
    di_tokenizer *t = NULL;
    /* the valid base: a char-level model */
    CHECK_OK(load_variant("null", "null", "null", "\"BPE\"", "null", "[\"a b\"]", &t));
    if (t) {
        di_ids ids = {0};
        CHECK_OK(di_tokenizer_encode(t, "ab<s>ba", 7, DI_TOK_HF, &ids));
        CHECK(ids.n == 4 && ids.data[0] == 2 && ids.data[1] == 4 && ids.data[2] == 1 && ids.data[3] == 0);
        char *out = NULL;
        CHECK_OK(di_tokenizer_decode(t, ids.data, ids.n, DI_TOK_SKIP_SPECIAL, &out, NULL));
        CHECK_EQ_STR(out, "ab b a"); /* no decoder: tokens joined by spaces */
        free(out);
        /* characters missing from the vocab, with no unk_token and no byte_fallback, are dropped
         * (HF); twice, so the second answer comes from the word cache */
        for (int r = 0; r < 2; r++) {
            ids.n = 0;
            CHECK_OK(di_tokenizer_encode(t, "zz", 2, DI_TOK_HF, &ids));
            CHECK_EQ_INT(ids.n, 0);
        }
        di_ids_free(&ids);
        di_tokenizer_free(t);
    }
    EXPECT_LOAD(DI_ERR_UNSUPPORTED, "pre_tokenizer type 'Metaspace' is not supported", "null",
                "{\"type\":\"Metaspace\",\"replacement\":\"_\"}", "null", "\"BPE\"", "null", "[]");
    EXPECT_LOAD(DI_ERR_UNSUPPORTED, "normalizer type 'BertNormalizer' is not supported",
                "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"},{\"type\":\"BertNormalizer\"}]}", "null", "null",
                "\"BPE\"", "null", "[]");
    EXPECT_LOAD(DI_ERR_UNSUPPORTED, "normalizers[1]", "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"},{\"type\":\"Precompiled\"}]}",
                "null", "null", "\"BPE\"", "null", "[]");
    EXPECT_LOAD(DI_ERR_UNSUPPORTED, "decoder type 'WordPiece' is not supported", "null", "null", "{\"type\":\"WordPiece\"}",
                "\"BPE\"", "null", "[]");
    EXPECT_LOAD(DI_ERR_UNSUPPORTED, "model type 'Unigram' is not supported", "null", "null", "null", "\"Unigram\"", "null", "[]");
    EXPECT_LOAD(DI_ERR_UNSUPPORTED, "dropout", "null", "null", "null", "\"BPE\"", "0.1", "[]");
    EXPECT_LOAD(DI_ERR_FORMAT, "model.merges[1]: token 'c' is not in model.vocab", "null", "null", "null", "\"BPE\"", "null",
                "[\"a b\", \"c a\"]");
    EXPECT_LOAD(DI_ERR_FORMAT, "merged token 'ba' is not in model.vocab", "null", "null", "null", "\"BPE\"", "null", "[[\"b\",\"a\"]]");
    EXPECT_LOAD(DI_ERR_FORMAT, "expected two tokens separated by one space", "null", "null", "null", "\"BPE\"", "null", "[\"a b b\"]");
    EXPECT_LOAD(DI_ERR_FORMAT, "mixed", "null", "null", "null", "\"BPE\"", "null", "[\"a b\", [\"a\",\"b\"]]");
    EXPECT_LOAD(DI_OK, "", "null", "null", "null", "\"BPE\"", "null", "[\"#version: 0.2\", \"a b\"]");
    EXPECT_LOAD(DI_ERR_FORMAT, "does not compile", "null",
                "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(unclosed\"},\"behavior\":\"Isolated\"}", "null", "\"BPE\"", "null", "[]");
    EXPECT_LOAD(DI_ERR_UNSUPPORTED, "nested character class", "null",
                "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"[a[b]]\"},\"behavior\":\"Isolated\"}", "null", "\"BPE\"", "null", "[]");
    EXPECT_LOAD(DI_ERR_FORMAT, "field 'behavior': unknown value 'Sideways'", "null",
                "{\"type\":\"Split\",\"pattern\":{\"String\":\" \"},\"behavior\":\"Sideways\"}", "null", "\"BPE\"", "null", "[]");
    char seq[512];
    snprintf(seq, sizeof seq, "{\"type\":\"Sequence\",\"pretokenizers\":[%s,{\"type\":\"Digits\"}]}", pre);
    EXPECT_LOAD(DI_ERR_UNSUPPORTED, "ByteLevel must be last", "null", seq, "null", "\"BPE\"", "null", "[]");
    /* a template that only adds a prefix */
    CHECK_OK(LOAD_STR("{\"added_tokens\": [{\"id\": 1, \"content\": \"<s>\", \"special\": true}], \"post_processor\": "
                      "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\"}}, "
                      "{\"Sequence\": {\"id\": \"A\"}}], \"special_tokens\": {\"<s>\": {\"ids\": [1]}}}, "
                      "\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}}"));
    /* raw JSON problems: the byte offset is named */
    CHECK_EQ_INT(LOAD_STR(""), DI_ERR_FORMAT);
    CHECK(has(di_last_error(), "invalid JSON at byte 0"));
    CHECK_EQ_INT(LOAD_STR("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0,"), DI_ERR_FORMAT);
    CHECK(has(di_last_error(), "invalid JSON at byte"));
    CHECK_EQ_INT(LOAD_STR("{\"model\": {\"vocab\": {\"a\": -1}, \"merges\": []}}"), DI_ERR_FORMAT);
    CHECK(has(di_last_error(), "non-negative integer token id"));
    /* ids far sparser than 0..n-1 (the tables are dense; found by fuzz_tokenizer: an 8 GB
     * allocation for a 3-token vocab): refused with the id named; a moderately sparse vocab loads */
    CHECK_EQ_INT(LOAD_STR("{\"model\": {\"vocab\": {\"a\": 0, \"b\": 1999999999}, \"merges\": []}}"),
                 DI_ERR_UNSUPPORTED);
    CHECK(has(di_last_error(), "token id 1999999999 with only 2 tokens"));
    CHECK_OK(LOAD_STR("{\"model\": {\"vocab\": {\"a\": 0, \"b\": 1000000}, \"merges\": []}}"));
    CHECK_EQ_INT(LOAD_STR("{\"model\": {\"vocab\": {\"a\": 0, \"b\": 0}, \"merges\": []}}"), DI_ERR_FORMAT);
    CHECK(has(di_last_error(), "id 0 is used by both"));
    CHECK_EQ_INT(LOAD_STR("{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}} x"), DI_ERR_FORMAT);
    CHECK(has(di_last_error(), "end of the file"));
    CHECK_EQ_INT(LOAD_STR("{\"model\": {\"vocab\": {\"\\ud800\": 0}, \"merges\": []}}"), DI_ERR_FORMAT);
    CHECK(has(di_last_error(), "surrogate"));
    CHECK_EQ_INT(LOAD_STR("{\"model\": {\"vocab\": {\"\xff\": 0}, \"merges\": []}}"), DI_ERR_FORMAT);
    CHECK(has(di_last_error(), "invalid UTF-8"));
    CHECK_EQ_INT(LOAD_STR("[1, 2]"), DI_ERR_FORMAT);
    CHECK_EQ_INT(LOAD_STR("{\"added_tokens\": 5, \"model\": {\"vocab\": {}, \"merges\": []}}"), DI_ERR_FORMAT);
    CHECK(has(di_last_error(), "added_tokens"));
    /* an added token whose id disagrees with the id HF gives it: renumbered as HF does
     * (HF: encode("a<x>a") -> [0, 1, 0]) unless the id HF gives already belongs to a vocab token */
    CHECK_OK(LOAD_STR("{\"added_tokens\": [{\"id\": 7, \"content\": \"<x>\", \"special\": true, \"normalized\": false}], "
                      "\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}}"));
    {
        char p2[600];
        snprintf(p2, sizeof p2, "%s/tokenizer.json", g_tmpdir);
        di_tokenizer *t2 = NULL;
        di_ids ids = {0};
        CHECK_OK(di_tokenizer_load(p2, &t2));
        if (t2) CHECK_OK(di_tokenizer_encode(t2, "a<x>a", 5, DI_TOK_HF, &ids));
        CHECK(ids.n == 3 && ids.data[0] == 0 && ids.data[1] == 1 && ids.data[2] == 0);
        di_ids_free(&ids);
        di_tokenizer_free(t2);
    }
    CHECK_EQ_INT(LOAD_STR("{\"added_tokens\": [{\"id\": 7, \"content\": \"<x>\"}], \"model\": {\"vocab\": {\"a\": 0, \"b\": 3, \"c\": 1}, \"merges\": []}}"),
                 DI_ERR_UNSUPPORTED);
    CHECK(has(di_last_error(), "already the vocab token"));
    /* missing file / directory */
    CHECK_EQ_INT(di_tokenizer_load("/nonexistent/dir", &t), DI_ERR_IO);
    CHECK(has(di_last_error(), "/nonexistent/dir"));
    CHECK(t == NULL);
    di_tokenizer_free(NULL);
    char path[600];
    snprintf(path, sizeof path, "%s/tokenizer.json", g_tmpdir);
    unlink(path);
    rmdir(g_tmpdir);
}

/* HF's Replace with a pattern that matches the empty string panics inside encode on many inputs;
 * its normalize_str gives the regex semantics, which we follow. Reference: HF
 * normalizers.Replace(Regex("b*"), "-").normalize_str(s). */
static void test_replace_empty(void) {
    snprintf(g_tmpdir, sizeof g_tmpdir, "%s/tests/tmp_tokenizer_r%d", getenv("DI_BUILD_DIR") ? getenv("DI_BUILD_DIR") : ".",
             (int)getpid());
    mkdir(g_tmpdir, 0755);
    di_tok_buf j = {0};
    append(&j, "{\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"Regex\":\"b*\"},\"content\":\"-\"},"
               "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false},"
               "\"decoder\":{\"type\":\"ByteLevel\"},\"model\":{\"vocab\":{");
    for (int b = 0; b < 256; b++) {
        char u[8], e[32];
        int n = di_utf8_encode(di_tok_bytelevel_char((uint8_t)b), u);
        u[n] = 0;
        snprintf(e, sizeof e, "%s\"%s%s\":%d", b ? "," : "", u[0] == '"' || u[0] == '\\' ? "\\" : "", u, b);
        append(&j, e);
    }
    append(&j, "},\"merges\":[]}}");
    CHECK_OK(load_text(j.p, j.n));
    char path[600];
    snprintf(path, sizeof path, "%s/tokenizer.json", g_tmpdir);
    di_tokenizer *t = NULL;
    CHECK_OK(di_tokenizer_load(path, &t));
    const char *in[] = {"abc", "bbb", "xbby", "aa", "r affirmed", "", "ab"};
    const char *want[] = {"-a-c-", "-", "-x-y-", "-a-a-", "-r- -a-f-f-i-r-m-e-d-", "", "-a-"};
    for (int i = 0; t && i < 7; i++) {
        di_ids ids = {0};
        char *out = NULL;
        CHECK_OK(di_tokenizer_encode(t, in[i], strlen(in[i]), 0, &ids));
        CHECK_OK(di_tokenizer_decode(t, ids.data, ids.n, 0, &out, NULL));
        CHECK_EQ_STR(out, want[i]);
        free(out);
        di_ids_free(&ids);
    }
    di_tokenizer_free(t);
    di_tok_buf_free(&j);
    unlink(path);
    rmdir(g_tmpdir);
}

static void setup(void) {
    g_ds = tt_load("deepseek-v3");
    g_qw = tt_load("qwen3");
}

static void teardown(void) {
    di_tokenizer_free(g_ds);
    di_tokenizer_free(g_qw);
}

TEST_MAIN(setup, test_lookups, test_special_and_flags, test_invalid_utf8, test_streaming, test_threads,
          test_parallel_tricky, test_errors, test_replace_empty, teardown)
