/* bench_tokenizer.c - tokenizer load time and encode throughput.
 *
 *   bench_tokenizer --tokenizer PATH --input FILE [--jsonl] [--threads 1,2] [--repeat N] [--loads N]
 *
 * FILE is plain text (encoded as one input) or, with --jsonl, lines {"text": "..."} encoded one
 * document at a time. Prints, one line each:
 *   load_ms      min / median of N loads of the tokenizer
 *   serial       single-thread di_tokenizer_encode over all documents: MB/s, tokens/s
 *   parallel T   di_tokenizer_encode_parallel of all documents concatenated into one input on
 *                a T-thread pool: MB/s, speedup over T=1, and process CPU time / wall time (the
 *                cores actually used: below T means other processes took the CPUs)
 *   ids          number of ids and their FNV-1a hash (to compare with Hugging Face's)
 * Used by bench/tokenizer_vs_hf.py, which runs HF `tokenizers` on the same input in the same run. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/mmap_file.h"
#include "core/threadpool.h"
#include "core/timer.h"
#include "tokenizer/tokenizer.h"

typedef struct { const char *p; size_t n; } doc;

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static unsigned long long fnv64(const int32_t *ids, size_t n, unsigned long long h) {
    for (size_t i = 0; i < n; i++)
        for (int b = 0; b < 4; b++) { h ^= ((uint32_t)ids[i] >> (8 * b)) & 0xff; h *= 0x100000001b3ull; }
    return h;
}

int main(int argc, char **argv) {
    const char *di_tok_path = NULL, *input = NULL, *threads = "1,2";
    int jsonl = 0, repeat = 3, loads = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc) di_tok_path = argv[++i];
        else if (!strcmp(argv[i], "--input") && i + 1 < argc) input = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = argv[++i];
        else if (!strcmp(argv[i], "--repeat") && i + 1 < argc) repeat = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--loads") && i + 1 < argc) loads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--jsonl")) jsonl = 1;
        else { fprintf(stderr, "usage: bench_tokenizer --tokenizer PATH --input FILE [--jsonl] [--threads 1,2] [--repeat N] [--loads N]\n"); return 2; }
    }
    if (!di_tok_path || !input || repeat < 1 || loads < 1) { fprintf(stderr, "bench_tokenizer: --tokenizer and --input are required\n"); return 2; }

    /* load time */
    double *lt = calloc((size_t)loads, sizeof *lt);
    di_tokenizer *t = NULL;
    for (int i = 0; i < loads; i++) {
        double t0 = di_now_s();
        if (di_tokenizer_load(di_tok_path, &t) != DI_OK) { fprintf(stderr, "bench_tokenizer: %s\n", di_last_error()); return 1; }
        lt[i] = (di_now_s() - t0) * 1e3;
        if (i + 1 < loads) di_tokenizer_free(t);
    }
    qsort(lt, (size_t)loads, sizeof *lt, cmp_double);
    printf("load_ms min %.1f median %.1f\n", lt[0], lt[loads / 2]);
    free(lt);

    /* documents */
    char *buf = NULL;
    size_t len = 0;
    if (di_read_file(input, &buf, &len, 0) != DI_OK) { fprintf(stderr, "bench_tokenizer: %s\n", di_last_error()); return 1; }
    doc *docs = NULL;
    size_t nd = 0, total = 0;
    json_t *keep = json_array();
    if (!jsonl) {
        docs = malloc(sizeof *docs);
        docs[0] = (doc){buf, len};
        nd = 1;
        total = len;
    } else {
        size_t cap = 1024;
        docs = malloc(cap * sizeof *docs);
        for (char *p = buf; p < buf + len;) {
            char *nl = memchr(p, '\n', (size_t)(buf + len - p));
            size_t n = nl ? (size_t)(nl - p) : (size_t)(buf + len - p);
            json_error_t e;
            json_t *j = n ? json_loadb(p, n, JSON_ALLOW_NUL, &e) : NULL;
            json_t *s = j ? json_object_get(j, "text") : NULL;
            if (json_is_string(s)) {
                if (nd == cap) docs = realloc(docs, (cap *= 2) * sizeof *docs);
                docs[nd++] = (doc){json_string_value(s), json_string_length(s)};
                total += json_string_length(s);
                json_array_append_new(keep, j);
            } else {
                json_decref(j);
            }
            p = nl ? nl + 1 : buf + len;
        }
    }
    printf("input %zu documents, %.2f MB\n", nd, total / 1e6);

    /* serial, one document at a time */
    di_ids ids = {0};
    double best = 1e30;
    size_t n_ids = 0;
    unsigned long long h = 0;
    for (int r = 0; r < repeat; r++) {
        double t0 = di_now_s();
        n_ids = 0;
        h = 0xcbf29ce484222325ull;
        for (size_t i = 0; i < nd; i++) {
            ids.n = 0;
            if (di_tokenizer_encode(t, docs[i].p, docs[i].n, DI_TOK_HF, &ids) != DI_OK) {
                fprintf(stderr, "bench_tokenizer: document %zu: %s\n", i, di_last_error());
                return 1;
            }
            n_ids += ids.n;
            h = fnv64(ids.data, ids.n, h);
        }
        double dt = di_now_s() - t0;
        if (dt < best) best = dt;
    }
    printf("serial MB/s %.2f tokens/s %.0f seconds %.3f\n", total / best / 1e6, n_ids / best, best);
    printf("ids %zu fnv64 %016llx\n", n_ids, h);

    /* parallel: all documents as one long input */
    char *all = malloc(total + 1);
    size_t off = 0;
    for (size_t i = 0; i < nd; i++) { memcpy(all + off, docs[i].p, docs[i].n); off += docs[i].n; }
    /* thread counts are measured in alternation, best of `repeat` each, so that load from other
     * processes is less likely to hit only one of them */
    int counts[16], nc = 0;
    for (const char *p = threads; *p && nc < 16;) {
        int nt = atoi(p);
        if (nt < 1) break;
        counts[nc++] = nt;
        p = strchr(p, ',');
        if (!p) break;
        p++;
    }
    di_threadpool *pools[16];
    double bt[16], bcpu[16];
    size_t nids[16];
    for (int k = 0; k < nc; k++) { pools[k] = di_threadpool_create(counts[k]); bt[k] = 1e30; bcpu[k] = 0; nids[k] = 0; }
    for (int r = 0; r < repeat; r++) {
        for (int k = 0; k < nc; k++) {
            ids.n = 0;
            double t0 = di_now_s(), c0 = cpu_s();
            if (di_tokenizer_encode_parallel(t, all, total, DI_TOK_HF, pools[k], &ids) != DI_OK) {
                fprintf(stderr, "bench_tokenizer: %s\n", di_last_error());
                return 1;
            }
            double dt = di_now_s() - t0;
            if (dt < bt[k]) { bt[k] = dt; bcpu[k] = cpu_s() - c0; }
            nids[k] = ids.n;
        }
    }
    for (int k = 0; k < nc; k++) {
        /* cpu/wall: how many cores the run kept busy (near T when nothing else competes) */
        printf("parallel threads %d MB/s %.2f speedup %.2f cpu/wall %.2f ids %zu\n", counts[k], total / bt[k] / 1e6,
               bt[0] / bt[k], bcpu[k] / bt[k], nids[k]);
        di_threadpool_free(pools[k]);
    }
    free(all);
    di_ids_free(&ids);
    json_decref(keep);
    free(docs);
    free(buf);
    di_tokenizer_free(t);
    return 0;
}
