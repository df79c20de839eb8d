/* test_engine_fake.h - shared by the engine tests: a toy text codec (token t -> 1..3 ASCII
 * letters, token 0 = EOS -> no text), engine construction over the fake model, and the
 * reference generator: the same sampler applied to the fake model's logits computed directly
 * from the whole token list (no KV cache, no batching), i.e. what the engine must reproduce. */
#ifndef TEST_ENGINE_FAKE_H
#define TEST_ENGINE_FAKE_H
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "engine/engine_internal.h"
#include "engine/executor.h"
#include "sampling/rng.h"
#include "sampling/sampler.h"
#include "test_util.h"

#define FAKE_VOCAB 256
#define FAKE_EOS 0

/* ---- toy codec ---- */

static inline void tok_text(int32_t t, char *out) {
    if (t == FAKE_EOS) {
        out[0] = 0;
        return;
    }
    int n = 1 + t % 3;
    for (int i = 0; i < n; i++) out[i] = (char)('a' + (t * 7 + i * 3) % 26);
    out[n] = 0;
}

typedef struct toy_detok { int skip; } toy_detok;

static inline di_status toy_encode(void *ctx, const char *text, size_t len, int32_t **ids, size_t *n) {
    *ids = malloc((len ? len : 1) * sizeof **ids);
    if (!*ids) return di_error(DI_ERR_NOMEM, "oom");
    for (size_t i = 0; i < len; i++) {
        int found = -1;
        for (int t = 3; t < FAKE_VOCAB && found < 0; t += 3) {
            char s[4];
            tok_text(t, s);
            if (s[0] == text[i]) found = t;
        }
        if (found < 0) {
            free(*ids);
            *ids = NULL;
            return di_error(DI_ERR_FORMAT, "toy codec: byte %zu ('%c') has no token", i, text[i]);
        }
        (*ids)[i] = found;
    }
    *n = len;
    return DI_OK;
}

static void *toy_detok_create(void *ctx, int skip) {
    toy_detok *d = malloc(sizeof *d);
    if (d) d->skip = skip;
    return d;
}

static di_status toy_push(void *d, int32_t id, char **buf, size_t *len, size_t *cap) {
    char s[4];
    tok_text(id, s);
    size_t k = strlen(s);
    if (*len + k + 1 > *cap) {
        size_t nc = (*cap ? *cap : 16) * 2 + k;
        char *b = realloc(*buf, nc);
        if (!b) return di_error(DI_ERR_NOMEM, "oom");
        *buf = b;
        *cap = nc;
    }
    memcpy(*buf + *len, s, k);
    *len += k;
    (*buf)[*len] = 0;
    return DI_OK;
}

static di_status toy_flush(void *d, char **buf, size_t *len, size_t *cap) { return DI_OK; }
static void toy_detok_free(void *d) { free(d); }

static inline di_codec toy_codec(void) {
    di_codec c = {(void *)1, NULL, toy_encode, toy_detok_create, toy_push, toy_flush, toy_detok_free, NULL};
    return c;
}

/* ---- engines ---- */

typedef struct engine_setup {
    int blocks;
    int budget;
    int max_seqs;
    int prefix;
    int max_model_len;
    int with_codec;
    int decode_differs;  /* the fake's decode_differs (and so the engine's exact recompute) */
} engine_setup;

static inline di_fake_model_config fake_cfg(const engine_setup *s) {
    di_fake_model_config c = {.vocab_size = FAKE_VOCAB,
                              .n_kv_blocks = s->blocks,
                              .max_model_len = s->max_model_len ? s->max_model_len : 4096,
                              .max_batch_tokens = s->budget,
                              .max_seqs = s->max_seqs,
                              .eos_id = FAKE_EOS,
                              .seed = 17,
                              .decode_differs = s->decode_differs};
    return c;
}

static inline di_engine *make_engine(const engine_setup *s) {
    di_fake_model_config fc = fake_cfg(s);
    di_executor ex;
    CHECK_OK(di_executor_fake_create(&fc, &ex));
    di_engine_params p;
    di_engine_params_init(&p);
    p.max_batch_tokens = s->budget;
    p.max_seqs = s->max_seqs;
    p.enable_prefix_cache = s->prefix;
    p.seed = 5;
    di_codec c = toy_codec();
    di_engine *e = NULL;
    CHECK_OK(di_engine_create_with(&p, &ex, s->with_codec ? &c : NULL, &e));
    return e;
}

/* ---- reference ---- */

typedef struct ref_out {
    int32_t toks[512];
    int n;
    di_finish_reason finish;
} ref_out;

/* Generates like the engine must: tokens = prompt; repeat: logits of the whole context,
 * sample (position = len, stream), stop on EOS / stop ids (kept) or after max_new tokens. */
static inline void ref_generate(const di_fake_model_config *fc, const int32_t *prompt, int plen, const di_sampling_params *p,
                         uint64_t seed, int stream, int max_new, ref_out *out) {
    int32_t *ctx = malloc((size_t)(plen + max_new) * sizeof *ctx);
    memcpy(ctx, prompt, (size_t)plen * sizeof *ctx);
    int len = plen;
    float row[FAKE_VOCAB];
    di_sampler *s;
    di_sampler_create(FAKE_VOCAB, &s);
    di_token_counts pc = {0}, oc = {0};
    if (p->repetition_penalty != 1.0f)
        for (int i = 0; i < plen; i++) di_token_counts_add(&pc, prompt[i]);
    int32_t eos = FAKE_EOS;
    out->n = 0;
    out->finish = DI_FINISH_LENGTH;
    while (out->n < max_new) {
        di_fake_model_logits(fc, di_fake_model_context_hash(fc, ctx, plen, len), row);
        di_sample_request rq = {.params = p, .seed = seed, .position = (uint32_t)len, .stream = (uint32_t)stream,
                                .n_generated = out->n, .prompt_counts = pc.cap ? &pc : NULL,
                                .output_counts = oc.cap ? &oc : NULL, .eos_ids = &eos, .n_eos = 1};
        int32_t t;
        if (di_sampler_sample(s, row, &rq, &t, NULL) != DI_OK) break;
        ctx[len++] = t;
        out->toks[out->n++] = t;
        if (di_penalties_active(p)) di_token_counts_add(&oc, t);
        int stop = !p->ignore_eos && t == FAKE_EOS;
        for (int i = 0; i < p->n_stop_token_ids; i++) stop |= p->stop_token_ids[i] == t;
        if (stop) {
            out->finish = DI_FINISH_STOP;
            break;
        }
    }
    di_token_counts_free(&pc);
    di_token_counts_free(&oc);
    di_sampler_free(s);
    free(ctx);
}

/* The seed the engine gives a request without one. */
static inline uint64_t engine_seed_for(uint64_t engine_seed, int64_t id) {
    return di_rng_mix64(engine_seed ^ di_rng_mix64((uint64_t)id + 1));
}
#endif
