/* generate.c - di_generate: the blocking batch API (validate all, queue all, step until done,
 * deep-copy each request's final output into the caller's array in input order). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "engine/engine_internal.h"

static void free_output(di_request_output *o) {
    for (size_t k = 0; k < o->n_choices && o->choices; k++) {
        di_completion_output *c = (di_completion_output *)&o->choices[k];
        free((void *)c->text);
        free((void *)c->token_ids);
        free((void *)c->logprobs);
        free((void *)c->stop_reason);
    }
    free((void *)o->choices);
    memset(o, 0, sizeof *o);
}

void di_generate_results_free(di_request_output *results, size_t n) {
    if (!results) return;
    for (size_t i = 0; i < n; i++) free_output(&results[i]);
    free(results);
}

static void *dup_mem(const void *src, size_t bytes) {
    void *d = malloc(bytes ? bytes : 1);
    if (d && bytes) memcpy(d, src, bytes);
    return d;
}

static di_status copy_output(di_request_output *dst, const di_request_output *src) {
    *dst = *src;
    dst->choices = NULL;
    di_completion_output *ch = calloc(src->n_choices, sizeof *ch);
    if (!ch) return di_error(DI_ERR_NOMEM, "out of memory copying results");
    dst->choices = ch;
    for (size_t k = 0; k < src->n_choices; k++) {
        const di_completion_output *s = &src->choices[k];
        di_completion_output *d = &ch[k];
        *d = *s;
        char *t = malloc(s->text_len + 1);
        d->text = t;
        d->token_ids = dup_mem(s->token_ids, s->n_tokens * sizeof *s->token_ids);
        d->logprobs = s->logprobs ? dup_mem(s->logprobs, s->n_tokens * sizeof *s->logprobs) : NULL;
        d->stop_reason = s->stop_reason ? strdup(s->stop_reason) : NULL;
        if (!t || !d->token_ids || (s->logprobs && !d->logprobs) || (s->stop_reason && !d->stop_reason))
            return di_error(DI_ERR_NOMEM, "out of memory copying results");
        memcpy(t, s->text, s->text_len);
        t[s->text_len] = '\0';
    }
    return DI_OK;
}

di_status di_generate(di_engine *e, const di_request_input *reqs, size_t n, di_request_output **results) {
    *results = NULL;
    if (n == 0) return DI_OK;
    di_req **prepared = calloc(n, sizeof *prepared);
    di_request_output *res = calloc(n, sizeof *res);
    uint8_t *done = calloc(n, 1);
    di_status s = (!prepared || !res || !done) ? di_error(DI_ERR_NOMEM, "out of memory for %zu requests", n) : DI_OK;
    char where[64];
    for (size_t i = 0; i < n && s == DI_OK; i++) {
        snprintf(where, sizeof where, "request %zu", i);
        s = di_engine_prepare_request(e, &reqs[i], where, &prepared[i]);
    }
    size_t queued = 0;
    int64_t first_id = e->next_id;
    for (size_t i = 0; i < n && s == DI_OK; i++) {
        s = di_engine_enqueue(e, prepared[i]);
        if (s == DI_OK) queued++;
    }
    if (s != DI_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", di_last_error());
        for (size_t i = queued; i < n && prepared; i++) di_req_free(e, prepared[i]);
        for (size_t i = 0; i < queued; i++) di_engine_abort(e, first_id + (int64_t)i);
        free(prepared);
        free(done);
        free(res);
        return di_error(s, "%s", msg);
    }
    free(prepared);
    /* ids are consecutive from first_id in input order */
    size_t n_done = 0;
    while (n_done < n && s == DI_OK) {
        const di_request_output *const *outs;
        size_t n_outs;
        s = di_engine_step(e, &outs, &n_outs);
        for (size_t j = 0; j < n_outs; j++) {
            const di_request_output *o = outs[j];
            int64_t i = o->request_id - first_id;
            if (!o->finished || i < 0 || (size_t)i >= n || done[i]) continue;
            di_status c = copy_output(&res[i], o);
            if (c != DI_OK && s == DI_OK) s = c;
            done[i] = 1;
            n_done++;
        }
    }
    free(done);
    if (s != DI_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", di_last_error());
        for (size_t i = 0; i < n; i++) di_engine_abort(e, first_id + (int64_t)i); /* finished ones: NOT_FOUND */
        di_generate_results_free(res, n);
        return di_error(s, "di_generate (%zu of %zu requests finished): %s", n_done, n, msg);
    }
    *results = res;
    return DI_OK;
}
