/* bench_recipe.c - throughput of the recipe layer:
 *   render: request JSON (already parsed) -> di_conv -> V3/R1/V3.1 prompt text, over the 300
 *           reference conversations (the baseline is tools/recipe/bench_jinja.py: jinja2 through
 *           transformers' compiled template on the same conversations);
 *   ids:    rendered prompt -> token ids (safe mode), when a tokenizer is given;
 *   parse:  the streaming output parser on a synthetic generated stream (reasoning, content and
 *           V3 tool calls, 1-4 byte tokens), events drained every token as a server would.
 * Times are process CPU time. Usage: bench_recipe [CONVERSATIONS.jsonl|-] [TOKENIZER_DIR]
 *   (default or "-": tests/data/recipe/render/conversations.jsonl.xz through xz -dc) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/status.h"
#include "recipe/recipe.h"

/* CPU time of this process: the shared build machine is often loaded, wall time is not. */
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static char *slurp(const char *cmd) {
    FILE *f = popen(cmd, "r");
    if (!f) return NULL;
    size_t cap = 1 << 20, n = 0, k;
    char *b = malloc(cap);
    while (b && (k = fread(b + n, 1, cap - n - 1, f)) > 0)
        if ((n += k) + 1 >= cap) b = realloc(b, cap *= 2);
    pclose(f);
    if (b) b[n] = 0;
    return b;
}

/* Converts a render line and encodes it in chat format f into pr; 0 on success. */
static int render_one(const json_t *req, int f, di_prompt *pr) {
    di_conv *c;
    di_api_error e;
    if (di_chat_request_parse(req, DI_CONVERT_RENDER_LINE, &c, &e) != DI_OK) return -1;
    di_encode_opts o = {.format = (di_chat_format)f, .add_generation_prompt = c->opt.add_generation_prompt,
                        .thinking = c->opt.thinking};
    di_status s = di_chat_encode(c, &o, pr);
    di_conv_free(c);
    return s == DI_OK ? 0 : -1;
}

/* Feeds text to the parser as ordinary tokens of 1-4 bytes, draining the events after each
 * token; adds to the token and event counts. */
static void feed_text(di_outparse *p, const char *text, size_t *tokens, size_t *events) {
    size_t k, ne;
    for (const char *s = text; *s; s += k, (*tokens)++) {
        k = 1 + (size_t)(s - text) % 4;
        if (k > strlen(s)) k = strlen(s);
        di_outparse_feed(p, 5000, s, k);
        di_outparse_events(p, &ne);
        *events += ne;
    }
}

int main(int argc, char **argv) {
    char cmd[4096];
    if (argc > 1 && argv[1][0] && strcmp(argv[1], "-")) snprintf(cmd, sizeof cmd, "cat '%s'", argv[1]);
    else snprintf(cmd, sizeof cmd, "xz -dc tests/data/recipe/render/conversations.jsonl.xz");
    char *data = slurp(cmd);
    if (!data) {
        fprintf(stderr, "bench_recipe: cannot read conversations (%s)\n", cmd);
        return 1;
    }
    json_t *reqs[1024];
    size_t n = 0;
    for (char *p = data; *p && n < 1024;) {
        char *nl = strchr(p, '\n');
        if (nl) *nl = 0;
        json_t *j = *p ? json_loads(p, 0, NULL) : NULL;
        if (j) reqs[n++] = j;
        p = nl ? nl + 1 : p + strlen(p);
    }
    if (n == 0) {
        fprintf(stderr, "bench_recipe: no conversations in the input\n");
        return 1;
    }
    di_tokenizer *tok = NULL;
    if (argc > 2 && di_tokenizer_load(argv[2], &tok) != DI_OK) {
        fprintf(stderr, "bench_recipe: %s\n", di_last_error());
        return 1;
    }
    const char *names[] = {"v3", "r1", "v3.1"};
    di_prompt pr;
    di_prompt_init(&pr);
    for (int f = 0; f < 3; f++) {
        int iters = 20;
        size_t bytes = 0, n_ids = 0;
        double t0 = now();
        for (int it = 0; it < iters; it++)
            for (size_t i = 0; i < n; i++)
                if (render_one(reqs[i], f, &pr) == 0) bytes += pr.len;
        double dt = now() - t0;
        printf("render %-4s: %zu conversations x %d: %.1f us/conversation, %.1f MB/s of prompt text\n", names[f], n,
               iters, dt / (n * iters) * 1e6, bytes / dt / 1e6);
        if (tok) {
            t0 = now();
            for (size_t i = 0; i < n; i++) {
                di_ids ids = {0};
                if (render_one(reqs[i], f, &pr) == 0 && di_prompt_to_ids(&pr, tok, &ids, NULL) == DI_OK) n_ids += ids.n;
                di_ids_free(&ids);
            }
            dt = now() - t0;
            printf("ids    %-4s: %.1f us/conversation including tokenization, %.2f M ids/s\n", names[f], dt / n * 1e6,
                   n_ids / dt / 1e6);
        }
    }
    di_prompt_free(&pr);

    /* parser: a synthetic stream of about 4M tokens */
    const char *reasoning = "Let me think about 東京 weather; the user wants °C. ";
    const char *content = "Here is the answer with a fence ```json\n{\"x\": 1}\n``` and more 🙂 text. ";
    const char *call = "get_weather\n```json\n{\"location\": \"東京\", \"unit\": \"celsius\", \"days\": [1, 2, 3]}\n```";
    size_t tokens = 0, events = 0;
    double t0 = now();
    for (int round = 0; round < 2000; round++) {
        di_outparse_config cfg;
        di_outparse_config_default(&cfg, DI_CHAT_FORMAT_R1);
        cfg.id_think_end = 128799;
        di_outparse *p = di_outparse_create(&cfg);
        for (int rep = 0; rep < 20; rep++) feed_text(p, reasoning, &tokens, &events);
        di_outparse_feed(p, 128799, "", 0);
        for (int rep = 0; rep < 20; rep++) feed_text(p, content, &tokens, &events);
        di_outparse_feed(p, 128806, "", 0);
        for (int c = 0; c < 4; c++) {
            di_outparse_feed(p, 128808, "", 0);
            di_outparse_feed(p, 5000, "function", 8);
            di_outparse_feed(p, 128814, "", 0);
            feed_text(p, call, &tokens, &events);
            di_outparse_feed(p, 128809, "", 0);
            tokens += 4;
        }
        di_outparse_feed(p, 128807, "", 0);
        di_outparse_feed(p, 1, "", 0);
        tokens += 4;
        di_outparse_free(p);
    }
    double dt = now() - t0;
    printf("parse: %zu tokens, %zu events: %.1f M tokens/s (%.0f ns/token)\n", tokens, events, tokens / dt / 1e6,
           dt / tokens * 1e9);
    for (size_t i = 0; i < n; i++) json_decref(reqs[i]);
    di_tokenizer_free(tok);
    free(data);
    return 0;
}
