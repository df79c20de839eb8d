/* cmd_logits.c - `deepinfer logits`: the reference hook. Runs a token sequence through the
 * model and writes float32 little-endian logits, row-major [n_ids, vocab_size].
 *
 *   deepinfer logits --model DIR --ids 3,17,42 [--mode prefill|decode] [--device cpu|cuda]
 *                    [--dtype auto|bf16|f32] [--threads N] --out FILE [--generate N]
 *
 * prefill: all ids in one forward pass (naive MLA). decode: the ids one at a time through the
 * paged latent KV cache (weight-absorbed MLA), one step per token. --generate N then continues
 * greedily (argmax, lowest id on ties) for up to N tokens through the cache, stopping at an EOS
 * id, and prints the new ids comma-separated on stdout (a minimal demo until the engine's
 * `generate` exists; the logits file still holds only the input rows). This interface is
 * stable: golden-parity tests and tools drive it. Owner: model. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "model/model.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: deepinfer logits --model DIR --ids ID,ID,... [--mode prefill|decode]\n"
            "                        [--device cpu|cuda] [--dtype auto|bf16|f32] [--threads N]\n"
            "                        --out FILE [--generate N]\n\n"
            "Writes the logits of every position as float32 little-endian, row-major\n"
            "[n_ids, vocab_size], to FILE.\n"
            "  --mode prefill  all ids in one forward pass (default)\n"
            "  --mode decode   one id per step through the latent KV cache (absorbed attention)\n"
            "  --dtype D       activations and KV cache: auto (default: f32 on cpu, bf16 on cuda),\n"
            "                  bf16 (cuda) or f32 (cuda: computes like the CPU)\n"
            "  --threads N     CPU threads (default: DEEPINFER_THREADS or all cores)\n"
            "  --generate N    then greedily generate up to N tokens (stops at EOS) and print\n"
            "                  their ids, comma-separated, on stdout\n");
}

/* Parses "3,17,42" into a malloc'd array. */
static int parse_ids(const char *s, int32_t **out, int *n_out) {
    int cap = 16, n = 0;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    if (!ids) return -1;
    const char *p = s;
    for (;;) {
        char *end;
        errno = 0;
        if (*p < '0' || *p > '9') {
            fprintf(stderr, "deepinfer logits: --ids: expected a non-negative integer at offset %d of '%s'\n",
                    (int)(p - s), s);
            free(ids);
            return -1;
        }
        long v = strtol(p, &end, 10);
        if (errno || v > INT32_MAX) {
            fprintf(stderr, "deepinfer logits: --ids: value at offset %d is out of range\n", (int)(p - s));
            free(ids);
            return -1;
        }
        if (n == cap) {
            int32_t *t = realloc(ids, (size_t)(cap *= 2) * sizeof *ids);
            if (!t) { free(ids); return -1; }
            ids = t;
        }
        ids[n++] = (int32_t)v;
        if (*end == '\0') break;
        if (*end != ',') {
            fprintf(stderr, "deepinfer logits: --ids: unexpected character '%c' at offset %d of '%s'\n", *end,
                    (int)(end - s), s);
            free(ids);
            return -1;
        }
        p = end + 1;
    }
    *out = ids;
    *n_out = n;
    return 0;
}

static int write_f32_le(FILE *f, const float *v, size_t n) {
    const uint32_t one = 1;
    if (*(const unsigned char *)&one == 1) return fwrite(v, sizeof(float), n, f) == n ? 0 : -1;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        unsigned char b[4] = {(unsigned char)u, (unsigned char)(u >> 8), (unsigned char)(u >> 16),
                              (unsigned char)(u >> 24)};
        if (fwrite(b, 1, 4, f) != 4) return -1;
    }
    return 0;
}

/* Runs the ids as one prefill batch or as n decode steps; fills logits [n, vocab]. */
static di_status run(di_model *m, const int32_t *ids, int n, int decode, float *logits) {
    int V = di_model_config_of(m)->vocab_size, nb = (n + DI_KV_BLOCK_SIZE - 1) / DI_KV_BLOCK_SIZE;
    int32_t *pos = malloc((size_t)n * sizeof *pos), *bt = malloc((size_t)nb * sizeof *bt);
    di_status s = DI_OK;
    if (!pos || !bt) s = di_error(DI_ERR_NOMEM, "out of memory");
    for (int i = 0; s == DI_OK && i < n; i++) pos[i] = i;
    for (int i = 0; s == DI_OK && i < nb; i++) bt[i] = i;
    if (s == DI_OK && !decode) {
        int32_t seq_start[2] = {0, n}, ctx = n;
        di_batch b = {n, ids, pos, pos, 1, 0, seq_start, &ctx, bt, nb, n, pos};
        s = di_model_forward(m, &b, logits);
    }
    for (int i = 0; s == DI_OK && decode && i < n; i++) {
        int32_t seq_start[2] = {0, 1}, ctx = i + 1, row = 0;
        di_batch b = {1, ids + i, pos + i, pos + i, 1, 1, seq_start, &ctx, bt, nb, 1, &row};
        s = di_model_forward(m, &b, logits + (size_t)i * V);
    }
    free(pos);
    free(bt);
    return s;
}

static int argmax(const float *v, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

/* Greedy continuation after the n ids already in the cache (blocks 0..): prints the new ids. */
static di_status generate(di_model *m, const float *last_logits, int n, int n_gen) {
    const di_model_config *c = di_model_config_of(m);
    int V = c->vocab_size, total = n + n_gen, nb = (total + DI_KV_BLOCK_SIZE - 1) / DI_KV_BLOCK_SIZE;
    float *logits = malloc((size_t)V * sizeof *logits);
    int32_t *bt = malloc((size_t)nb * sizeof *bt);
    if (!logits || !bt) {
        free(logits);
        free(bt);
        return di_error(DI_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < nb; i++) bt[i] = i;
    memcpy(logits, last_logits, (size_t)V * sizeof *logits);
    di_status s = DI_OK;
    for (int i = 0; i < n_gen && s == DI_OK; i++) {
        int32_t tok = argmax(logits, V), pos = n + i, ss[2] = {0, 1}, ctx = pos + 1, row = 0;
        printf(i ? ",%d" : "%d", tok);
        fflush(stdout);
        int eos = 0;
        for (int e = 0; e < c->n_eos; e++) eos |= tok == c->eos_token_ids[e];
        if (eos || i == n_gen - 1) break;
        di_batch b = {1, &tok, &pos, &pos, 1, 1, ss, &ctx, bt, nb, 1, &row};
        s = di_model_forward(m, &b, logits);
    }
    printf("\n");
    free(logits);
    free(bt);
    return s;
}

int di_cmd_logits(int argc, char **argv) {
    const char *model = NULL, *ids_s = NULL, *mode = "prefill", *device = "cpu", *out = NULL, *dtype = "auto";
    int threads = 0, n_gen = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "deepinfer logits: %s: missing value (or unknown option)\n", a);
            usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--ids")) ids_s = v;
        else if (!strcmp(a, "--mode")) mode = v;
        else if (!strcmp(a, "--device")) device = v;
        else if (!strcmp(a, "--dtype")) dtype = v;
        else if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--threads")) {
            char *end;
            long t = strtol(v, &end, 10);
            if (*end || t < 1 || t > 1024) {
                fprintf(stderr, "deepinfer logits: --threads: expected an integer in [1, 1024], got '%s'\n", v);
                return 2;
            }
            threads = (int)t;
        } else if (!strcmp(a, "--generate")) {
            char *end;
            long g = strtol(v, &end, 10);
            if (*end || g < 0 || g > 1000000) {
                fprintf(stderr, "deepinfer logits: --generate: expected an integer in [0, 1000000], got '%s'\n", v);
                return 2;
            }
            n_gen = (int)g;
        } else {
            fprintf(stderr, "deepinfer logits: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!model || !ids_s || !out) {
        fprintf(stderr, "deepinfer logits: --model, --ids and --out are required\n");
        usage(stderr);
        return 2;
    }
    int decode;
    if (!strcmp(mode, "prefill")) decode = 0;
    else if (!strcmp(mode, "decode")) decode = 1;
    else {
        fprintf(stderr, "deepinfer logits: --mode: expected 'prefill' or 'decode', got '%s'\n", mode);
        return 2;
    }
    di_device dev;
    if (!strcmp(device, "cpu")) dev = DI_DEVICE_CPU;
    else if (!strcmp(device, "cuda")) dev = DI_DEVICE_CUDA;
    else {
        fprintf(stderr, "deepinfer logits: --device: expected 'cpu' or 'cuda', got '%s'\n", device);
        return 2;
    }
    int precision = di_precision_from_name(dtype);
    if (precision < 0) {
        fprintf(stderr, "deepinfer logits: --dtype: expected 'auto', 'bf16' or 'f32', got '%s'\n", dtype);
        return 2;
    }
    int32_t *ids = NULL;
    int n = 0;
    if (parse_ids(ids_s, &ids, &n) != 0) return 2;
    di_model_options opts = {0};
    opts.device = dev;
    opts.precision = (di_precision)precision;
    opts.n_threads = threads;
    opts.max_batch_tokens = decode ? 1 : n;
    opts.max_seqs = 1;
    opts.max_context = n + n_gen;
    opts.kv_blocks = (n + n_gen + DI_KV_BLOCK_SIZE - 1) / DI_KV_BLOCK_SIZE;
    di_model *m = NULL;
    di_status s = di_model_load(model, &opts, &m);
    float *logits = NULL;
    size_t V = 0;
    if (s == DI_OK) {
        V = (size_t)di_model_config_of(m)->vocab_size;
        for (int i = 0; i < n && s == DI_OK; i++)
            if ((size_t)ids[i] >= V)
                s = di_error(DI_ERR_INVALID_ARG, "--ids: id %d (index %d) is outside the model's vocabulary [0, %zu)",
                             ids[i], i, V);
    }
    if (s == DI_OK) {
        logits = malloc((size_t)n * V * sizeof(float));
        s = logits ? run(m, ids, n, decode, logits) : di_error(DI_ERR_NOMEM, "out of memory for %d x %zu logits", n, V);
    }
    if (s == DI_OK && n_gen > 0) s = generate(m, logits + (size_t)(n - 1) * V, n, n_gen);
    if (s == DI_OK) {
        FILE *f = fopen(out, "wb");
        if (!f) s = di_error(DI_ERR_IO, "%s: cannot open for writing: %s", out, strerror(errno));
        else {
            int bad = write_f32_le(f, logits, (size_t)n * V);
            if (fclose(f) != 0 || bad) s = di_error(DI_ERR_IO, "%s: write failed: %s", out, strerror(errno));
        }
    }
    if (s != DI_OK) fprintf(stderr, "deepinfer logits: %s\n", di_last_error());
    free(logits);
    free(ids);
    di_model_free(m);
    return s == DI_OK ? 0 : 1;
}
