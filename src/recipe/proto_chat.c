/* proto_chat.c - OpenAI Chat Completions request (POST /v1/chat/completions) -> di_conv.
 *
 * Accepted: model, messages (system / developer / user / assistant / tool; content as a string
 * or an array of text parts, joined with "\n"; assistant tool_calls, reasoning_content and the
 * DeepSeek "prefix" flag), tools, tool_choice, parallel_tool_calls, response_format (text /
 * json_object / json_schema), reasoning_effort, sampling fields (max_completion_tokens /
 * max_tokens, temperature, top_p, n, stop, seed, presence/frequency_penalty, logprobs,
 * top_logprobs, stream, stream_options) and the vLLM-style extensions top_k, min_p,
 * repetition_penalty, ignore_eos, add_generation_prompt, chat_template_kwargs.thinking and
 * thinking (bool or {"type": "enabled"|"disabled"}).
 * Rejected with a 400-style error: wrong types, out-of-range values, non-text content parts
 * (images, audio, files), the deprecated "function" role, tool_choice naming an absent tool. */
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "recipe/proto_util.h"

#define TRY(x) do { di_status s_ = (x); if (s_ != DI_OK) return s_; } while (0)

/* Text of one content part (borrowed from the JSON); ctx is the message's di_role. */
static di_status part_text(const json_t *part, const void *ctx, di_jpath *p, di_api_error *e, const char **text) {
    di_role role = *(const di_role *)ctx;
    if (!json_is_object(part)) return perr_type(e, p, "an object", part);
    const char *type = NULL;
    TRY(jreq_string(part, "type", p, e, &type));
    if (!strcmp(type, "text")) return jreq_string(part, "text", p, e, text);
    if (!strcmp(type, "refusal") && role == DI_ROLE_ASSISTANT) return jreq_string(part, "refusal", p, e, text);
    jp_key(p, "type");
    if (!strcmp(type, "image_url") || !strcmp(type, "input_audio") || !strcmp(type, "file") || !strcmp(type, "video_url"))
        return perr_value(e, p, "unsupported_value", "content parts of type '%s' are not supported: this model takes "
                          "text only.", type);
    return perr_value(e, p, "invalid_value", "'%s' is not a supported content part type for a %s message.", type,
                      di_role_name(role));
}

/* Content: string, array of parts, or null (*out stays NULL). On error *out is NULL. */
static di_status content(const json_t *v, di_role role, di_jpath *p, di_api_error *e, char **out) {
    *out = NULL;
    if (!v || json_is_null(v)) return DI_OK;
    return di_proto_joined_text(v, "one of a string or array of objects", part_text, &role, p, e, out);
}

static di_status tool_calls(const json_t *arr, di_message *m, di_jpath *p, di_api_error *e) {
    m->has_tool_calls_field = 1;
    for (size_t i = 0; i < json_array_size(arr); i++) {
        const json_t *tc = json_array_get(arr, i);
        size_t o = jp_idx(p, i);
        if (!json_is_object(tc)) return perr_type(e, p, "an object", tc);
        const char *id = NULL, *type = NULL, *name = NULL, *args = NULL;
        const json_t *fn;
        TRY(jopt_string(tc, "id", p, e, &id));
        TRY(jopt_string(tc, "type", p, e, &type));
        if (type && strcmp(type, "function")) {
            jp_key(p, "type");
            return perr_value(e, p, "invalid_value", "only 'function' tool calls are supported, got '%s'.", type);
        }
        TRY(jopt_object(tc, "function", p, e, &fn));
        if (!fn) {
            jp_key(p, "function");
            return perr_missing(e, p);
        }
        size_t o2 = jp_key(p, "function");
        TRY(jreq_string(fn, "name", p, e, &name));
        TRY(jreq_string(fn, "arguments", p, e, &args));
        jp_pop(p, o2);
        if (di_message_add_tool_call(m, id, type, name, args) != DI_OK) return perr_nomem(e);
        jp_pop(p, o);
    }
    return DI_OK;
}

static di_status message(di_conv *c, const json_t *jm, di_jpath *p, di_api_error *e) {
    if (!json_is_object(jm)) return perr_type(e, p, "an object", jm);
    const char *role_s = NULL;
    TRY(jreq_string(jm, "role", p, e, &role_s));
    di_role role;
    if (!strcmp(role_s, "system") || !strcmp(role_s, "developer")) role = DI_ROLE_SYSTEM;
    else if (!strcmp(role_s, "user")) role = DI_ROLE_USER;
    else if (!strcmp(role_s, "assistant")) role = DI_ROLE_ASSISTANT;
    else if (!strcmp(role_s, "tool")) role = DI_ROLE_TOOL;
    else {
        jp_key(p, "role");
        if (!strcmp(role_s, "function"))
            return perr_value(e, p, "unsupported_value", "the deprecated 'function' role is not supported; use "
                              "'tool' messages.");
        return perr_value(e, p, "invalid_value", "'%s'. Supported values are: 'system', 'assistant', 'user', "
                          "'tool', and 'developer'.", role_s);
    }
    di_message *m = di_conv_add_message(c, role);
    if (!m) return perr_nomem(e);
    const json_t *jc = json_object_get(jm, "content");
    size_t o = jp_key(p, "content");
    if (role != DI_ROLE_ASSISTANT && (!jc || json_is_null(jc))) return perr_missing(e, p);
    TRY(content(jc, role, p, e, &m->content));
    jp_pop(p, o);
    const char *name = NULL, *reasoning = NULL, *call_id = NULL;
    TRY(jopt_string(jm, "name", p, e, &name));
    if (name && di_conv_set_str(&m->name, name) != DI_OK) return perr_nomem(e);
    if (role == DI_ROLE_ASSISTANT) {
        TRY(jopt_string(jm, "reasoning_content", p, e, &reasoning));
        if (!reasoning) TRY(jopt_string(jm, "reasoning", p, e, &reasoning));
        if (reasoning && di_conv_set_str(&m->reasoning, reasoning) != DI_OK) return perr_nomem(e);
        TRY(jopt_bool(jm, "prefix", p, e, &m->prefix));
        const json_t *tcs;
        TRY(jopt_array(jm, "tool_calls", p, e, &tcs));
        if (tcs) {
            o = jp_key(p, "tool_calls");
            TRY(tool_calls(tcs, m, p, e));
            jp_pop(p, o);
        }
        if (!m->content && m->n_tool_calls == 0) {
            jp_key(p, "content");
            return perr_value(e, p, "invalid_value", "an assistant message needs 'content' or 'tool_calls'.");
        }
    }
    if (role == DI_ROLE_TOOL) {
        TRY(jreq_string(jm, "tool_call_id", p, e, &call_id));
        if (di_conv_set_str(&m->tool_call_id, call_id) != DI_OK) return perr_nomem(e);
    }
    return DI_OK;
}

static di_status response_format(di_conv *c, const json_t *req, di_jpath *p, di_api_error *e) {
    const json_t *rf;
    TRY(jopt_object(req, "response_format", p, e, &rf));
    if (!rf) return DI_OK;
    size_t o = jp_key(p, "response_format");
    TRY(di_proto_openai_response_format(c, rf, p, e));
    jp_pop(p, o);
    return DI_OK;
}

/* thinking: explicit "thinking" > chat_template_kwargs > reasoning_effort. */
static di_status thinking(di_conv *c, const json_t *req, di_jpath *p, di_api_error *e) {
    TRY(di_proto_reasoning_effort(c, req, "reasoning_effort", p, e));
    const json_t *kw;
    TRY(jopt_object(req, "chat_template_kwargs", p, e, &kw));
    if (kw) {
        size_t o = jp_key(p, "chat_template_kwargs");
        int t = -1;
        TRY(jopt_bool(kw, "enable_thinking", p, e, &t));
        TRY(jopt_bool(kw, "thinking", p, e, &t));
        if (t >= 0) c->opt.thinking = t ? DI_THINKING_ON : DI_THINKING_OFF;
        jp_pop(p, o);
    }
    const json_t *th = json_object_get(req, "thinking");
    if (th && !json_is_null(th)) {
        size_t o = jp_key(p, "thinking");
        if (json_is_boolean(th)) {
            c->opt.thinking = json_is_true(th) ? DI_THINKING_ON : DI_THINKING_OFF;
        } else if (json_is_object(th)) {
            const char *type = NULL;
            TRY(jreq_string(th, "type", p, e, &type));
            if (!strcmp(type, "enabled")) c->opt.thinking = DI_THINKING_ON;
            else if (!strcmp(type, "disabled")) c->opt.thinking = DI_THINKING_OFF;
            else {
                jp_key(p, "type");
                return perr_value(e, p, "invalid_value", "'%s'. Supported values are: 'enabled' and 'disabled'.", type);
            }
        } else {
            return perr_type(e, p, "a boolean or an object", th);
        }
        jp_pop(p, o);
    }
    return DI_OK;
}

static di_status sampling(di_conv *c, const json_t *req, di_jpath *p, di_api_error *e) {
    di_request_params *r = &c->params;
    TRY(jopt_int(req, "max_tokens", p, e, 1, INT32_MAX, &r->max_tokens));
    TRY(jopt_int(req, "max_completion_tokens", p, e, 1, INT32_MAX, &r->max_tokens));
    TRY(jopt_number(req, "temperature", p, e, 0, 2, &r->temperature));
    TRY(jopt_number(req, "top_p", p, e, 0, 1, &r->top_p));
    TRY(jopt_int(req, "top_k", p, e, -1, INT32_MAX, &r->top_k));
    TRY(jopt_number(req, "min_p", p, e, 0, 1, &r->min_p));
    TRY(jopt_number(req, "presence_penalty", p, e, -2, 2, &r->presence_penalty));
    TRY(jopt_number(req, "frequency_penalty", p, e, -2, 2, &r->frequency_penalty));
    TRY(jopt_number(req, "repetition_penalty", p, e, 1e-6, 100, &r->repetition_penalty));
    TRY(jopt_stop(req, "stop", p, e, 16, r));
    TRY(jopt_seed(req, "seed", p, e, r));
    TRY(jopt_int(req, "n", p, e, 1, 128, &r->n));
    TRY(jopt_bool(req, "logprobs", p, e, &r->logprobs));
    TRY(jopt_int(req, "top_logprobs", p, e, 0, 20, &r->top_logprobs));
    if (r->top_logprobs >= 0 && !r->logprobs) {
        size_t o = jp_key(p, "top_logprobs");
        TRY(perr_value(e, p, "invalid_value", "'top_logprobs' requires 'logprobs' to be true."));
        jp_pop(p, o);
    }
    TRY(jopt_bool(req, "stream", p, e, &r->stream));
    const json_t *so;
    TRY(jopt_object(req, "stream_options", p, e, &so));
    if (so) {
        size_t o = jp_key(p, "stream_options");
        if (!r->stream)
            return perr_value(e, p, "invalid_value", "'stream_options' is only allowed when 'stream' is true.");
        TRY(jopt_bool(so, "include_usage", p, e, &r->stream_include_usage));
        jp_pop(p, o);
    }
    TRY(jopt_bool(req, "ignore_eos", p, e, &r->ignore_eos));
    return DI_OK;
}

static di_status parse(di_conv *c, const json_t *req, unsigned flags, di_api_error *e) {
    di_jpath p;
    jp_init(&p, DI_PROTO_CHAT);
    if (!json_is_object(req)) return perr_type(e, &p, "an object (the request body)", req);
    const char *user = NULL;
    TRY(di_proto_model(c, req, flags, &p, e));
    TRY(jopt_string(req, "user", &p, e, &user));
    if (user && di_conv_set_str(&c->user, user) != DI_OK) return perr_nomem(e);

    TRY(di_proto_messages(c, req, message, &p, e));
    TRY(di_proto_openai_tools(c, req, &p, e));
    TRY(di_proto_openai_tool_choice(c, req, &p, e));
    TRY(jopt_bool(req, "parallel_tool_calls", &p, e, &c->opt.parallel_tool_calls));
    TRY(response_format(c, req, &p, e));
    TRY(thinking(c, req, &p, e));
    TRY(sampling(c, req, &p, e));
    c->opt.add_generation_prompt = !(flags & DI_CONVERT_RENDER_LINE);
    /* DeepSeek chat prefix completion: a final assistant message with "prefix": true is
     * continued (render lines keep the template's literal behaviour instead) */
    const di_message *last = &c->msgs[c->n_msgs - 1];
    if (!(flags & DI_CONVERT_RENDER_LINE) && last->role == DI_ROLE_ASSISTANT && last->prefix) {
        c->opt.continue_final_message = 1;
        c->opt.add_generation_prompt = 0;
    }
    TRY(jopt_bool(req, "continue_final_message", &p, e, &c->opt.continue_final_message));
    if (c->opt.continue_final_message) c->opt.add_generation_prompt = 0;
    TRY(jopt_bool(req, "add_generation_prompt", &p, e, &c->opt.add_generation_prompt));
    if (c->opt.continue_final_message && c->opt.add_generation_prompt)
        return perr_value(e, &p, "invalid_value", "'continue_final_message' and 'add_generation_prompt' cannot both "
                          "be true.");
    return DI_OK;
}

di_status di_chat_request_parse(const json_t *req, unsigned flags, di_conv **out, di_api_error *err) {
    return di_proto_parse_request(parse, req, flags, out, err);
}

di_status di_request_parse(di_proto proto, const json_t *req, unsigned flags, di_conv **out, di_api_error *err) {
    switch (proto) {
    case DI_PROTO_CHAT: return di_chat_request_parse(req, flags, out, err);
    case DI_PROTO_RESPONSES: return di_responses_request_parse(req, flags, out, err);
    case DI_PROTO_MESSAGES: return di_messages_request_parse(req, flags, out, err);
    }
    return di_error(DI_ERR_INVALID_ARG, "unknown protocol %d", (int)proto);
}
