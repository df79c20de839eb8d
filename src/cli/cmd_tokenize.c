/* cmd_tokenize.c - `deepinfer tokenize` and `deepinfer detokenize`.
 *
 *   deepinfer tokenize --tokenizer PATH [--safe] [--add-special] [--jsonl] [--threads N]
 *     stdin text -> ids on one line, separated by spaces. With --jsonl: each input line
 *     {"text": "..."} -> one output line {"ids": [...]}, in order (empty lines are skipped).
 *   deepinfer detokenize --tokenizer PATH [--skip-special] [--jsonl]
 *     stdin ids (integers separated by spaces, commas or newlines; brackets allowed) -> text.
 *     With --jsonl: each line {"ids": [...]} -> one line {"text": "..."}.
 * Errors (bad tokenizer, invalid UTF-8, malformed lines) go to stderr with the line number and
 * the exit status is 1; 2 for usage errors. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/threadpool.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    const char *tokenizer;
    int safe, add_special, jsonl, skip_special, threads;
} opts;

static void usage_tokenize(FILE *f) {
    fprintf(f, "usage: deepinfer tokenize --tokenizer PATH [--safe] [--add-special] [--jsonl] [--threads N]\n"
               "  Reads text from stdin and prints its token ids (space-separated, one line).\n"
               "  --tokenizer PATH  tokenizer.json, or a directory holding it (and tokenizer_config.json)\n"
               "  --safe            encode text that spells special/added tokens as ordinary text\n"
               "  --add-special     add BOS/EOS as the post-processor or tokenizer_config.json say\n"
               "  --jsonl           read lines {\"text\": \"...\"}, print lines {\"ids\": [...]}\n"
               "  --threads N       threads for long inputs (default: DEEPINFER_THREADS or all CPUs)\n");
}

static void usage_detokenize(FILE *f) {
    fprintf(f, "usage: deepinfer detokenize --tokenizer PATH [--skip-special] [--jsonl]\n"
               "  Reads token ids from stdin (separated by spaces, commas or newlines) and prints the text.\n"
               "  --tokenizer PATH  tokenizer.json, or a directory holding it\n"
               "  --skip-special    drop special tokens\n"
               "  --jsonl           read lines {\"ids\": [...]}, print lines {\"text\": \"...\"}\n");
}

/* Returns 0 ok, 1 help printed, 2 usage error. */
static int parse(int argc, char **argv, opts *o, int detok) {
    memset(o, 0, sizeof *o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return 1;
        if (!strcmp(a, "--tokenizer") && i + 1 < argc) o->tokenizer = argv[++i];
        else if (!strcmp(a, "--jsonl")) o->jsonl = 1;
        else if (!detok && !strcmp(a, "--safe")) o->safe = 1;
        else if (!detok && !strcmp(a, "--add-special")) o->add_special = 1;
        else if (!detok && !strcmp(a, "--threads") && i + 1 < argc) {
            char *end;
            long n = strtol(argv[++i], &end, 10);
            if (*end || n < 1 || n > 1024) { fprintf(stderr, "deepinfer: --threads: expected 1..1024, got '%s'\n", argv[i]); return 2; }
            o->threads = (int)n;
        } else if (detok && !strcmp(a, "--skip-special")) o->skip_special = 1;
        else { fprintf(stderr, "deepinfer: unknown or incomplete option '%s'\n", a); return 2; }
    }
    if (!o->tokenizer) { fprintf(stderr, "deepinfer: --tokenizer PATH is required\n"); return 2; }
    return 0;
}

static char *read_all(FILE *f, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf) return NULL;
    for (;;) {
        if (n == cap) {
            char *b = realloc(buf, cap * 2 + 1);
            if (!b) { free(buf); return NULL; }
            buf = b;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    if (ferror(f)) { free(buf); return NULL; }
    buf[n] = '\0';
    *len = n;
    return buf;
}

static int print_ids(const di_ids *ids, int json) {
    if (json) fputs("{\"ids\": [", stdout);
    for (size_t i = 0; i < ids->n; i++) printf(i ? (json ? ", %d" : " %d") : "%d", ids->data[i]);
    fputs(json ? "]}\n" : "\n", stdout);
    return 0;
}

static di_tokenizer *load(const char *path) {
    di_tokenizer *t;
    if (di_tokenizer_load(path, &t) != DI_OK) {
        fprintf(stderr, "deepinfer: %s\n", di_last_error());
        return NULL;
    }
    return t;
}

int di_cmd_tokenize(int argc, char **argv) {
    opts o;
    int r = parse(argc, argv, &o, 0);
    if (r) { usage_tokenize(r == 1 ? stdout : stderr); return r == 1 ? 0 : 2; }
    di_tokenizer *t = load(o.tokenizer);
    if (!t) return 1;
    size_t len;
    char *in = read_all(stdin, &len);
    if (!in) { fprintf(stderr, "deepinfer: cannot read stdin: %s\n", strerror(errno)); di_tokenizer_free(t); return 1; }
    unsigned flags = (o.safe ? DI_TOK_SAFE : 0) | (o.add_special ? DI_TOK_ADD_SPECIAL : 0);
    di_threadpool *pool = di_threadpool_create(o.threads);
    di_ids ids = {0};
    int rc = 0;
    if (!o.jsonl) {
        if (di_tokenizer_encode_parallel(t, in, len, flags, pool, &ids) != DI_OK) {
            fprintf(stderr, "deepinfer: %s\n", di_last_error());
            rc = 1;
        } else {
            print_ids(&ids, 0);
        }
    } else {
        size_t line = 0;
        for (char *p = in; p < in + len && !rc;) {
            char *nl = memchr(p, '\n', (size_t)(in + len - p));
            size_t n = nl ? (size_t)(nl - p) : (size_t)(in + len - p);
            line++;
            char *next = nl ? nl + 1 : in + len;
            if (n && p[n - 1] == '\r') n--;
            if (n == 0) { p = next; continue; }
            json_error_t e;
            json_t *j = json_loadb(p, n, JSON_ALLOW_NUL, &e);
            json_t *txt = j ? json_object_get(j, "text") : NULL;
            if (!j || !json_is_string(txt)) {
                fprintf(stderr, "deepinfer: stdin line %zu: expected {\"text\": \"...\"}%s%s\n", line, j ? "" : ": ",
                        j ? "" : e.text);
                rc = 1;
            } else {
                ids.n = 0;
                if (di_tokenizer_encode_parallel(t, json_string_value(txt), json_string_length(txt), flags, pool, &ids) != DI_OK) {
                    fprintf(stderr, "deepinfer: stdin line %zu: %s\n", line, di_last_error());
                    rc = 1;
                } else {
                    print_ids(&ids, 1);
                }
            }
            json_decref(j);
            p = next;
        }
    }
    if (fflush(stdout) != 0) rc = 1;
    di_ids_free(&ids);
    di_threadpool_free(pool);
    free(in);
    di_tokenizer_free(t);
    return rc;
}

/* Parses integers separated by spaces, commas, newlines and brackets. */
static int parse_ids(const char *s, size_t n, di_ids *ids, size_t *bad) {
    size_t i = 0;
    while (i < n) {
        char c = s[i];
        if (c == ' ' || c == ',' || c == '\n' || c == '\r' || c == '\t' || c == '[' || c == ']') { i++; continue; }
        if (c < '0' || c > '9') { *bad = i; return 0; }
        long long v = 0;
        while (i < n && s[i] >= '0' && s[i] <= '9') {
            v = v * 10 + (s[i] - '0');
            if (v > INT32_MAX) { *bad = i; return 0; }
            i++;
        }
        if (di_ids_push(ids, (int32_t)v) != DI_OK) { *bad = i; return 0; }
    }
    return 1;
}

int di_cmd_detokenize(int argc, char **argv) {
    opts o;
    int r = parse(argc, argv, &o, 1);
    if (r) { usage_detokenize(r == 1 ? stdout : stderr); return r == 1 ? 0 : 2; }
    di_tokenizer *t = load(o.tokenizer);
    if (!t) return 1;
    size_t len;
    char *in = read_all(stdin, &len);
    if (!in) { fprintf(stderr, "deepinfer: cannot read stdin: %s\n", strerror(errno)); di_tokenizer_free(t); return 1; }
    unsigned flags = o.skip_special ? DI_TOK_SKIP_SPECIAL : 0;
    di_ids ids = {0};
    int rc = 0;
    size_t line = 0;
    for (char *p = in; p < in + len && !rc;) {
        char *nl = o.jsonl ? memchr(p, '\n', (size_t)(in + len - p)) : NULL;
        size_t n = nl ? (size_t)(nl - p) : (size_t)(in + len - p);
        char *next = nl ? nl + 1 : in + len;
        line++;
        ids.n = 0;
        size_t bad = 0;
        json_t *j = NULL;
        if (o.jsonl) {
            if (n && p[n - 1] == '\r') n--;
            if (n == 0) { p = next; continue; }
            json_error_t e;
            j = json_loadb(p, n, 0, &e);
            json_t *arr = j ? json_object_get(j, "ids") : NULL;
            for (size_t k = 0; json_is_array(arr) && k < json_array_size(arr); k++) {
                json_t *x = json_array_get(arr, k);
                if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > INT32_MAX) { arr = NULL; break; }
                di_ids_push(&ids, (int32_t)json_integer_value(x));
            }
            if (!json_is_array(arr)) {
                fprintf(stderr, "deepinfer: stdin line %zu: expected {\"ids\": [non-negative integers]}\n", line);
                rc = 1;
            }
        } else if (!parse_ids(p, n, &ids, &bad)) {
            fprintf(stderr, "deepinfer: stdin byte %zu: expected a token id (non-negative integer below 2^31)\n", bad);
            rc = 1;
        }
        char *text = NULL;
        size_t tlen = 0;
        if (!rc && di_tokenizer_decode(t, ids.data, ids.n, flags, &text, &tlen) != DI_OK) {
            fprintf(stderr, "deepinfer: %s\n", di_last_error());
            rc = 1;
        }
        if (!rc && o.jsonl) {
            json_t *out = json_object();
            json_object_set_new(out, "text", json_stringn(text, tlen));
            char *s = json_dumps(out, JSON_COMPACT);
            if (s) { fputs(s, stdout); fputc('\n', stdout); }
            else rc = 1;
            free(s);
            json_decref(out);
        } else if (!rc) {
            fwrite(text, 1, tlen, stdout);
        }
        free(text);
        json_decref(j);
        p = next;
    }
    if (fflush(stdout) != 0) rc = 1;
    di_ids_free(&ids);
    free(in);
    di_tokenizer_free(t);
    return rc;
}
