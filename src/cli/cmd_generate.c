/* cmd_generate.c - `deepinfer generate`: offline batch generation through the engine.
 *
 *   deepinfer generate --model DIR (--prompt TEXT ... | --prompt-ids 1,2,3 ... | --input IN.jsonl)
 *                      [--output OUT.jsonl] [sampling defaults] [engine options]
 *
 * Input lines and output lines are described in src/engine/request_json.h (OpenAI field
 * names; one output line per input line, in input order). Sampling flags set the defaults
 * for lines that omit a field. A progress bar goes to stderr when it is a terminal, then a
 * summary (requests, tokens, tokens/s, TTFT and TPOT p50/p99). Results go to --output, or to
 * stdout (JSONL for --input, the plain completion text for --prompt). Exit status: 0 ok,
 * 1 error (message on stderr), 2 usage error. Owner: engine. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h" /* di_precision_from_name */
#include "core/json_util.h"
#include "core/status.h"
#include "core/timer.h"
#include "core/utf8.h"
#include "deepinfer.h"
#include "engine/engine_internal.h"
#include "engine/request_json.h"
#include "recipe/encode.h"

#define CMD "deepinfer generate"

static void usage(FILE *f) {
    fprintf(f,
            "usage: " CMD " --model DIR (--prompt TEXT ... | --prompt-ids ID,ID,... ... | --input FILE.jsonl)\n"
            "                          [--output FILE.jsonl] [options]\n\n"
            "Generates completions for every prompt with continuous batching.\n\n"
            "input / output:\n"
            "  --model DIR              config.json + safetensors (+ tokenizer.json)\n"
            "  --tokenizer DIR          tokenizer directory (default: the model directory)\n"
            "  --prompt TEXT            a text prompt (repeatable)\n"
            "  --prompt-ids ID,ID,...   a prompt as token ids (repeatable)\n"
            "  --input FILE.jsonl       one request per line: {\"prompt\": ...}, {\"prompt_token_ids\": [...]}\n"
            "                           or {\"messages\": [...]} (Chat Completions shape, rendered with the\n"
            "                           DeepSeek chat format), each with OpenAI sampling fields\n"
            "                           (max_tokens, temperature, top_p, top_k,\n"
            "                           min_p, seed, stop, n, logprobs, presence_penalty, frequency_penalty,\n"
            "                           repetition_penalty, ignore_eos, min_tokens, stop_token_ids, logit_bias)\n"
            "  --output FILE.jsonl      one result per input, in input order: text, token_ids,\n"
            "                           finish_reason, usage (choices[] when n > 1)\n"
            "                           (default: stdout; JSONL for --input, plain text for --prompt)\n"
            "  --chat-format F          v3 (default), r1 or v3.1: the format of \"messages\" requests\n"
            "  --quiet                  no progress bar and no summary\n\n"
            "sampling defaults (for prompts / lines that do not set them):\n"
            "  --max-tokens N (16)  --min-tokens N (0)  --temperature F (1.0; 0 = greedy)\n"
            "  --top-p F (1)  --top-k N (off)  --min-p F (0)  --seed N (per request: derived)\n"
            "  --stop STR (repeatable)  --n N (1)  --logprobs N (off)  --ignore-eos\n"
            "  --presence-penalty F (0)  --frequency-penalty F (0)  --repetition-penalty F (1)\n\n"
            "engine:\n"
            "  --max-batch-tokens N     token budget per step (default 2048)\n"
            "  --max-seqs N             most running sequences (default 256)\n"
            "  --kv-blocks N            KV cache size in 64-token blocks (default: from memory)\n"
            "  --max-model-len N        context limit (default: the model's)\n"
            "  --no-prefix-cache        disable prefix caching\n"
            "  --device cpu|cuda        (default cpu)\n"
            "  --dtype auto|bf16|f32    activations and KV cache (auto: f32 on cpu, bf16 on cuda;\n"
            "                           f32 on cuda computes like the CPU, for reproducing references)\n"
            "  --threads N              CPU threads (default: DEEPINFER_THREADS or all cores)\n"
            "  --engine-seed N          seeds requests without a seed (default 0)\n");
}

typedef struct prompt_arg {
    const char *text;      /* --prompt */
    const char *ids;       /* --prompt-ids */
} prompt_arg;

typedef struct options {
    di_engine_params ep;
    di_request_input def;
    const char *input, *output;
    prompt_arg *prompts;
    int n_prompts;
    const char **stops;
    int n_stops;
    int quiet;
    int chat_format;
} options;

static int fail_usage(const char *fmt, const char *a, const char *b) {
    fprintf(stderr, CMD ": ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n(see " CMD " --help)\n");
    return 2;
}

static int parse_long(const char *flag, const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi) {
        fprintf(stderr, CMD ": %s: expected an integer in [%ld, %ld], got '%s'\n", flag, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_float(const char *flag, const char *s, float *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !isfinite(v)) {
        fprintf(stderr, CMD ": %s: expected a number, got '%s'\n", flag, s);
        return -1;
    }
    *out = (float)v;
    return 0;
}

/* Returns 0 to run, 1 for --help (exit 0), 2 for a usage error. */
static int parse_args(int argc, char **argv, options *o) {
    di_engine_params_init(&o->ep);
    o->ep.stream_outputs = 0; /* results are written at the end: only final outputs */
    di_request_input_init(&o->def);
    o->prompts = calloc((size_t)argc, sizeof *o->prompts);
    o->stops = calloc((size_t)argc, sizeof *o->stops);
    if (!o->prompts || !o->stops) return fail_usage("out of memory%s%s", "", "");
    di_sampling_params *sp = &o->def.sampling;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return 1;
        if (!strcmp(a, "--quiet")) { o->quiet = 1; continue; }
        if (!strcmp(a, "--no-prefix-cache")) { o->ep.enable_prefix_cache = 0; continue; }
        if (!strcmp(a, "--ignore-eos")) { sp->ignore_eos = 1; continue; }
        if (strncmp(a, "--", 2) != 0) return fail_usage("unexpected argument '%s'%s", a, "");
        if (i + 1 >= argc) return fail_usage("%s needs a value%s", a, "");
        const char *v = argv[++i];
        long n = 0;
        int bad = 0;
        if (!strcmp(a, "--model")) o->ep.model_dir = v;
        else if (!strcmp(a, "--tokenizer")) o->ep.tokenizer_dir = v;
        else if (!strcmp(a, "--input")) o->input = v;
        else if (!strcmp(a, "--output")) o->output = v;
        else if (!strcmp(a, "--prompt")) o->prompts[o->n_prompts++].text = v;
        else if (!strcmp(a, "--prompt-ids")) o->prompts[o->n_prompts++].ids = v;
        else if (!strcmp(a, "--stop")) o->stops[o->n_stops++] = v;
        else if (!strcmp(a, "--chat-format")) {
            if ((o->chat_format = di_chat_format_parse(v)) < 0)
                return fail_usage("--chat-format: expected v3, r1 or v3.1, got '%s'%s", v, "");
        }
        else if (!strcmp(a, "--max-tokens")) { bad = parse_long(a, v, 1, INT_MAX, &n); sp->max_tokens = (int)n; }
        else if (!strcmp(a, "--min-tokens")) { bad = parse_long(a, v, 0, INT_MAX, &n); sp->min_tokens = (int)n; }
        else if (!strcmp(a, "--top-k")) { bad = parse_long(a, v, -1, INT_MAX, &n); sp->top_k = (int)n; }
        else if (!strcmp(a, "--n")) { bad = parse_long(a, v, 1, 128, &n); sp->n = (int)n; }
        else if (!strcmp(a, "--logprobs")) { bad = parse_long(a, v, -1, DI_MAX_TOP_LOGPROBS, &n); sp->logprobs = (int)n; }
        else if (!strcmp(a, "--seed")) { bad = parse_long(a, v, 0, LONG_MAX, &n); sp->seed = (uint64_t)n; sp->has_seed = 1; }
        else if (!strcmp(a, "--temperature")) bad = parse_float(a, v, &sp->temperature);
        else if (!strcmp(a, "--top-p")) bad = parse_float(a, v, &sp->top_p);
        else if (!strcmp(a, "--min-p")) bad = parse_float(a, v, &sp->min_p);
        else if (!strcmp(a, "--presence-penalty")) bad = parse_float(a, v, &sp->presence_penalty);
        else if (!strcmp(a, "--frequency-penalty")) bad = parse_float(a, v, &sp->frequency_penalty);
        else if (!strcmp(a, "--repetition-penalty")) bad = parse_float(a, v, &sp->repetition_penalty);
        else if (!strcmp(a, "--max-batch-tokens")) { bad = parse_long(a, v, 1, 1 << 24, &n); o->ep.max_batch_tokens = (int)n; }
        else if (!strcmp(a, "--max-seqs")) { bad = parse_long(a, v, 1, 1 << 20, &n); o->ep.max_seqs = (int)n; }
        else if (!strcmp(a, "--kv-blocks")) { bad = parse_long(a, v, 1, INT_MAX / 64, &n); o->ep.kv_blocks = (int)n; }
        else if (!strcmp(a, "--max-model-len")) { bad = parse_long(a, v, 2, 1 << 30, &n); o->ep.max_model_len = (int)n; }
        else if (!strcmp(a, "--threads")) { bad = parse_long(a, v, 1, 4096, &n); o->ep.n_threads = (int)n; }
        else if (!strcmp(a, "--engine-seed")) { bad = parse_long(a, v, 0, LONG_MAX, &n); o->ep.seed = (uint64_t)n; }
        else if (!strcmp(a, "--dtype")) {
            int p = di_precision_from_name(v);
            if (p < 0) return fail_usage("--dtype: expected auto, bf16 or f32, got '%s'%s", v, "");
            o->ep.precision = p;
        } else if (!strcmp(a, "--device")) {
            if (!strcmp(v, "cpu")) o->ep.device = 0;
            else if (!strcmp(v, "cuda")) o->ep.device = 1;
            else return fail_usage("--device: expected cpu or cuda, got '%s'%s", v, "");
        } else return fail_usage("unknown option '%s'%s", a, "");
        if (bad) return 2;
    }
    if (!o->ep.model_dir) return fail_usage("--model DIR is required%s%s", "", "");
    if (!o->input && o->n_prompts == 0) return fail_usage("give --prompt, --prompt-ids or --input%s%s", "", "");
    if (o->input && o->n_prompts > 0) return fail_usage("--input cannot be combined with --prompt / --prompt-ids%s%s", "", "");
    for (int i = 0; i < o->n_stops; i++) {
        size_t bad_at;
        if (!o->stops[i][0]) return fail_usage("--stop: expected a non-empty string%s%s", "", "");
        if (!di_utf8_valid(o->stops[i], strlen(o->stops[i]), &bad_at))
            return fail_usage("--stop '%s': invalid UTF-8%s", o->stops[i], "");
    }
    if (o->n_stops) {
        sp->stop = o->stops;
        sp->n_stop = o->n_stops;
    }
    return 0;
}

/* ---- requests ---- */

typedef struct job {
    di_request_json req;
    char where[512];
    json_t *result;       /* output object once finished */
} job;

static di_status parse_ids_arg(const char *s, di_request_json *r) {
    size_t cap = 16, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) return di_error(DI_ERR_NOMEM, "out of memory");
    const char *p = s;
    for (;;) {
        char *end;
        errno = 0;
        long v = (*p >= '0' && *p <= '9') ? strtol(p, &end, 10) : -1;
        if (v < 0 || errno || v > INT32_MAX || (*end != ',' && *end != '\0')) {
            free(ids);
            return di_error(DI_ERR_INVALID_ARG, "--prompt-ids '%s': expected comma-separated token ids (offset %d)", s, (int)(p - s));
        }
        if (n == cap) {
            int32_t *t = realloc(ids, (cap *= 2) * sizeof *ids);
            if (!t) { free(ids); return di_error(DI_ERR_NOMEM, "out of memory"); }
            ids = t;
        }
        ids[n++] = (int32_t)v;
        if (*end == '\0') break;
        p = end + 1;
    }
    r->ids = ids;
    r->in.prompt_ids = ids;
    r->in.n_prompt_ids = n;
    return DI_OK;
}

static di_status load_prompts(const options *o, job **jobs, int *n_jobs) {
    job *j = calloc((size_t)o->n_prompts, sizeof *j);
    if (!j) return di_error(DI_ERR_NOMEM, "out of memory");
    *jobs = j;
    *n_jobs = o->n_prompts;
    for (int i = 0; i < o->n_prompts; i++) {
        j[i].req.in = o->def;
        snprintf(j[i].where, sizeof j[i].where, "prompt %d", i + 1);
        if (o->prompts[i].text) {
            j[i].req.in.prompt = o->prompts[i].text;
        } else {
            di_status s = parse_ids_arg(o->prompts[i].ids, &j[i].req);
            if (s != DI_OK) return s;
        }
    }
    return DI_OK;
}

static di_status load_jsonl(const options *o, const struct di_tokenizer *tok, job **jobs, int *n_jobs) {
    FILE *f = fopen(o->input, "r");
    if (!f) return di_error(DI_ERR_IO, "%s: cannot open: %s", o->input, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int n = 0, cap_jobs = 0, lineno = 0;
    job *j = NULL;
    di_status s = DI_OK;
    while (s == DI_OK && (len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        size_t k = (size_t)len;
        while (k > 0 && (line[k - 1] == '\n' || line[k - 1] == '\r' || line[k - 1] == ' ' || line[k - 1] == '\t')) k--;
        size_t b = 0;
        while (b < k && (line[b] == ' ' || line[b] == '\t')) b++;
        if (b == k) continue; /* blank line */
        if (n == cap_jobs) {
            cap_jobs = cap_jobs ? cap_jobs * 2 : 64;
            job *t = realloc(j, (size_t)cap_jobs * sizeof *t);
            if (!t) { s = di_error(DI_ERR_NOMEM, "out of memory"); break; }
            j = t;
        }
        memset(&j[n], 0, sizeof j[n]);
        snprintf(j[n].where, sizeof j[n].where, "%.490s:%d", o->input, lineno);
        json_t *obj = NULL;
        s = di_json_loadb(line + b, k - b, j[n].where, &obj);
        if (s == DI_OK) s = di_request_json_parse(obj, &o->def, j[n].where, tok, o->chat_format, &j[n].req);
        json_decref(obj);
        if (s == DI_OK) n++;
    }
    if (s == DI_OK && ferror(f)) s = di_error(DI_ERR_IO, "%s: read error", o->input);
    free(line);
    fclose(f);
    *jobs = j;
    *n_jobs = n;
    if (s == DI_OK && n == 0) s = di_error(DI_ERR_INVALID_ARG, "%s: no requests (the file is empty)", o->input);
    return s;
}

/* ---- progress and summary ---- */

static void progress(int done, int total, uint64_t tokens, double elapsed) {
    const int W = 30;
    int fill = total ? done * W / total : W;
    char bar[64];
    for (int i = 0; i < W; i++) bar[i] = i < fill ? '#' : '.';
    bar[W] = 0;
    fprintf(stderr, "\r[%s] %d/%d requests, %llu tokens, %.1f tok/s\033[K", bar, done, total, (unsigned long long)tokens,
            elapsed > 0 ? (double)tokens / elapsed : 0.0);
    fflush(stderr);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* nearest-rank percentile of a sorted array */
static double pct(const double *v, int n, double p) {
    if (n == 0) return 0.0;
    int k = (int)ceil(p / 100.0 * n) - 1;
    return v[k < 0 ? 0 : k >= n ? n - 1 : k];
}

typedef struct totals {
    double *ttft, *tpot;
    int n_ttft, n_tpot, completions;
    uint64_t in_tokens, out_tokens, cached;
} totals;

static void summary(const totals *t, int n_requests, double elapsed, const di_engine_stats *st) {
    qsort(t->ttft, (size_t)t->n_ttft, sizeof(double), cmp_double);
    qsort(t->tpot, (size_t)t->n_tpot, sizeof(double), cmp_double);
    fprintf(stderr, "requests: %d (%d completions)  input tokens: %llu (prefix cache hits: %llu)  output tokens: %llu\n",
            n_requests, t->completions, (unsigned long long)t->in_tokens, (unsigned long long)t->cached,
            (unsigned long long)t->out_tokens);
    fprintf(stderr, "elapsed: %.3f s  output: %.1f tok/s  input+output: %.1f tok/s  steps: %llu  preemptions: %llu\n",
            elapsed, elapsed > 0 ? (double)t->out_tokens / elapsed : 0.0,
            elapsed > 0 ? (double)(t->in_tokens + t->out_tokens) / elapsed : 0.0, (unsigned long long)st->steps,
            (unsigned long long)st->preemptions);
    fprintf(stderr, "TTFT p50 / p99: %.2f / %.2f ms   TPOT p50 / p99: %.2f / %.2f ms\n", 1e3 * pct(t->ttft, t->n_ttft, 50),
            1e3 * pct(t->ttft, t->n_ttft, 99), 1e3 * pct(t->tpot, t->n_tpot, 50), 1e3 * pct(t->tpot, t->n_tpot, 99));
}

/* ---- results ---- */

static int write_results(const options *o, job *jobs, int n) {
    FILE *f = stdout;
    if (o->output && !(f = fopen(o->output, "w"))) {
        fprintf(stderr, CMD ": %s: cannot open for writing: %s\n", o->output, strerror(errno));
        return 1;
    }
    int json_lines = o->output || o->input;
    for (int i = 0; i < n; i++) {
        if (json_lines) {
            char *s = json_dumps(jobs[i].result, JSON_COMPACT | JSON_REAL_PRECISION(7));
            if (!s) { fprintf(stderr, CMD ": out of memory\n"); break; }
            fputs(s, f);
            fputc('\n', f);
            free(s);
        } else {
            json_t *ch = json_object_get(jobs[i].result, "choices");
            size_t nc = ch ? json_array_size(ch) : 1;
            for (size_t k = 0; k < nc; k++) {
                json_t *c = ch ? json_array_get(ch, k) : jobs[i].result;
                if (n > 1 || nc > 1) fprintf(f, nc > 1 ? "--- prompt %d, completion %zu ---\n" : "--- prompt %d ---\n", i + 1, k);
                fputs(json_string_value(json_object_get(c, "text")), f);
                fputc('\n', f);
            }
        }
    }
    int err = ferror(f);
    if (f != stdout) err |= fclose(f) != 0;
    else fflush(f);
    if (err) {
        fprintf(stderr, CMD ": writing %s failed\n", o->output ? o->output : "stdout");
        return 1;
    }
    return 0;
}

static int run(const options *o, di_engine *e, job *jobs, int n) {
    di_status s;
    int64_t first = -1;
    for (int i = 0; i < n; i++) {
        int64_t id;
        s = di_engine_add_request(e, &jobs[i].req.in, &id);
        if (s != DI_OK) {
            fprintf(stderr, CMD ": %s: %s\n", jobs[i].where, di_last_error());
            return 1;
        }
        if (first < 0) first = id;
    }
    totals t = {0};
    t.ttft = calloc((size_t)n, sizeof(double));
    t.tpot = calloc((size_t)n, sizeof(double));
    int show = !o->quiet && isatty(STDERR_FILENO), done = 0, rc = 0;
    uint64_t t0 = di_now_ns(), last_draw = 0;
    while (done < n && rc == 0) {
        const di_request_output *const *outs;
        size_t n_outs;
        if (di_engine_step(e, &outs, &n_outs) != DI_OK) {
            fprintf(stderr, "%s" CMD ": %s\n", show ? "\n" : "", di_last_error());
            rc = 1;
            break;
        }
        for (size_t k = 0; k < n_outs; k++) {
            const di_request_output *r = outs[k];
            if (!r->finished) continue;
            job *jb = &jobs[r->request_id - first];
            if (!(jb->result = di_request_output_json(r, &jb->req))) { fprintf(stderr, CMD ": out of memory\n"); rc = 1; }
            done++;
            t.completions += (int)r->n_choices;
            t.in_tokens += r->prompt_tokens;
            t.out_tokens += r->completion_tokens;
            t.cached += r->cached_tokens;
            if (r->completion_tokens > 0) t.ttft[t.n_ttft++] = r->timing.ttft_s;
            if (r->timing.tpot_s > 0) t.tpot[t.n_tpot++] = r->timing.tpot_s;
        }
        uint64_t now = di_now_ns();
        if (show && (now - last_draw > 100000000ull || done == n)) {
            di_engine_stats st;
            di_engine_get_stats(e, &st);
            progress(done, n, st.generated_tokens, (double)(now - t0) * 1e-9);
            last_draw = now;
        }
    }
    double elapsed = (double)(di_now_ns() - t0) * 1e-9;
    if (show) fprintf(stderr, "\r\033[K");
    if (rc == 0) rc = write_results(o, jobs, n);
    if (rc == 0 && !o->quiet) {
        di_engine_stats st;
        di_engine_get_stats(e, &st);
        summary(&t, n, elapsed, &st);
    }
    free(t.ttft);
    free(t.tpot);
    return rc;
}

int di_cmd_generate(int argc, char **argv) {
    options o;
    memset(&o, 0, sizeof o);
    int rc = parse_args(argc, argv, &o);
    if (rc == 1) {
        usage(stdout);
        rc = 0;
        goto out;
    }
    if (rc) goto out;
    job *jobs = NULL;
    int n = 0;
    di_engine *e = NULL;
    di_status s = di_engine_create(&o.ep, &e);
    if (s == DI_OK) s = o.input ? load_jsonl(&o, di_engine_tokenizer(e), &jobs, &n) : load_prompts(&o, &jobs, &n);
    if (s != DI_OK) {
        fprintf(stderr, CMD ": %s\n", di_last_error());
        rc = 1;
    } else {
        rc = run(&o, e, jobs, n);
    }
    di_engine_free(e);
    for (int i = 0; i < n; i++) {
        di_request_json_free(&jobs[i].req);
        json_decref(jobs[i].result);
    }
    free(jobs);
out:
    free(o.prompts);
    free(o.stops);
    return rc;
}
