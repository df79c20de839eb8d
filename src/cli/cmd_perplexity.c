/* cmd_perplexity.c - `deepinfer perplexity`: held-out perplexity and MTP acceptance of a model
 * on text files, with the protocol of tools/train/README.md (the same one PyTorch used for the
 * shipped model, so the numbers are comparable):
 *
 *   for each file, in order: ids = encode(text) (HF mode, no BOS/EOS);
 *   windows ids[s : s + W] for s = 0, W, 2W, ...; windows shorter than 2 are skipped;
 *   NLL of predicting w[1:] from the prefix inside the window (no context across windows);
 *   ppl = exp(total NLL / predicted tokens).
 *
 * With --mtp (a model with MTP layers): at each window position i with i + 2 < len(w), the MTP
 * head's top-1 given (h_i, t_{i+1}) is compared with the main model's greedy argmax at i + 1;
 * acceptance = matches / positions. Argmax ties go to the lowest id.
 *
 * Windows are packed several per forward pass (each its own sequence in the batch) with the
 * naive (prefill) attention path. Owner: cli. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/mmap_file.h"
#include "core/status.h"
#include "core/timer.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    double nll;           /* sum of -log p(target) */
    long predicted;       /* number of predicted tokens */
    long windows;
    long mtp_positions, mtp_accepted;
    long tokens;
    size_t bytes;
} ppl_totals;

typedef struct {
    di_model *model;
    int vocab, hidden, window, max_windows, mtp;
    /* staging for one packed batch */
    int32_t *ids, *pos, *slots, *seq_start, *ctx, *blocks, *rows, *next_ids;
    float *logits, *hidden_states, *mtp_logits;
    int n_tok, n_seq;
} ppl_ctx;

static void usage(FILE *f) {
    fprintf(f,
            "usage: deepinfer perplexity --model DIR [--file F]... [--list LIST --root DIR]\n"
            "                            [--window W] [--batch-windows N] [--threads N] [--mtp] [--json]\n\n"
            "Perplexity of the model on text files (windows of W tokens, default 512; no BOS; no\n"
            "context across windows). --list names files (one relative path per line) under --root.\n"
            "--mtp also measures MTP acceptance (MTP top-1 == main greedy token one step later).\n"
            "--json prints one JSON object instead of text.\n");
}

static int argmax(const float *v, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

/* -log softmax(v)[target] in double precision. */
static double nll_of(const float *v, int n, int target) {
    float mx = v[0];
    for (int i = 1; i < n; i++)
        if (v[i] > mx) mx = v[i];
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += exp((double)v[i] - (double)mx);
    return log(sum) + (double)mx - (double)v[target];
}

/* Runs the packed windows in c (n_seq sequences, n_tok tokens) and accumulates into t. */
static di_status run_packed(ppl_ctx *c, ppl_totals *t) {
    int max_blocks = (c->window + DI_KV_BLOCK_SIZE - 1) / DI_KV_BLOCK_SIZE;
    di_batch b = {
        .n_tokens = c->n_tok, .token_ids = c->ids, .positions = c->pos, .slot_mapping = c->slots,
        .n_seqs = c->n_seq, .n_decode_seqs = 0, .seq_start = c->seq_start, .seq_ctx_len = c->ctx,
        .block_table = c->blocks, .max_blocks = max_blocks, .n_logits = c->n_tok, .logits_rows = c->rows,
    };
    DI_TRY(di_model_forward_ex(c->model, &b, c->logits, c->mtp ? c->hidden_states : NULL));
    for (int s = 0; s < c->n_seq; s++) {
        int a = c->seq_start[s], e = c->seq_start[s + 1];
        for (int i = a; i + 1 < e; i++) t->nll += nll_of(c->logits + (size_t)i * c->vocab, c->vocab, c->ids[i + 1]);
        t->predicted += e - a - 1;
    }
    if (!c->mtp) return DI_OK;
    /* MTP: token i gets t_{i+1} and h_i; its logits predict t_{i+2}. The last token of each
     * window has no next token; feed its own id (its output is ignored). */
    for (int s = 0; s < c->n_seq; s++) {
        int a = c->seq_start[s], e = c->seq_start[s + 1];
        for (int i = a; i < e; i++) c->next_ids[i] = (i + 1 < e) ? c->ids[i + 1] : c->ids[i];
    }
    b.token_ids = c->next_ids;
    DI_TRY(di_model_mtp_forward(c->model, 0, &b, c->hidden_states, c->mtp_logits, NULL));
    for (int s = 0; s < c->n_seq; s++) {
        int a = c->seq_start[s], e = c->seq_start[s + 1];
        for (int i = a; i + 2 < e; i++) {
            int draft = argmax(c->mtp_logits + (size_t)i * c->vocab, c->vocab);
            int main_next = argmax(c->logits + (size_t)(i + 1) * c->vocab, c->vocab);
            t->mtp_positions++;
            t->mtp_accepted += draft == main_next;
        }
    }
    return DI_OK;
}

/* Adds window ids[0..n) to the packed batch as sequence c->n_seq. */
static void pack_window(ppl_ctx *c, const int32_t *ids, int n) {
    int max_blocks = (c->window + DI_KV_BLOCK_SIZE - 1) / DI_KV_BLOCK_SIZE;
    int s = c->n_seq;
    c->seq_start[s] = c->n_tok;
    for (int j = 0; j < n; j++) {
        int i = c->n_tok + j;
        c->ids[i] = ids[j];
        c->pos[i] = j;
        c->rows[i] = i;
        /* sequence s owns blocks [s * max_blocks, (s + 1) * max_blocks) */
        c->slots[i] = (s * max_blocks + j / DI_KV_BLOCK_SIZE) * DI_KV_BLOCK_SIZE + j % DI_KV_BLOCK_SIZE;
    }
    for (int k = 0; k < max_blocks; k++) c->blocks[s * max_blocks + k] = s * max_blocks + k;
    c->ctx[s] = n;
    c->n_tok += n;
    c->n_seq++;
    c->seq_start[c->n_seq] = c->n_tok;
}

static di_status eval_file(ppl_ctx *c, const di_tokenizer *tok, const char *path, ppl_totals *t) {
    char *text = NULL;
    size_t len = 0;
    DI_TRY(di_read_file(path, &text, &len, 0));
    di_ids ids = {0};
    di_status s = di_tokenizer_encode(tok, text, len, DI_TOK_HF, &ids);
    free(text);
    if (s != DI_OK) {
        di_ids_free(&ids);
        return di_error_context(s, "%s", path);
    }
    t->bytes += len;
    t->tokens += (long)ids.n;
    for (size_t start = 0; start < ids.n && s == DI_OK; start += (size_t)c->window) {
        int n = (int)((ids.n - start) < (size_t)c->window ? ids.n - start : (size_t)c->window);
        if (n < 2) continue;
        pack_window(c, ids.data + start, n);
        t->windows++;
        if (c->n_seq == c->max_windows) {
            s = run_packed(c, t);
            c->n_seq = c->n_tok = 0;
        }
    }
    di_ids_free(&ids);
    return s;
}

/* Reads a list file into a NULL-terminated array of paths under root. */
static char **read_list(const char *list, const char *root, int *n_out) {
    char *buf = NULL;
    if (di_read_file(list, &buf, NULL, 0) != DI_OK) return NULL;
    int cap = 64, n = 0;
    char **paths = malloc(sizeof(char *) * (size_t)cap);
    for (char *line = strtok(buf, "\n"); line && paths; line = strtok(NULL, "\n")) {
        size_t l = strlen(line);
        while (l && (line[l - 1] == '\r' || line[l - 1] == ' ')) line[--l] = '\0';
        if (!l || line[0] == '#') continue;
        if (n + 1 >= cap) {
            char **p = realloc(paths, sizeof(char *) * (size_t)(cap *= 2));
            if (!p) break;
            paths = p;
        }
        paths[n++] = root ? di_path_join(root, line) : strdup(line);
    }
    free(buf);
    if (paths) paths[n] = NULL;
    *n_out = n;
    return paths;
}

static void *xcalloc(size_t n, size_t sz, int *fail) {
    void *p = calloc(n ? n : 1, sz);
    if (!p) *fail = 1;
    return p;
}

int di_cmd_perplexity(int argc, char **argv) {
    const char *model_dir = NULL, *list = NULL, *root = NULL;
    const char *files[256];
    int n_files = 0, window = 512, batch_windows = 4, threads = 0, mtp = 0, json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--model") && has) model_dir = argv[++i];
        else if (!strcmp(a, "--file") && has) {
            if (n_files == 256) { fprintf(stderr, "deepinfer perplexity: at most 256 --file (use --list)\n"); return 2; }
            files[n_files++] = argv[++i];
        } else if (!strcmp(a, "--list") && has) list = argv[++i];
        else if (!strcmp(a, "--root") && has) root = argv[++i];
        else if (!strcmp(a, "--window") && has) window = atoi(argv[++i]);
        else if (!strcmp(a, "--batch-windows") && has) batch_windows = atoi(argv[++i]);
        else if (!strcmp(a, "--threads") && has) threads = atoi(argv[++i]);
        else if (!strcmp(a, "--mtp")) mtp = 1;
        else if (!strcmp(a, "--json")) json = 1;
        else { fprintf(stderr, "deepinfer perplexity: unknown or incomplete option '%s'\n", a); usage(stderr); return 2; }
    }
    if (!model_dir || (!n_files && !list)) { usage(stderr); return 2; }
    if (window < 2 || window > 1 << 20) { fprintf(stderr, "deepinfer perplexity: --window must be in [2, 1048576]\n"); return 2; }
    if (batch_windows < 1 || batch_windows > 256) { fprintf(stderr, "deepinfer perplexity: --batch-windows must be in [1, 256]\n"); return 2; }

    int n_list = 0;
    char **list_paths = NULL;
    if (list) {
        list_paths = read_list(list, root, &n_list);
        if (!list_paths) { fprintf(stderr, "deepinfer perplexity: %s\n", di_last_error()); return 1; }
    }

    di_tokenizer *tok = NULL;
    di_model *model = NULL;
    int rc = 1;
    ppl_ctx c = {0};
    ppl_totals t = {0};
    if (di_tokenizer_load(model_dir, &tok) != DI_OK) {
        fprintf(stderr, "deepinfer perplexity: %s\n", di_last_error());
        goto done;
    }
    int max_blocks = (window + DI_KV_BLOCK_SIZE - 1) / DI_KV_BLOCK_SIZE;
    di_model_options o = {0};
    o.device = DI_DEVICE_CPU;
    o.n_threads = threads;
    o.max_batch_tokens = window * batch_windows;
    o.max_seqs = batch_windows;
    o.kv_blocks = max_blocks * batch_windows;
    o.max_context = window;
    o.load_mtp = mtp;
    if (di_model_load(model_dir, &o, &model) != DI_OK) {
        fprintf(stderr, "deepinfer perplexity: %s\n", di_last_error());
        goto done;
    }
    if (mtp && di_model_mtp_layers(model) < 1) {
        fprintf(stderr, "deepinfer perplexity: --mtp: %s has no MTP layer (num_nextn_predict_layers = 0)\n", model_dir);
        goto done;
    }
    const di_model_config *cfg = di_model_config_of(model);
    c.model = model;
    c.vocab = cfg->vocab_size;
    c.hidden = cfg->hidden_size;
    c.window = window;
    c.max_windows = batch_windows;
    c.mtp = mtp;
    size_t T = (size_t)window * (size_t)batch_windows;
    int fail = 0;
    c.ids = xcalloc(T, sizeof(int32_t), &fail);
    c.next_ids = xcalloc(T, sizeof(int32_t), &fail);
    c.pos = xcalloc(T, sizeof(int32_t), &fail);
    c.slots = xcalloc(T, sizeof(int32_t), &fail);
    c.rows = xcalloc(T, sizeof(int32_t), &fail);
    c.seq_start = xcalloc((size_t)batch_windows + 1, sizeof(int32_t), &fail);
    c.ctx = xcalloc((size_t)batch_windows, sizeof(int32_t), &fail);
    c.blocks = xcalloc((size_t)batch_windows * (size_t)max_blocks, sizeof(int32_t), &fail);
    c.logits = xcalloc(T * (size_t)c.vocab, sizeof(float), &fail);
    if (mtp) {
        c.hidden_states = xcalloc(T * (size_t)c.hidden, sizeof(float), &fail);
        c.mtp_logits = xcalloc(T * (size_t)c.vocab, sizeof(float), &fail);
    }
    if (fail) { fprintf(stderr, "deepinfer perplexity: out of memory\n"); goto done; }

    double t0 = di_now_s();
    int n_total = n_list + n_files;
    for (int f = 0; f < n_total; f++) {
        const char *path = f < n_list ? list_paths[f] : files[f - n_list];
        if (eval_file(&c, tok, path, &t) != DI_OK) {
            fprintf(stderr, "deepinfer perplexity: %s\n", di_last_error());
            goto done;
        }
        if (!json && n_total > 1 && isatty(2))
            fprintf(stderr, "\r%d/%d files, %ld tokens", f + 1, n_total, t.tokens);
    }
    if (c.n_seq > 0 && run_packed(&c, &t) != DI_OK) {
        fprintf(stderr, "deepinfer perplexity: %s\n", di_last_error());
        goto done;
    }
    double secs = di_now_s() - t0;
    if (!json && n_total > 1 && isatty(2)) fputc('\n', stderr);
    if (t.predicted == 0) {
        fprintf(stderr, "deepinfer perplexity: no window had 2 or more tokens\n");
        goto done;
    }
    double ppl = exp(t.nll / (double)t.predicted);
    if (json) {
        printf("{\"files\": %d, \"bytes\": %zu, \"tokens\": %ld, \"windows\": %ld, \"window\": %d, "
               "\"predicted_tokens\": %ld, \"nll_sum\": %.9f, \"ppl\": %.9f, \"seconds\": %.3f",
               n_total, t.bytes, t.tokens, t.windows, window, t.predicted, t.nll, ppl, secs);
        if (mtp)
            printf(", \"mtp_positions\": %ld, \"mtp_accepted\": %ld, \"mtp_acceptance\": %.9f", t.mtp_positions,
                   t.mtp_accepted, t.mtp_positions ? (double)t.mtp_accepted / (double)t.mtp_positions : 0.0);
        printf("}\n");
    } else {
        printf("files %d, bytes %zu, tokens %ld, windows %ld (W=%d), predicted %ld\n", n_total, t.bytes, t.tokens,
               t.windows, window, t.predicted);
        printf("perplexity %.6f (mean NLL %.6f) in %.1f s (%.0f tokens/s)\n", ppl, t.nll / (double)t.predicted, secs,
               (double)t.tokens / (secs > 0 ? secs : 1));
        if (mtp)
            printf("MTP acceptance %.4f (%ld / %ld)\n",
                   t.mtp_positions ? (double)t.mtp_accepted / (double)t.mtp_positions : 0.0, t.mtp_accepted,
                   t.mtp_positions);
    }
    rc = 0;
done:
    free(c.ids); free(c.next_ids); free(c.pos); free(c.slots); free(c.rows); free(c.seq_start);
    free(c.ctx); free(c.blocks); free(c.logits); free(c.hidden_states); free(c.mtp_logits);
    di_model_free(model);
    di_tokenizer_free(tok);
    if (list_paths) {
        for (int i = 0; i < n_list; i++) free(list_paths[i]);
        free(list_paths);
    }
    return rc;
}
