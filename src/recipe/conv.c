/* conv.c - the conversation model: lifecycle, builders, request params, deterministic ids.
 * Owns nothing beyond what conv.h describes; all growth is by realloc doubling. */
#include "recipe/conv.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/hash.h"
#include "core/status.h"

di_conv *di_conv_create(void) {
    di_conv *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->opt.thinking = DI_THINKING_DEFAULT;
    c->opt.thinking_budget = -1;
    c->opt.parallel_tool_calls = 1;
    c->opt.add_generation_prompt = 1;
    di_request_params_init(&c->params);
    return c;
}

static void free_message(di_message *m) {
    free(m->content);
    free(m->reasoning);
    free(m->name);
    free(m->tool_call_id);
    for (size_t i = 0; i < m->n_tool_calls; i++) {
        di_tool_call *t = &m->tool_calls[i];
        free(t->id);
        free(t->type);
        free(t->name);
        free(t->arguments);
    }
    free(m->tool_calls);
}

void di_conv_free(di_conv *c) {
    if (!c) return;
    for (size_t i = 0; i < c->n_msgs; i++) free_message(&c->msgs[i]);
    free(c->msgs);
    for (size_t i = 0; i < c->n_tools; i++) {
        free(c->tools[i].name);
        free(c->tools[i].description);
        json_decref(c->tools[i].parameters);
    }
    free(c->tools);
    free(c->opt.reasoning_effort);
    free(c->opt.tool_choice_name);
    free(c->opt.response_format_name);
    json_decref(c->opt.response_schema);
    di_request_params_clear(&c->params);
    free(c->model);
    free(c->user);
    free(c);
}

static int grow(void **data, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap * 2 : 8;
    while (nc < need) nc *= 2;
    void *p = realloc(*data, nc * elem);
    if (!p) return -1;
    memset((char *)p + *cap * elem, 0, (nc - *cap) * elem);
    *data = p;
    *cap = nc;
    return 0;
}

di_message *di_conv_add_message(di_conv *c, di_role role) {
    if (grow((void **)&c->msgs, &c->cap_msgs, c->n_msgs + 1, sizeof *c->msgs)) return NULL;
    di_message *m = &c->msgs[c->n_msgs++];
    memset(m, 0, sizeof *m);
    m->role = role;
    return m;
}

static char *dup_or_null(const char *s, int *oom) {
    if (!s) return NULL;
    char *d = strdup(s);
    if (!d) *oom = 1;
    return d;
}

di_status di_message_add_tool_call(di_message *m, const char *id, const char *type, const char *name,
                                   const char *arguments) {
    di_tool_call *nt = realloc(m->tool_calls, (m->n_tool_calls + 1) * sizeof *nt);
    if (!nt) return di_error(DI_ERR_NOMEM, "out of memory adding a tool call");
    m->tool_calls = nt;
    di_tool_call *t = &nt[m->n_tool_calls];
    int oom = 0;
    t->id = dup_or_null(id, &oom);
    t->type = dup_or_null(type ? type : "function", &oom);
    t->name = dup_or_null(name ? name : "", &oom);
    t->arguments = dup_or_null(arguments ? arguments : "", &oom);
    m->n_tool_calls++;
    m->has_tool_calls_field = 1;
    if (oom) return di_error(DI_ERR_NOMEM, "out of memory adding a tool call");
    return DI_OK;
}

di_status di_conv_add_tool(di_conv *c, const char *name, const char *description, json_t *parameters,
                           int strict) {
    if (grow((void **)&c->tools, &c->cap_tools, c->n_tools + 1, sizeof *c->tools))
        return di_error(DI_ERR_NOMEM, "out of memory adding a tool");
    di_tool *t = &c->tools[c->n_tools++];
    int oom = 0;
    t->name = dup_or_null(name, &oom);
    t->description = dup_or_null(description, &oom);
    t->parameters = parameters ? json_incref(parameters) : NULL;
    t->strict = strict;
    if (oom) return di_error(DI_ERR_NOMEM, "out of memory adding a tool");
    return DI_OK;
}

di_status di_conv_set_str(char **dst, const char *src) {
    char *d = NULL;
    if (src && !(d = strdup(src))) return di_error(DI_ERR_NOMEM, "out of memory copying a string");
    free(*dst);
    *dst = d;
    return DI_OK;
}

di_status di_conv_append_str(char **dst, const char *sep, const char *src, size_t len) {
    size_t old = *dst ? strlen(*dst) : 0;
    size_t sl = (*dst && sep) ? strlen(sep) : 0;
    char *p = realloc(*dst, old + sl + len + 1);
    if (!p) return di_error(DI_ERR_NOMEM, "out of memory appending text");
    if (sl) memcpy(p + old, sep, sl);
    if (len) memcpy(p + old + sl, src, len);
    p[old + sl + len] = '\0';
    *dst = p;
    return DI_OK;
}

void di_request_params_init(di_request_params *p) {
    memset(p, 0, sizeof *p);
    p->max_tokens = -1;
    p->temperature = NAN;
    p->top_p = NAN;
    p->top_k = -1;
    p->min_p = NAN;
    p->presence_penalty = NAN;
    p->frequency_penalty = NAN;
    p->repetition_penalty = NAN;
    p->n = 1;
    p->top_logprobs = -1;
}

void di_request_params_clear(di_request_params *p) {
    for (size_t i = 0; i < p->n_stop; i++) free(p->stop[i]);
    free(p->stop);
    di_request_params_init(p);
}

const char *di_role_name(di_role r) {
    switch (r) {
    case DI_ROLE_SYSTEM: return "system";
    case DI_ROLE_USER: return "user";
    case DI_ROLE_ASSISTANT: return "assistant";
    case DI_ROLE_TOOL: return "tool";
    }
    return "?";
}

void di_recipe_make_id(char *out, size_t out_size, const char *prefix, uint64_t seed, uint64_t counter) {
    static const char digits[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    size_t pl = strlen(prefix);
    if (out_size == 0) return;
    if (pl + 25 > out_size) pl = out_size > 25 ? out_size - 25 : 0;
    memcpy(out, prefix, pl);
    uint64_t key[2] = {seed, counter};
    uint64_t h1 = di_hash64(key, sizeof key, 0x7265636970652d31ull);
    uint64_t h2 = di_hash64(key, sizeof key, h1);
    size_t o = pl;
    for (int i = 0; i < 24 && o + 1 < out_size; i++) {
        uint64_t *h = i < 12 ? &h1 : &h2;
        out[o++] = digits[*h % 62];
        *h /= 62;
    }
    out[o] = '\0';
}
