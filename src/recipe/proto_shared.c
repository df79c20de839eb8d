/* proto_shared.c - request pieces that two or three of the protocol converters (proto_chat.c,
 * proto_responses.c, proto_messages.c) read the same way: the request wrapper, "model", text
 * given as a string or as parts, tool definitions and tool choices, OpenAI structured output
 * and reasoning effort (declared in proto_util.h).
 *
 * Where the APIs differ only in spelling (Chat Completions nests a function under "function",
 * Responses does not; Anthropic words its errors without a final period), the difference is
 * decided here from the path's protocol, so each rule lives in one place. Every function leaves
 * the path as it found it on success; on error the path names the offending field. */
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "recipe/proto_util.h"

#define TRY(x) do { di_status s_ = (x); if (s_ != DI_OK) return s_; } while (0)

di_status di_proto_parse_request(di_proto_parse_fn parse, const json_t *req, unsigned flags, di_conv **out,
                                 di_api_error *e) {
    *out = NULL;
    di_conv *c = di_conv_create();
    if (!c) return perr_nomem(e);
    di_status s = parse(c, req, flags, e);
    if (s != DI_OK) {
        di_conv_free(c);
        return s;
    }
    *out = c;
    return DI_OK;
}

di_status di_proto_model(di_conv *c, const json_t *req, unsigned flags, di_jpath *p, di_api_error *e) {
    const char *model = NULL;
    if (flags & DI_CONVERT_RENDER_LINE) TRY(jopt_string(req, "model", p, e, &model));
    else TRY(jreq_string(req, "model", p, e, &model));
    if (model && di_conv_set_str(&c->model, model) != DI_OK) return perr_nomem(e);
    return DI_OK;
}

di_status di_proto_messages(di_conv *c, const json_t *req, di_proto_message_fn message, di_jpath *p,
                            di_api_error *e) {
    const json_t *msgs;
    TRY(jopt_array(req, "messages", p, e, &msgs));
    size_t o = jp_key(p, "messages");
    if (!msgs) return perr_missing(e, p);
    if (json_array_size(msgs) == 0) {
        if (p->proto == DI_PROTO_MESSAGES)
            return perr_value(e, p, "invalid_value", "at least one message is required");
        return perr_value(e, p, "empty_array", "empty array. Expected an array with minimum length 1, but got an "
                          "empty array instead.");
    }
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        size_t o2 = jp_idx(p, i);
        TRY(message(c, json_array_get(msgs, i), p, e));
        jp_pop(p, o2);
    }
    jp_pop(p, o);
    return DI_OK;
}

di_status di_proto_joined_text(const json_t *v, const char *expected, di_proto_part_text_fn part, const void *ctx,
                               di_jpath *p, di_api_error *e, char **out) {
    *out = NULL;
    if (json_is_string(v)) {
        if (!(*out = strdup(json_string_value(v)))) return perr_nomem(e);
        return DI_OK;
    }
    if (!json_is_array(v)) return perr_type(e, p, expected, v);
    char *acc = NULL;
    if (di_conv_append_str(&acc, NULL, "", 0) != DI_OK) return perr_nomem(e);
    for (size_t i = 0; i < json_array_size(v); i++) {
        size_t o = jp_idx(p, i);
        const char *text = NULL;
        di_status s = part(json_array_get(v, i), ctx, p, e, &text);
        if (s == DI_OK && di_conv_append_str(&acc, i ? "\n" : NULL, text, strlen(text)) != DI_OK) s = perr_nomem(e);
        if (s != DI_OK) {
            free(acc);
            return s;
        }
        jp_pop(p, o);
    }
    *out = acc;
    return DI_OK;
}

di_status di_proto_add_message(di_conv *c, di_role role, char *text, di_api_error *e, di_message **out) {
    di_message *m = di_conv_add_message(c, role);
    if (!m) {
        free(text);
        return perr_nomem(e);
    }
    m->content = text;
    if (out) *out = m;
    return DI_OK;
}

/* ---- tools ---- */

di_status di_proto_tool_name(const json_t *obj, di_jpath *p, di_api_error *e, const char **name) {
    TRY(jreq_string(obj, "name", p, e, name));
    if (di_tool_name_ok(*name)) return DI_OK;
    jp_key(p, "name");
    if (p->proto == DI_PROTO_MESSAGES)
        return perr_value(e, p, "invalid_value", "String should match pattern '^[a-zA-Z0-9_.:-]{1,128}$'");
    return perr_value(e, p, "invalid_value", "'%s' does not match the pattern '^[a-zA-Z0-9_.:-]{1,128}$'.", *name);
}

di_status di_proto_openai_tools(di_conv *c, const json_t *req, di_jpath *p, di_api_error *e) {
    const json_t *arr;
    TRY(jopt_array(req, "tools", p, e, &arr));
    if (!arr) return DI_OK;
    size_t o0 = jp_key(p, "tools");
    for (size_t i = 0; i < json_array_size(arr); i++) {
        const json_t *t = json_array_get(arr, i), *fn = t, *params = NULL;
        size_t o = jp_idx(p, i);
        if (!json_is_object(t)) return perr_type(e, p, "an object", t);
        const char *type = NULL, *name = NULL, *desc = NULL;
        TRY(jreq_string(t, "type", p, e, &type));
        if (strcmp(type, "function")) {
            jp_key(p, "type");
            return perr_value(e, p, "unsupported_value", "only 'function' tools are supported, got '%s'.", type);
        }
        if (p->proto == DI_PROTO_CHAT) {
            TRY(jopt_object(t, "function", p, e, &fn));
            if (!fn) {
                jp_key(p, "function");
                return perr_missing(e, p);
            }
            jp_key(p, "function");
        }
        TRY(di_proto_tool_name(fn, p, e, &name));
        TRY(jopt_string(fn, "description", p, e, &desc));
        TRY(jopt_object(fn, "parameters", p, e, &params));
        int strict = p->proto == DI_PROTO_RESPONSES;  /* the Responses API defaults strict to true */
        TRY(jopt_bool(fn, "strict", p, e, &strict));
        if (di_conv_add_tool(c, name, desc, (json_t *)params, strict) != DI_OK) return perr_nomem(e);
        jp_pop(p, o);
    }
    jp_pop(p, o0);
    return DI_OK;
}

di_status di_proto_named_tool_choice(di_conv *c, const char *name, di_jpath *p, di_api_error *e) {
    int found = 0;
    for (size_t i = 0; i < c->n_tools; i++) found |= !strcmp(c->tools[i].name, name);
    if (!found) {
        jp_key(p, "name");
        return perr_value(e, p, "invalid_value", "no tool named '%s' is among the request's tools%s", name,
                          p->proto == DI_PROTO_MESSAGES ? "" : ".");
    }
    c->opt.tool_choice = DI_TOOL_CHOICE_NAMED;
    if (di_conv_set_str(&c->opt.tool_choice_name, name) != DI_OK) return perr_nomem(e);
    return DI_OK;
}

di_status di_proto_openai_tool_choice(di_conv *c, const json_t *req, di_jpath *p, di_api_error *e) {
    const json_t *v = json_object_get(req, "tool_choice");
    if (!v || json_is_null(v)) {
        c->opt.tool_choice = c->n_tools || p->proto == DI_PROTO_RESPONSES ? DI_TOOL_CHOICE_AUTO : DI_TOOL_CHOICE_NONE;
        return DI_OK;
    }
    size_t o = jp_key(p, "tool_choice");
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        if (!strcmp(s, "none")) c->opt.tool_choice = DI_TOOL_CHOICE_NONE;
        else if (!strcmp(s, "auto")) c->opt.tool_choice = DI_TOOL_CHOICE_AUTO;
        else if (!strcmp(s, "required")) c->opt.tool_choice = DI_TOOL_CHOICE_REQUIRED;
        else return perr_value(e, p, "invalid_value", "'%s'. Supported values are: 'none', 'auto' and 'required'.", s);
    } else if (json_is_object(v)) {
        const char *type = NULL, *name = NULL;
        const json_t *fn = v;
        TRY(jreq_string(v, "type", p, e, &type));
        if (strcmp(type, "function")) {
            jp_key(p, "type");
            return perr_value(e, p, "unsupported_value", "only {\"type\": \"function\"} tool choices are supported.");
        }
        if (p->proto == DI_PROTO_CHAT) {
            TRY(jopt_object(v, "function", p, e, &fn));
            if (!fn) {
                jp_key(p, "function");
                return perr_missing(e, p);
            }
            jp_key(p, "function");
        }
        TRY(jreq_string(fn, "name", p, e, &name));
        TRY(di_proto_named_tool_choice(c, name, p, e));
    } else {
        return perr_type(e, p, "a string or an object", v);
    }
    if (c->opt.tool_choice != DI_TOOL_CHOICE_NONE && c->n_tools == 0)
        return perr_value(e, p, "invalid_value", "'tool_choice' is only allowed when 'tools' are specified.");
    jp_pop(p, o);
    return DI_OK;
}

/* ---- options ---- */

di_status di_proto_openai_response_format(di_conv *c, const json_t *fmt, di_jpath *p, di_api_error *e) {
    size_t o = p->len;
    const char *type = NULL;
    TRY(jreq_string(fmt, "type", p, e, &type));
    if (!strcmp(type, "text")) {
        c->opt.response_format = DI_RESPONSE_FORMAT_TEXT;
    } else if (!strcmp(type, "json_object")) {
        c->opt.response_format = DI_RESPONSE_FORMAT_JSON_OBJECT;
    } else if (!strcmp(type, "json_schema")) {
        const json_t *js = fmt, *schema = NULL;
        const char *name = NULL;
        if (p->proto == DI_PROTO_CHAT) {
            TRY(jopt_object(fmt, "json_schema", p, e, &js));
            if (!js) {
                jp_key(p, "json_schema");
                return perr_missing(e, p);
            }
            jp_key(p, "json_schema");
        }
        TRY(jreq_string(js, "name", p, e, &name));
        TRY(jopt_object(js, "schema", p, e, &schema));
        if (!schema && p->proto == DI_PROTO_RESPONSES) {
            jp_key(p, "schema");
            return perr_missing(e, p);
        }
        TRY(jopt_bool(js, "strict", p, e, &c->opt.response_format_strict));
        c->opt.response_format = DI_RESPONSE_FORMAT_JSON_SCHEMA;
        if (di_conv_set_str(&c->opt.response_format_name, name) != DI_OK) return perr_nomem(e);
        if (schema) c->opt.response_schema = json_incref((json_t *)schema);
    } else {
        jp_key(p, "type");
        return perr_value(e, p, "invalid_value", "'%s'. Supported values are: 'text', 'json_object' and "
                          "'json_schema'.", type);
    }
    jp_pop(p, o);
    return DI_OK;
}

di_status di_proto_reasoning_effort(di_conv *c, const json_t *obj, const char *key, di_jpath *p, di_api_error *e) {
    static const char *ok[] = {"none", "minimal", "low", "medium", "high", "xhigh"};
    const char *effort = NULL;
    TRY(jopt_string(obj, key, p, e, &effort));
    if (!effort) return DI_OK;
    int found = 0;
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) found |= !strcmp(ok[i], effort);
    if (!found) {
        jp_key(p, key);
        return perr_value(e, p, "invalid_value", "'%s'. Supported values are: 'none', 'minimal', 'low', "
                          "'medium', 'high' and 'xhigh'.", effort);
    }
    if (di_conv_set_str(&c->opt.reasoning_effort, effort) != DI_OK) return perr_nomem(e);
    c->opt.thinking = strcmp(effort, "none") ? DI_THINKING_ON : DI_THINKING_OFF;
    return DI_OK;
}
