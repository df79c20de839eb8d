/* request_json.c - OpenAI-shaped JSON requests -> di_request_input, outputs -> JSON (see
 * request_json.h for the accepted fields and the output shape). */
#include "engine/request_json.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "core/json_util.h"
#include "core/status.h"
#include "core/utf8.h"
#include "recipe/recipe.h"

static const char *const known[] = {
    "prompt", "prompt_token_ids", "messages", "max_tokens", "max_completion_tokens", "min_tokens", "temperature",
    "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "n", "logprobs", "top_logprobs", "presence_penalty",
    "frequency_penalty", "repetition_penalty", "ignore_eos", "skip_special_tokens", "logit_bias", "priority", "id",
    "custom_id", NULL};

/* Chat Completions fields the recipe layer reads; allowed with "messages" only. */
static const char *const chat_keys[] = {
    "model", "user", "tools", "tool_choice", "parallel_tool_calls", "response_format", "reasoning_effort", "thinking",
    "chat_template_kwargs", "stream", "stream_options", "add_generation_prompt", "continue_final_message", NULL};

static int in_list(const char *const *list, const char *key) {
    for (int i = 0; list[i]; i++)
        if (!strcmp(list[i], key)) return 1;
    return 0;
}

/* Renders and tokenizes a Chat Completions "messages" request into r->ids. */
static di_status chat_prompt(const json_t *o, const char *where, const struct di_tokenizer *tok, int format,
                             di_request_json *r) {
    if (!tok)
        return di_error(DI_ERR_UNSUPPORTED, "%s: field 'messages': chat requests need the model's tokenizer (none loaded)",
                        where);
    json_t *body = json_deep_copy(o);
    if (!body) return di_error(DI_ERR_NOMEM, "out of memory");
    if (!json_object_get(body, "model")) json_object_set_new(body, "model", json_string("deepinfer"));
    di_recipe_request rq;
    di_api_error err;
    memset(&err, 0, sizeof err);
    di_status s = di_recipe_request_prepare(DI_PROTO_CHAT, body, 0, (di_chat_format)format, tok, &rq, &err);
    json_decref(body);
    if (s != DI_OK) {
        if (err.message[0] && err.param[0]) return di_error(s, "%s: field '%s': %s", where, err.param, err.message);
        if (err.message[0]) return di_error(s, "%s: %s", where, err.message);
        return di_error_context(s, "%s: field 'messages'", where);
    }
    r->ids = malloc((rq.ids.n ? rq.ids.n : 1) * sizeof *r->ids);
    if (!r->ids) {
        di_recipe_request_clear(&rq);
        return di_error(DI_ERR_NOMEM, "out of memory");
    }
    memcpy(r->ids, rq.ids.data, rq.ids.n * sizeof *r->ids);
    r->in.prompt = NULL;
    r->in.prompt_ids = r->ids;
    r->in.n_prompt_ids = rq.ids.n;
    di_recipe_request_clear(&rq);
    return DI_OK;
}

static di_status type_error(const char *where, const char *key, const char *expected, const json_t *v) {
    return di_error(DI_ERR_FORMAT, "%s: field '%s': expected %s, got %s", where, key, expected, di_json_type_name(v));
}

static di_status opt_int32(const json_t *o, const char *key, const char *where, int *out) {
    int64_t v = *out;
    DI_TRY(di_json_opt_int(o, key, where, &v));
    if (v < INT_MIN || v > INT_MAX)
        return di_error(DI_ERR_INVALID_ARG, "%s: field '%s': %lld is out of range", where, key, (long long)v);
    *out = (int)v;
    return DI_OK;
}

static di_status opt_float(const json_t *o, const char *key, const char *where, float *out) {
    double v = *out;
    DI_TRY(di_json_opt_double(o, key, where, &v));
    *out = (float)v;
    return DI_OK;
}

/* an array of token ids (each in [0, INT32_MAX]) */
static di_status id_array(const json_t *v, const char *key, const char *where, int32_t **out, int *n) {
    if (!json_is_array(v)) return type_error(where, key, "an array of token ids", v);
    size_t len = json_array_size(v);
    if (len > (size_t)INT_MAX / 4) return di_error(DI_ERR_INVALID_ARG, "%s: field '%s': too many ids", where, key);
    int32_t *ids = malloc((len ? len : 1) * sizeof *ids);
    if (!ids) return di_error(DI_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < len; i++) {
        const json_t *e = json_array_get(v, i);
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > INT32_MAX) {
            free(ids);
            return di_error(DI_ERR_FORMAT, "%s: field '%s[%zu]': expected a non-negative integer token id, got %s", where,
                            key, i, di_json_type_name(e));
        }
        ids[i] = (int32_t)json_integer_value(e);
    }
    *out = ids;
    *n = (int)len;
    return DI_OK;
}

static di_status parse_stop(const json_t *v, const char *where, di_request_json *r) {
    size_t n = json_is_string(v) ? 1 : json_is_array(v) ? json_array_size(v) : 0;
    if (!json_is_string(v) && !json_is_array(v)) return type_error(where, "stop", "a string or an array of strings", v);
    if (n > 64) return di_error(DI_ERR_INVALID_ARG, "%s: field 'stop': %zu strings (at most 64)", where, n);
    r->stops = calloc(n ? n : 1, sizeof *r->stops);
    if (!r->stops) return di_error(DI_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *s = json_is_string(v) ? v : json_array_get(v, i);
        if (!json_is_string(s)) return di_error(DI_ERR_FORMAT, "%s: field 'stop[%zu]': expected a string, got %s", where, i, di_json_type_name(s));
        if (json_string_length(s) == 0 || strlen(json_string_value(s)) != json_string_length(s))
            return di_error(DI_ERR_INVALID_ARG, "%s: field 'stop[%zu]': expected a non-empty string without NUL", where, i);
        if (!(r->stops[i] = strdup(json_string_value(s)))) return di_error(DI_ERR_NOMEM, "out of memory");
        r->n_stops++;
    }
    r->in.sampling.stop = (const char *const *)r->stops;
    r->in.sampling.n_stop = r->n_stops;
    return DI_OK;
}

static di_status parse_logit_bias(const json_t *v, const char *where, di_request_json *r) {
    if (!json_is_object(v)) return type_error(where, "logit_bias", "an object {\"token id\": bias}", v);
    size_t n = json_object_size(v);
    r->bias_ids = malloc((n ? n : 1) * sizeof *r->bias_ids);
    r->bias_vals = malloc((n ? n : 1) * sizeof *r->bias_vals);
    if (!r->bias_ids || !r->bias_vals) return di_error(DI_ERR_NOMEM, "out of memory");
    const char *k;
    json_t *val;
    int i = 0;
    json_object_foreach((json_t *)v, k, val) {
        char *end;
        long id = strtol(k, &end, 10);
        if (!*k || *end || id < 0 || id > INT32_MAX)
            return di_error(DI_ERR_FORMAT, "%s: field 'logit_bias': key '%s' is not a token id", where, k);
        if (!json_is_number(val))
            return di_error(DI_ERR_FORMAT, "%s: field 'logit_bias[\"%s\"]': expected a number, got %s", where, k, di_json_type_name(val));
        r->bias_ids[i] = (int32_t)id;
        r->bias_vals[i] = (float)json_number_value(val);
        i++;
    }
    r->in.sampling.logit_bias_ids = r->bias_ids;
    r->in.sampling.logit_bias_values = r->bias_vals;
    r->in.sampling.n_logit_bias = i;
    return DI_OK;
}

static di_status parse_logprobs(const json_t *o, const char *where, di_sampling_params *p) {
    const json_t *lp = json_object_get(o, "logprobs"), *top = json_object_get(o, "top_logprobs");
    if (lp && !json_is_null(lp)) {
        if (json_is_boolean(lp)) p->logprobs = json_is_true(lp) ? 0 : -1;
        else if (json_is_integer(lp)) p->logprobs = json_integer_value(lp) < -1000 || json_integer_value(lp) > 1000 ? 1000 : (int)json_integer_value(lp);
        else return type_error(where, "logprobs", "an integer or a boolean", lp);
    }
    if (top && !json_is_null(top)) {
        if (!json_is_integer(top)) return type_error(where, "top_logprobs", "an integer", top);
        json_int_t t = json_integer_value(top);
        p->logprobs = t < -1000 || t > 1000 ? 1000 : (int)t;
    }
    return DI_OK;
}

static di_status parse(const json_t *o, const char *where, const struct di_tokenizer *tok, int format,
                       di_request_json *r) {
    if (!json_is_object(o)) return di_error(DI_ERR_FORMAT, "%s: expected a JSON object, got %s", where, di_json_type_name(o));
    const json_t *msgs = json_object_get(o, "messages");
    if (msgs && json_is_null(msgs)) msgs = NULL;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)o, key, v) {
        if (!in_list(known, key) && !(msgs && in_list(chat_keys, key)))
            return di_error(DI_ERR_FORMAT, "%s: unknown field '%s'%s", where, key,
                            in_list(chat_keys, key) ? " (a Chat Completions field: only with 'messages')" : "");
    }
    di_sampling_params *p = &r->in.sampling;
    const json_t *pr = json_object_get(o, "prompt"), *pi = json_object_get(o, "prompt_token_ids");
    if (pr && json_is_null(pr)) pr = NULL;
    if (pi && json_is_null(pi)) pi = NULL;
    if ((pr != NULL) + (pi != NULL) + (msgs != NULL) != 1)
        return di_error(DI_ERR_INVALID_ARG, "%s: give exactly one of 'prompt', 'prompt_token_ids' or 'messages'", where);
    if (msgs) {
        DI_TRY(chat_prompt(o, where, tok, format, r));
    } else if (pr) {
        if (!json_is_string(pr)) return type_error(where, "prompt", "a string", pr);
        size_t len = json_string_length(pr);
        if (strlen(json_string_value(pr)) != len) return di_error(DI_ERR_INVALID_ARG, "%s: field 'prompt': contains a NUL character", where);
        if (!(r->prompt = strdup(json_string_value(pr)))) return di_error(DI_ERR_NOMEM, "out of memory");
        r->in.prompt = r->prompt;
        r->in.prompt_ids = NULL;
    } else {
        int n = 0;
        DI_TRY(id_array(pi, "prompt_token_ids", where, &r->ids, &n));
        r->in.prompt = NULL;
        r->in.prompt_ids = r->ids;
        r->in.n_prompt_ids = (size_t)n;
    }
    DI_TRY(opt_int32(o, "max_completion_tokens", where, &p->max_tokens));
    DI_TRY(opt_int32(o, "max_tokens", where, &p->max_tokens));
    DI_TRY(opt_int32(o, "min_tokens", where, &p->min_tokens));
    DI_TRY(opt_float(o, "temperature", where, &p->temperature));
    DI_TRY(opt_float(o, "top_p", where, &p->top_p));
    DI_TRY(opt_int32(o, "top_k", where, &p->top_k));
    DI_TRY(opt_float(o, "min_p", where, &p->min_p));
    DI_TRY(opt_int32(o, "n", where, &p->n));
    DI_TRY(opt_float(o, "presence_penalty", where, &p->presence_penalty));
    DI_TRY(opt_float(o, "frequency_penalty", where, &p->frequency_penalty));
    DI_TRY(opt_float(o, "repetition_penalty", where, &p->repetition_penalty));
    DI_TRY(di_json_opt_bool(o, "ignore_eos", where, &p->ignore_eos));
    DI_TRY(di_json_opt_bool(o, "skip_special_tokens", where, &p->skip_special_tokens));
    DI_TRY(opt_int32(o, "priority", where, &r->in.priority));
    const json_t *seed = json_object_get(o, "seed");
    if (seed && !json_is_null(seed)) {
        if (!json_is_integer(seed) || json_integer_value(seed) < 0) return type_error(where, "seed", "a non-negative integer", seed);
        p->seed = (uint64_t)json_integer_value(seed);
        p->has_seed = 1;
    }
    DI_TRY(parse_logprobs(o, where, p));
    const json_t *st = json_object_get(o, "stop");
    if (st && !json_is_null(st)) DI_TRY(parse_stop(st, where, r));
    const json_t *sti = json_object_get(o, "stop_token_ids");
    if (sti && !json_is_null(sti)) {
        int n = 0;
        DI_TRY(id_array(sti, "stop_token_ids", where, &r->stop_ids, &n));
        p->stop_token_ids = r->stop_ids;
        p->n_stop_token_ids = n;
    }
    const json_t *lb = json_object_get(o, "logit_bias");
    if (lb && !json_is_null(lb)) DI_TRY(parse_logit_bias(lb, where, r));
    const char *ek = json_object_get(o, "custom_id") ? "custom_id" : json_object_get(o, "id") ? "id" : NULL;
    if (ek) {
        r->echo_key = ek;
        r->echo_id = json_incref(json_object_get(o, ek));
    }
    return DI_OK;
}

di_status di_request_json_parse(const json_t *obj, const di_request_input *defaults, const char *where,
                                const struct di_tokenizer *tok, int chat_format, di_request_json *out) {
    memset(out, 0, sizeof *out);
    out->in = *defaults;
    di_status s = parse(obj, where, tok, chat_format, out);
    if (s != DI_OK) di_request_json_free(out);
    return s;
}

void di_request_json_free(di_request_json *r) {
    if (!r) return;
    free(r->prompt);
    free(r->ids);
    for (int i = 0; i < r->n_stops; i++) free(r->stops[i]);
    free(r->stops);
    free(r->stop_ids);
    free(r->bias_ids);
    free(r->bias_vals);
    json_decref(r->echo_id);
    memset(r, 0, sizeof *r);
}

/* ---- output ---- */

static json_t *ids_json(const int32_t *ids, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_integer(ids[i]))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

static json_t *logprobs_json(const di_completion_output *c) {
    json_t *a = json_array();
    for (size_t i = 0; a && i < c->n_tokens; i++) {
        const di_token_logprob *lp = &c->logprobs[i];
        json_t *top = json_array();
        for (int k = 0; top && k < lp->n_top; k++)
            json_array_append_new(top, json_pack("{s:i,s:f}", "token_id", lp->top_tokens[k], "logprob", (double)lp->top_logprobs[k]));
        json_array_append_new(a, json_pack("{s:i,s:f,s:o}", "token_id", lp->token, "logprob", (double)lp->logprob,
                                           "top_logprobs", top ? top : json_array()));
    }
    return a;
}

/* text that is not valid UTF-8 (cannot come from the detokenizer) is replaced, not dropped */
static json_t *text_json(const char *t, size_t n) {
    json_t *s = json_stringn(t, n);
    return s ? s : json_string("\xef\xbf\xbd");
}

static int fill_choice(json_t *obj, const di_completion_output *c) {
    int err = 0;
    err |= json_object_set_new(obj, "text", text_json(c->text, c->text_len));
    err |= json_object_set_new(obj, "token_ids", ids_json(c->token_ids, c->n_tokens));
    err |= json_object_set_new(obj, "finish_reason", c->finish_reason == DI_FINISH_NONE
                                                         ? json_null()
                                                         : json_string(di_finish_reason_name(c->finish_reason)));
    if (c->stop_reason) err |= json_object_set_new(obj, "stop_reason", json_string(c->stop_reason));
    else if (c->stop_token >= 0) err |= json_object_set_new(obj, "stop_reason", json_integer(c->stop_token));
    if (c->logprobs) err |= json_object_set_new(obj, "logprobs", logprobs_json(c));
    return err;
}

json_t *di_request_output_json(const di_request_output *o, const di_request_json *req) {
    json_t *obj = json_object();
    if (!obj) return NULL;
    int err = 0;
    if (req && req->echo_id) err |= json_object_set(obj, req->echo_key, req->echo_id);
    if (o->n_choices == 1) {
        err |= fill_choice(obj, &o->choices[0]);
    } else {
        json_t *arr = json_array();
        for (size_t k = 0; arr && k < o->n_choices; k++) {
            json_t *c = json_object();
            if (!c) { err = 1; break; }
            err |= json_object_set_new(c, "index", json_integer((json_int_t)k));
            err |= fill_choice(c, &o->choices[k]);
            err |= json_array_append_new(arr, c);
        }
        err |= json_object_set_new(obj, "choices", arr);
    }
    json_t *usage = json_pack("{s:I,s:I,s:I,s:{s:I}}", "prompt_tokens", (json_int_t)o->prompt_tokens, "completion_tokens",
                              (json_int_t)o->completion_tokens, "total_tokens",
                              (json_int_t)(o->prompt_tokens + o->completion_tokens), "prompt_tokens_details",
                              "cached_tokens", (json_int_t)o->cached_tokens);
    err |= json_object_set_new(obj, "usage", usage);
    json_t *m = json_pack("{s:f,s:f,s:f,s:f}", "queue_s", o->timing.queue_s, "ttft_s", o->timing.ttft_s, "tpot_s",
                          o->timing.tpot_s, "e2e_s", o->timing.e2e_s);
    err |= json_object_set_new(obj, "metrics", m);
    if (err) {
        json_decref(obj);
        return NULL;
    }
    return obj;
}
