/* proto_messages.c - Anthropic Messages request (POST /v1/messages) -> di_conv.
 *
 * Accepted: model, max_tokens (required), system (a string or text blocks), messages (role user
 * / assistant; content a string or blocks: text, tool_use (assistant), tool_result (user),
 * thinking and redacted_thinking (assistant)), tools ({"name", "description", "input_schema"},
 * type absent or "custom"), tool_choice (auto / any / tool / none, disable_parallel_tool_use),
 * thinking ({"type": "enabled", "budget_tokens"} / {"type": "disabled"}), stop_sequences,
 * temperature (0..1), top_p, top_k, stream, metadata.user_id.
 * Mapping: text blocks of one message are joined with "\n"; each tool_result block becomes a
 * tool turn (in block order, text blocks between them a user turn); tool_use input objects are
 * serialised as Python's json.dumps would (the chat formats carry arguments as JSON text);
 * thinking blocks become the assistant turn's reasoning. A final assistant message is a prefill:
 * the model continues it (continue_final_message).
 * Errors use Anthropic's shape and field notation ("messages.1.content.0.text: Field required"). */
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "recipe/proto_util.h"

#define TRY(x) do { di_status s_ = (x); if (s_ != DI_OK) return s_; } while (0)

/* The "type" of a content block (an object). */
static di_status block_type(const json_t *b, di_jpath *p, di_api_error *e, const char **type) {
    if (!json_is_object(b)) return perr_type(e, p, "a valid dictionary", b);
    return jreq_string(b, "type", p, e, type);
}

/* Text of one text block (borrowed from the JSON). */
static di_status block_text(const json_t *b, const void *ctx, di_jpath *p, di_api_error *e, const char **text) {
    (void)ctx;
    const char *type = NULL;
    TRY(block_type(b, p, e, &type));
    if (strcmp(type, "text")) {
        jp_key(p, "type");
        return perr_value(e, p, "unsupported_value", "blocks of type '%s' are not supported here (text only).", type);
    }
    return jreq_string(b, "text", p, e, text);
}

/* Text of text blocks (or a string), joined with "\n"; other block types are rejected.
 * On error *out is NULL. */
static di_status text_blocks(const json_t *v, di_jpath *p, di_api_error *e, char **out) {
    return di_proto_joined_text(v, "a valid string or a list of text blocks", block_text, NULL, p, e, out);
}

/* Appends text to the turn being built for this message, creating it when needed. */
static di_status add_text(di_conv *c, di_message **cur, di_role role, const char *text, di_api_error *e) {
    if (!*cur) {
        if (!(*cur = di_conv_add_message(c, role))) return perr_nomem(e);
    }
    if (di_conv_append_str(&(*cur)->content, "\n", text, strlen(text)) != DI_OK) return perr_nomem(e);
    return DI_OK;
}

static di_status user_blocks(di_conv *c, const json_t *blocks, di_jpath *p, di_api_error *e) {
    di_message *cur = NULL;  /* the current user turn (text blocks) */
    for (size_t i = 0; i < json_array_size(blocks); i++) {
        const json_t *b = json_array_get(blocks, i);
        size_t o = jp_idx(p, i);
        const char *type = NULL;
        TRY(block_type(b, p, e, &type));
        if (!strcmp(type, "text")) {
            const char *text = NULL;
            TRY(jreq_string(b, "text", p, e, &text));
            TRY(add_text(c, &cur, DI_ROLE_USER, text, e));
        } else if (!strcmp(type, "tool_result")) {
            const char *id = NULL;
            TRY(jreq_string(b, "tool_use_id", p, e, &id));
            const json_t *jc = json_object_get(b, "content");
            char *text = NULL;
            if (jc && !json_is_null(jc)) {
                size_t o2 = jp_key(p, "content");
                TRY(text_blocks(jc, p, e, &text));
                jp_pop(p, o2);
            } else if (!(text = strdup(""))) {
                return perr_nomem(e);
            }
            di_message *m;
            TRY(di_proto_add_message(c, DI_ROLE_TOOL, text, e, &m));
            if (di_conv_set_str(&m->tool_call_id, id) != DI_OK) return perr_nomem(e);
            TRY(jopt_bool(b, "is_error", p, e, &m->is_error));
            cur = NULL;
        } else {
            jp_key(p, "type");
            if (!strcmp(type, "image") || !strcmp(type, "document") || !strcmp(type, "search_result"))
                return perr_value(e, p, "unsupported_value", "'%s' blocks are not supported: this model takes text "
                                  "only.", type);
            return perr_value(e, p, "invalid_value", "'%s' blocks are not allowed in a user message.", type);
        }
        jp_pop(p, o);
    }
    return DI_OK;
}

static di_status assistant_blocks(di_conv *c, const json_t *blocks, di_jpath *p, di_api_error *e) {
    di_message *m = di_conv_add_message(c, DI_ROLE_ASSISTANT);
    if (!m) return perr_nomem(e);
    size_t idx = c->n_msgs - 1;
    for (size_t i = 0; i < json_array_size(blocks); i++) {
        const json_t *b = json_array_get(blocks, i);
        size_t o = jp_idx(p, i);
        const char *type = NULL;
        TRY(block_type(b, p, e, &type));
        m = &c->msgs[idx];
        if (!strcmp(type, "text")) {
            const char *text = NULL;
            TRY(jreq_string(b, "text", p, e, &text));
            if (di_conv_append_str(&m->content, "\n", text, strlen(text)) != DI_OK) return perr_nomem(e);
        } else if (!strcmp(type, "thinking")) {
            const char *text = NULL;
            TRY(jreq_string(b, "thinking", p, e, &text));
            if (di_conv_append_str(&m->reasoning, "\n", text, strlen(text)) != DI_OK) return perr_nomem(e);
        } else if (!strcmp(type, "redacted_thinking")) {
            /* encrypted reasoning of another provider: nothing to render */
        } else if (!strcmp(type, "tool_use")) {
            const char *id = NULL, *name = NULL;
            const json_t *input;
            TRY(jreq_string(b, "id", p, e, &id));
            TRY(jreq_string(b, "name", p, e, &name));
            TRY(jopt_object(b, "input", p, e, &input));
            if (!input) {
                jp_key(p, "input");
                return perr_missing(e, p);
            }
            char *args = di_json_dumps_py(input);
            if (!args) return perr_nomem(e);
            di_status s = di_message_add_tool_call(m, id, "function", name, args);
            free(args);
            if (s != DI_OK) return perr_nomem(e);
        } else {
            jp_key(p, "type");
            return perr_value(e, p, "invalid_value", "'%s' blocks are not allowed in an assistant message.", type);
        }
        jp_pop(p, o);
    }
    return DI_OK;
}

static di_status message(di_conv *c, const json_t *jm, di_jpath *p, di_api_error *e) {
    if (!json_is_object(jm)) return perr_type(e, p, "a valid dictionary", jm);
    const char *role = NULL;
    TRY(jreq_string(jm, "role", p, e, &role));
    int user = !strcmp(role, "user");
    if (!user && strcmp(role, "assistant")) {
        jp_key(p, "role");
        return perr_value(e, p, "invalid_value", "Input should be 'user' or 'assistant'");
    }
    const json_t *jc = json_object_get(jm, "content");
    size_t o = jp_key(p, "content");
    if (!jc || json_is_null(jc)) return perr_missing(e, p);
    if (json_is_string(jc)) {
        di_message *m = di_conv_add_message(c, user ? DI_ROLE_USER : DI_ROLE_ASSISTANT);
        if (!m || !(m->content = strdup(json_string_value(jc)))) return perr_nomem(e);
    } else if (json_is_array(jc)) {
        if (json_array_size(jc) == 0)
            return perr_value(e, p, "invalid_value", "all messages must have non-empty content except for the "
                              "optional final assistant message");
        if (user) TRY(user_blocks(c, jc, p, e));
        else TRY(assistant_blocks(c, jc, p, e));
    } else {
        return perr_type(e, p, "a valid string or a list of content blocks", jc);
    }
    jp_pop(p, o);
    return DI_OK;
}

static di_status tools(di_conv *c, const json_t *req, di_jpath *p, di_api_error *e) {
    const json_t *arr;
    TRY(jopt_array(req, "tools", p, e, &arr));
    if (!arr) return DI_OK;
    size_t o0 = jp_key(p, "tools");
    for (size_t i = 0; i < json_array_size(arr); i++) {
        const json_t *t = json_array_get(arr, i), *schema;
        size_t o = jp_idx(p, i);
        if (!json_is_object(t)) return perr_type(e, p, "a valid dictionary", t);
        const char *type = NULL, *name = NULL, *desc = NULL;
        TRY(jopt_string(t, "type", p, e, &type));
        if (type && strcmp(type, "custom")) {
            jp_key(p, "type");
            return perr_value(e, p, "unsupported_value", "server tools ('%s') are not supported; only custom tools "
                              "with an input_schema.", type);
        }
        TRY(di_proto_tool_name(t, p, e, &name));
        TRY(jopt_string(t, "description", p, e, &desc));
        TRY(jopt_object(t, "input_schema", p, e, &schema));
        if (!schema) {
            jp_key(p, "input_schema");
            return perr_missing(e, p);
        }
        if (di_conv_add_tool(c, name, desc, (json_t *)schema, 0) != DI_OK) return perr_nomem(e);
        jp_pop(p, o);
    }
    jp_pop(p, o0);
    return DI_OK;
}

static di_status tool_choice(di_conv *c, const json_t *req, di_jpath *p, di_api_error *e) {
    const json_t *tc;
    c->opt.tool_choice = c->n_tools ? DI_TOOL_CHOICE_AUTO : DI_TOOL_CHOICE_NONE;
    TRY(jopt_object(req, "tool_choice", p, e, &tc));
    if (!tc) return DI_OK;
    size_t o = jp_key(p, "tool_choice");
    const char *type = NULL, *name = NULL;
    TRY(jreq_string(tc, "type", p, e, &type));
    if (!strcmp(type, "auto")) c->opt.tool_choice = DI_TOOL_CHOICE_AUTO;
    else if (!strcmp(type, "any")) c->opt.tool_choice = DI_TOOL_CHOICE_REQUIRED;
    else if (!strcmp(type, "none")) c->opt.tool_choice = DI_TOOL_CHOICE_NONE;
    else if (!strcmp(type, "tool")) {
        TRY(jreq_string(tc, "name", p, e, &name));
        TRY(di_proto_named_tool_choice(c, name, p, e));
    } else {
        jp_key(p, "type");
        return perr_value(e, p, "invalid_value", "Input should be 'auto', 'any', 'tool' or 'none'");
    }
    int no_parallel = 0;
    TRY(jopt_bool(tc, "disable_parallel_tool_use", p, e, &no_parallel));
    c->opt.parallel_tool_calls = !no_parallel;
    if (c->opt.tool_choice != DI_TOOL_CHOICE_NONE && c->n_tools == 0)
        return perr_value(e, p, "invalid_value", "tool_choice requires tools");
    jp_pop(p, o);
    return DI_OK;
}

static di_status thinking(di_conv *c, const json_t *req, di_jpath *p, di_api_error *e) {
    const json_t *th;
    TRY(jopt_object(req, "thinking", p, e, &th));
    if (!th) return DI_OK;
    size_t o = jp_key(p, "thinking");
    const char *type = NULL;
    TRY(jreq_string(th, "type", p, e, &type));
    if (!strcmp(type, "enabled")) {
        c->opt.thinking = DI_THINKING_ON;
        if (!json_object_get(th, "budget_tokens")) {
            jp_key(p, "budget_tokens");
            return perr_missing(e, p);
        }
        TRY(jopt_int(th, "budget_tokens", p, e, 1024, INT32_MAX, &c->opt.thinking_budget));
        if (c->params.max_tokens > 0 && c->opt.thinking_budget >= c->params.max_tokens) {
            jp_key(p, "budget_tokens");
            return perr_value(e, p, "invalid_value", "`max_tokens` must be greater than `thinking.budget_tokens`");
        }
    } else if (!strcmp(type, "disabled")) {
        c->opt.thinking = DI_THINKING_OFF;
    } else {
        jp_key(p, "type");
        return perr_value(e, p, "invalid_value", "Input should be 'enabled' or 'disabled'");
    }
    jp_pop(p, o);
    return DI_OK;
}

static di_status parse(di_conv *c, const json_t *req, unsigned flags, di_api_error *e) {
    di_jpath p;
    jp_init(&p, DI_PROTO_MESSAGES);
    if (!json_is_object(req)) return perr_type(e, &p, "a valid dictionary (the request body)", req);
    TRY(di_proto_model(c, req, flags, &p, e));
    di_request_params *q = &c->params;
    if (!(flags & DI_CONVERT_RENDER_LINE) && !json_object_get(req, "max_tokens")) {
        jp_key(&p, "max_tokens");
        return perr_missing(e, &p);
    }
    TRY(jopt_int(req, "max_tokens", &p, e, 1, INT32_MAX, &q->max_tokens));
    const json_t *sys = json_object_get(req, "system");
    if (sys && !json_is_null(sys)) {
        size_t o = jp_key(&p, "system");
        char *text;
        TRY(text_blocks(sys, &p, e, &text));
        TRY(di_proto_add_message(c, DI_ROLE_SYSTEM, text, e, NULL));
        jp_pop(&p, o);
    }
    TRY(di_proto_messages(c, req, message, &p, e));
    TRY(tools(c, req, &p, e));
    TRY(tool_choice(c, req, &p, e));
    TRY(thinking(c, req, &p, e));
    const json_t *stops;
    TRY(jopt_array(req, "stop_sequences", &p, e, &stops));
    TRY(jopt_stop(req, "stop_sequences", &p, e, 64, q));
    TRY(jopt_number(req, "temperature", &p, e, 0, 1, &q->temperature));
    TRY(jopt_number(req, "top_p", &p, e, 0, 1, &q->top_p));
    TRY(jopt_int(req, "top_k", &p, e, 0, INT32_MAX, &q->top_k));
    TRY(jopt_bool(req, "stream", &p, e, &q->stream));
    const json_t *meta;
    TRY(jopt_object(req, "metadata", &p, e, &meta));
    if (meta) {
        const char *uid = NULL;
        size_t o = jp_key(&p, "metadata");
        TRY(jopt_string(meta, "user_id", &p, e, &uid));
        if (uid && di_conv_set_str(&c->user, uid) != DI_OK) return perr_nomem(e);
        jp_pop(&p, o);
    }
    /* a final assistant message is a prefill the model continues */
    const di_message *last = c->n_msgs ? &c->msgs[c->n_msgs - 1] : NULL;
    if (last && last->role == DI_ROLE_ASSISTANT) {
        if (last->n_tool_calls || !last->content) {
            jp_key(&p, "messages");
            jp_idx(&p, json_array_size(json_object_get(req, "messages")) - 1);
            return perr_value(e, &p, "invalid_value", "a final assistant message (prefill) must contain text only");
        }
        c->opt.continue_final_message = 1;
        c->opt.add_generation_prompt = 0;
    } else {
        c->opt.add_generation_prompt = !(flags & DI_CONVERT_RENDER_LINE);
    }
    return DI_OK;
}

di_status di_messages_request_parse(const json_t *req, unsigned flags, di_conv **out, di_api_error *err) {
    return di_proto_parse_request(parse, req, flags, out, err);
}
