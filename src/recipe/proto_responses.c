/* proto_responses.c - OpenAI Responses request (POST /v1/responses) -> di_conv.
 *
 * Accepted: model, instructions (a leading system message), input (a string = one user message,
 * or a list of items: messages with role user / system / developer / assistant and content as a
 * string or input_text / output_text / refusal parts; function_call; function_call_output;
 * reasoning), tools (flat {"type": "function", "name", "description", "parameters", "strict"}),
 * tool_choice, parallel_tool_calls, text.format (text / json_object / json_schema),
 * reasoning.effort, max_output_tokens, temperature, top_p, top_logprobs, stream, and the
 * extensions top_k, min_p, repetition_penalty, seed, stop.
 * Mapping of items to turns: function_call items following an assistant message (or each other)
 * become that assistant turn's tool calls; a reasoning item becomes the reasoning of the next
 * assistant turn; function_call_output items become tool turns.
 * Rejected: previous_response_id / conversation (this server keeps no state), non-function
 * tools, item types other than the above, image / file / audio inputs. */
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "recipe/proto_util.h"

#define TRY(x) do { di_status s_ = (x); if (s_ != DI_OK) return s_; } while (0)

/* Text of one content part (borrowed from the JSON). */
static di_status part_text(const json_t *part, const void *ctx, di_jpath *p, di_api_error *e, const char **text) {
    (void)ctx;
    if (!json_is_object(part)) return perr_type(e, p, "an object", part);
    const char *type = NULL;
    TRY(jreq_string(part, "type", p, e, &type));
    if (!strcmp(type, "input_text") || !strcmp(type, "output_text") || !strcmp(type, "text") ||
        !strcmp(type, "summary_text") || !strcmp(type, "reasoning_text"))
        return jreq_string(part, "text", p, e, text);
    if (!strcmp(type, "refusal")) return jreq_string(part, "refusal", p, e, text);
    jp_key(p, "type");
    if (!strcmp(type, "input_image") || !strcmp(type, "input_file") || !strcmp(type, "input_audio"))
        return perr_value(e, p, "unsupported_value", "content of type '%s' is not supported: this model takes text "
                          "only.", type);
    return perr_value(e, p, "invalid_value", "'%s' is not a supported content type.", type);
}

/* Text of a content field: a string or an array of text-bearing parts joined with "\n".
 * On error *out is NULL. */
static di_status content_text(const json_t *v, di_jpath *p, di_api_error *e, char **out) {
    return di_proto_joined_text(v, "a string or an array of content parts", part_text, NULL, p, e, out);
}

/* it[key]: required; its text (a string or parts) into *text (malloc'd). */
static di_status required_text(const json_t *it, const char *key, di_jpath *p, di_api_error *e, char **text) {
    const json_t *v = json_object_get(it, key);
    size_t o = jp_key(p, key);
    if (!v || json_is_null(v)) return perr_missing(e, p);
    TRY(content_text(v, p, e, text));
    jp_pop(p, o);
    return DI_OK;
}

typedef struct build {
    di_conv *c;
    char *pending_reasoning;  /* from a reasoning item, for the next assistant turn */
    int open_assistant;       /* the last message is an assistant turn calls may join */
} build;

static di_status take_reasoning(build *b, di_message *m, di_api_error *e) {
    if (!b->pending_reasoning) return DI_OK;
    if (m->reasoning) {
        di_status s = di_conv_append_str(&m->reasoning, "\n", b->pending_reasoning, strlen(b->pending_reasoning));
        free(b->pending_reasoning);
        b->pending_reasoning = NULL;
        return s == DI_OK ? DI_OK : perr_nomem(e);
    }
    m->reasoning = b->pending_reasoning;
    b->pending_reasoning = NULL;
    return DI_OK;
}

static di_status message_item(build *b, const json_t *it, di_jpath *p, di_api_error *e) {
    const char *role_s = NULL;
    TRY(jreq_string(it, "role", p, e, &role_s));
    di_role role;
    if (!strcmp(role_s, "user")) role = DI_ROLE_USER;
    else if (!strcmp(role_s, "assistant")) role = DI_ROLE_ASSISTANT;
    else if (!strcmp(role_s, "system") || !strcmp(role_s, "developer")) role = DI_ROLE_SYSTEM;
    else {
        jp_key(p, "role");
        return perr_value(e, p, "invalid_value", "'%s'. Supported values are: 'user', 'assistant', 'system', and "
                          "'developer'.", role_s);
    }
    char *text;
    TRY(required_text(it, "content", p, e, &text));
    di_message *m;
    TRY(di_proto_add_message(b->c, role, text, e, &m));
    b->open_assistant = role == DI_ROLE_ASSISTANT;
    if (role == DI_ROLE_ASSISTANT) TRY(take_reasoning(b, m, e));
    return DI_OK;
}

static di_status function_call_item(build *b, const json_t *it, di_jpath *p, di_api_error *e) {
    const char *call_id = NULL, *name = NULL, *args = NULL;
    TRY(jreq_string(it, "call_id", p, e, &call_id));
    TRY(jreq_string(it, "name", p, e, &name));
    TRY(jreq_string(it, "arguments", p, e, &args));
    di_message *m;
    if (b->open_assistant) {
        m = &b->c->msgs[b->c->n_msgs - 1];
    } else {
        if (!(m = di_conv_add_message(b->c, DI_ROLE_ASSISTANT))) return perr_nomem(e);
        b->open_assistant = 1;
    }
    TRY(take_reasoning(b, m, e));
    if (di_message_add_tool_call(m, call_id, "function", name, args) != DI_OK) return perr_nomem(e);
    return DI_OK;
}

static di_status function_output_item(build *b, const json_t *it, di_jpath *p, di_api_error *e) {
    const char *call_id = NULL;
    TRY(jreq_string(it, "call_id", p, e, &call_id));
    char *text;
    TRY(required_text(it, "output", p, e, &text));
    di_message *m;
    TRY(di_proto_add_message(b->c, DI_ROLE_TOOL, text, e, &m));
    if (di_conv_set_str(&m->tool_call_id, call_id) != DI_OK) return perr_nomem(e);
    b->open_assistant = 0;
    return DI_OK;
}

static di_status reasoning_item(build *b, const json_t *it, di_jpath *p, di_api_error *e) {
    const json_t *parts;
    TRY(jopt_array(it, "content", p, e, &parts));
    const char *key = "content";
    if (!parts || json_array_size(parts) == 0) {
        TRY(jopt_array(it, "summary", p, e, &parts));
        key = "summary";
    }
    if (!parts) return DI_OK;  /* encrypted-only reasoning: nothing we can use */
    size_t o = jp_key(p, key);
    char *text;
    TRY(content_text(parts, p, e, &text));
    jp_pop(p, o);
    if (b->pending_reasoning) {
        di_status s = di_conv_append_str(&b->pending_reasoning, "\n", text, strlen(text));
        free(text);
        if (s != DI_OK) return perr_nomem(e);
    } else {
        b->pending_reasoning = text;
    }
    return DI_OK;
}

static di_status input_items(build *b, const json_t *arr, di_jpath *p, di_api_error *e) {
    for (size_t i = 0; i < json_array_size(arr); i++) {
        const json_t *it = json_array_get(arr, i);
        size_t o = jp_idx(p, i);
        if (!json_is_object(it)) return perr_type(e, p, "an object", it);
        const char *type = NULL;
        TRY(jopt_string(it, "type", p, e, &type));
        if (!type || !strcmp(type, "message")) TRY(message_item(b, it, p, e));
        else if (!strcmp(type, "function_call")) TRY(function_call_item(b, it, p, e));
        else if (!strcmp(type, "function_call_output")) TRY(function_output_item(b, it, p, e));
        else if (!strcmp(type, "reasoning")) TRY(reasoning_item(b, it, p, e));
        else {
            jp_key(p, "type");
            return perr_value(e, p, "unsupported_value", "input items of type '%s' are not supported.", type);
        }
        jp_pop(p, o);
    }
    return DI_OK;
}

static di_status text_format(di_conv *c, const json_t *req, di_jpath *p, di_api_error *e) {
    const json_t *text, *fmt;
    TRY(jopt_object(req, "text", p, e, &text));
    if (!text) return DI_OK;
    size_t o = jp_key(p, "text");
    TRY(jopt_object(text, "format", p, e, &fmt));
    if (fmt) {
        jp_key(p, "format");
        TRY(di_proto_openai_response_format(c, fmt, p, e));
    }
    jp_pop(p, o);
    return DI_OK;
}

static di_status options(di_conv *c, const json_t *req, di_jpath *p, di_api_error *e) {
    const json_t *r;
    TRY(jopt_object(req, "reasoning", p, e, &r));
    if (r) {
        size_t o = jp_key(p, "reasoning");
        TRY(di_proto_reasoning_effort(c, r, "effort", p, e));
        jp_pop(p, o);
    }
    di_request_params *q = &c->params;
    TRY(jopt_int(req, "max_output_tokens", p, e, 1, INT32_MAX, &q->max_tokens));
    TRY(jopt_number(req, "temperature", p, e, 0, 2, &q->temperature));
    TRY(jopt_number(req, "top_p", p, e, 0, 1, &q->top_p));
    TRY(jopt_int(req, "top_logprobs", p, e, 0, 20, &q->top_logprobs));
    if (q->top_logprobs > 0) q->logprobs = 1;
    TRY(jopt_bool(req, "stream", p, e, &q->stream));
    TRY(jopt_int(req, "top_k", p, e, -1, INT32_MAX, &q->top_k));
    TRY(jopt_number(req, "min_p", p, e, 0, 1, &q->min_p));
    TRY(jopt_number(req, "repetition_penalty", p, e, 1e-6, 100, &q->repetition_penalty));
    TRY(jopt_stop(req, "stop", p, e, 16, q));
    TRY(jopt_seed(req, "seed", p, e, q));
    TRY(jopt_bool(req, "parallel_tool_calls", p, e, &c->opt.parallel_tool_calls));
    return DI_OK;
}

static di_status parse(di_conv *c, const json_t *req, unsigned flags, di_api_error *e) {
    di_jpath p;
    jp_init(&p, DI_PROTO_RESPONSES);
    if (!json_is_object(req)) return perr_type(e, &p, "an object (the request body)", req);
    const char *instructions = NULL, *user = NULL;
    TRY(di_proto_model(c, req, flags, &p, e));
    TRY(jopt_string(req, "user", &p, e, &user));
    if (user && di_conv_set_str(&c->user, user) != DI_OK) return perr_nomem(e);
    static const char *stateful[] = {"previous_response_id", "conversation", "prompt"};
    for (size_t i = 0; i < 3; i++) {
        const json_t *v = json_object_get(req, stateful[i]);
        if (v && !json_is_null(v)) {
            jp_key(&p, stateful[i]);
            return perr_value(e, &p, "unsupported_parameter", "'%s' is not supported: this server stores no "
                              "responses; send the whole conversation in 'input'.", stateful[i]);
        }
    }
    TRY(jopt_string(req, "instructions", &p, e, &instructions));
    if (instructions) {
        di_message *m = di_conv_add_message(c, DI_ROLE_SYSTEM);
        if (!m || !(m->content = strdup(instructions))) return perr_nomem(e);
    }
    const json_t *input = json_object_get(req, "input");
    size_t o = jp_key(&p, "input");
    if (!input || json_is_null(input)) return perr_missing(e, &p);
    build b = {c, NULL, 0};
    di_status s = DI_OK;
    if (json_is_string(input)) {
        di_message *m = di_conv_add_message(c, DI_ROLE_USER);
        if (!m || !(m->content = strdup(json_string_value(input)))) return perr_nomem(e);
    } else if (json_is_array(input)) {
        s = input_items(&b, input, &p, e);
    } else {
        s = perr_type(e, &p, "a string or an array of input items", input);
    }
    free(b.pending_reasoning);
    if (s != DI_OK) return s;
    jp_pop(&p, o);
    size_t n_turns = 0;
    for (size_t i = 0; i < c->n_msgs; i++) n_turns += c->msgs[i].role != DI_ROLE_SYSTEM;
    if (n_turns == 0) {
        jp_key(&p, "input");
        return perr_value(e, &p, "empty_array", "the input contains no user, assistant or tool items.");
    }
    TRY(di_proto_openai_tools(c, req, &p, e));
    TRY(di_proto_openai_tool_choice(c, req, &p, e));
    TRY(text_format(c, req, &p, e));
    TRY(options(c, req, &p, e));
    c->opt.add_generation_prompt = !(flags & DI_CONVERT_RENDER_LINE);
    return DI_OK;
}

di_status di_responses_request_parse(const json_t *req, unsigned flags, di_conv **out, di_api_error *err) {
    return di_proto_parse_request(parse, req, flags, out, err);
}
