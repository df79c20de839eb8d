/* test_recipe_proto.c - the three API protocols end to end, against fixtures written from the
 * public API documentation (the JSON files in tests/data/recipe/proto/):
 *   convert -> encode: the request converts to the same conversation as its hand-written
 *     Chat Completions equivalent, and encodes (V3, R1, V3.1) to the prompt jinja2 renders for
 *     that equivalent (tools/recipe/make_proto_fixtures.py);
 *   parse -> render: a model output token stream goes through the output parser and the
 *     protocol's renderers; the non-streaming body and the stream events must equal the
 *     documented shapes field by field ("$CALL_ID_k", "$ITEM_ID_<prefix>_k", "$SIGNATURE_k"
 *     stand for generated ids / signatures).
 * Plus validation errors in each API's error shape, and SSE serialisation. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json_util.h"
#include "core/mmap_file.h"
#include "core/status.h"
#include "recipe/encode.h"
#include "recipe/outparse.h"
#include "recipe/proto.h"
#include "recipe/proto_util.h"
#include "test_util.h"

static const char *FIXTURES[] = {"chat_basic", "chat_tools", "chat_tool_results", "chat_reasoning", "resp_basic",
                                 "resp_tools", "resp_reasoning", "msg_basic", "msg_tools", "msg_thinking", "msg_prefill"};

/* ---- placeholder-aware JSON comparison ---- */

typedef struct ctx { const di_out_result *r; uint64_t item_seed; char sig[64]; } ctx;

static int match_placeholder(const char *want, const char *got, ctx *c) {
    char id[64];
    if (!strncmp(want, "$CALL_ID_", 9)) {
        size_t k = (size_t)atoi(want + 9);
        return c->r && k < c->r->n_calls && !strcmp(got, c->r->calls[k].id);
    }
    if (!strncmp(want, "$ITEM_ID_", 9)) {  /* $ITEM_ID_<prefix>_<index>, prefix like "msg" */
        const char *us = strrchr(want, '_');
        char prefix[16];
        snprintf(prefix, sizeof prefix, "%.*s_", (int)(us - (want + 9)), want + 9);
        di_recipe_make_id(id, sizeof id, prefix, c->item_seed, (uint64_t)atoi(us + 1));
        return !strcmp(got, id);
    }
    if (!strncmp(want, "$SIGNATURE_", 11)) {  /* a stable marker: di1- + 16 hex, same everywhere */
        if (strlen(got) != 20 || strncmp(got, "di1-", 4)) return 0;
        for (int i = 4; i < 20; i++)
            if (!isxdigit((unsigned char)got[i])) return 0;
        if (!c->sig[0]) snprintf(c->sig, sizeof c->sig, "%s", got);
        return !strcmp(c->sig, got);
    }
    return !strcmp(want, got);
}

static int jmatch(const json_t *want, const json_t *got, ctx *c, char *where, size_t wl) {
    if (json_is_number(want) && json_is_number(got)) {
        if (json_number_value(want) == json_number_value(got)) return 1;
        snprintf(where, wl, "number %g != %g", json_number_value(want), json_number_value(got));
        return 0;
    }
    if (json_typeof(want) != json_typeof(got)) {
        snprintf(where, wl, "type differs");
        return 0;
    }
    if (json_is_string(want)) {
        if (match_placeholder(json_string_value(want), json_string_value(got), c)) return 1;
        snprintf(where, wl, "\"%s\" != \"%s\"", json_string_value(want), json_string_value(got));
        return 0;
    }
    if (json_is_array(want)) {
        if (json_array_size(want) != json_array_size(got)) {
            snprintf(where, wl, "array length %zu != %zu", json_array_size(want), json_array_size(got));
            return 0;
        }
        for (size_t i = 0; i < json_array_size(want); i++) {
            size_t n = strlen(where);
            snprintf(where + n, wl - n, "[%zu]", i);
            if (!jmatch(json_array_get(want, i), json_array_get(got, i), c, where, wl)) return 0;
            where[n] = 0;
        }
        return 1;
    }
    if (json_is_object(want)) {
        const char *k;
        json_t *v;
        if (json_object_size(want) != json_object_size(got)) {
            json_object_foreach((json_t *)got, k, v) if (!json_object_get(want, k)) {
                size_t n = strlen(where);
                snprintf(where + n, wl - n, ".%s (unexpected key)", k);
                return 0;
            }
            json_object_foreach((json_t *)want, k, v) if (!json_object_get(got, k)) {
                size_t n = strlen(where);
                snprintf(where + n, wl - n, ".%s (missing key)", k);
                return 0;
            }
        }
        json_object_foreach((json_t *)want, k, v) {
            size_t n = strlen(where);
            snprintf(where + n, wl - n, ".%s", k);
            if (!json_object_get(got, k) || !jmatch(v, json_object_get(got, k), c, where, wl)) return 0;
            where[n] = 0;
        }
        return 1;
    }
    return 1;  /* true / false / null of the same type */
}

static void check_json(const char *what, const json_t *want, const json_t *got, ctx *c) {
    char where[1024] = "";
    int ok = want && got && jmatch(want, got, c, where, sizeof where);
    char *g = got ? json_dumps(got, JSON_COMPACT) : NULL;
    CHECK_MSG(ok, "%s: mismatch at %s\n  got: %.3000s", what, where, g ? g : "(null)");
    free(g);
}

/* ---- conversation equality ---- */

static int str_eq(const char *a, const char *b) { return (!a && !b) || (a && b && !strcmp(a, b)); }

static void check_same_conv(const char *name, const di_conv *a, const di_conv *b) {
    CHECK_MSG(a->n_msgs == b->n_msgs, "%s: %zu messages, equivalent has %zu", name, a->n_msgs, b->n_msgs);
    for (size_t i = 0; i < a->n_msgs && i < b->n_msgs; i++) {
        const di_message *x = &a->msgs[i], *y = &b->msgs[i];
        CHECK_MSG(x->role == y->role && str_eq(x->content, y->content) && str_eq(x->reasoning, y->reasoning) &&
                      str_eq(x->tool_call_id, y->tool_call_id) && x->n_tool_calls == y->n_tool_calls,
                  "%s: message %zu differs (role %d/%d content '%s'/'%s' reasoning '%s'/'%s')", name, i, x->role, y->role,
                  x->content ? x->content : "(null)", y->content ? y->content : "(null)",
                  x->reasoning ? x->reasoning : "(null)", y->reasoning ? y->reasoning : "(null)");
        for (size_t k = 0; k < x->n_tool_calls && k < y->n_tool_calls; k++)
            CHECK_MSG(str_eq(x->tool_calls[k].id, y->tool_calls[k].id) && str_eq(x->tool_calls[k].name, y->tool_calls[k].name) &&
                          str_eq(x->tool_calls[k].arguments, y->tool_calls[k].arguments),
                      "%s: message %zu call %zu differs: %s(%s) vs %s(%s)", name, i, k, x->tool_calls[k].name,
                      x->tool_calls[k].arguments, y->tool_calls[k].name, y->tool_calls[k].arguments);
    }
    CHECK_MSG(a->opt.add_generation_prompt == b->opt.add_generation_prompt &&
                  a->opt.continue_final_message == b->opt.continue_final_message,
              "%s: generation prompt / continuation options differ", name);
}

/* ---- one fixture ---- */

static int32_t control_id(const char *s, int think_ids) {
    static const struct { const char *s; int32_t id; } t[] = {
        {DI_TOK_STR_EOS, 1}, {DI_TOK_STR_EOT, 128805}, {DI_TOK_STR_CALLS_BEGIN, 128806}, {DI_TOK_STR_CALLS_END, 128807},
        {DI_TOK_STR_CALL_BEGIN, 128808}, {DI_TOK_STR_CALL_END, 128809}, {DI_TOK_STR_SEP, 128814}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(s, t[i].s)) return t[i].id;
    if (think_ids && !strcmp(s, DI_TOK_STR_THINK)) return 128798;
    if (think_ids && !strcmp(s, DI_TOK_STR_THINK_END)) return 128799;
    return 5000;  /* an ordinary token */
}

static void run_fixture(const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "tests/data/recipe/proto/%s.json", name);
    json_t *fx;
    CHECK_OK(di_json_load_file(test_src_path(rel), &fx));
    if (!fx) return;
    const char *proto_s = json_string_value(json_object_get(fx, "protocol"));
    di_proto proto = !strcmp(proto_s, "chat") ? DI_PROTO_CHAT : !strcmp(proto_s, "responses") ? DI_PROTO_RESPONSES
                                                                                               : DI_PROTO_MESSAGES;
    /* convert the request and its Chat Completions equivalent */
    di_conv *conv = NULL, *eqc = NULL;
    di_api_error err;
    di_status s = di_request_parse(proto, json_object_get(fx, "request"), 0, &conv, &err);
    CHECK_MSG(s == DI_OK, "%s: request rejected: %s", name, err.message);
    json_t *eq = json_deep_copy(json_object_get(fx, "equivalent"));
    s = di_chat_request_parse(eq, DI_CONVERT_RENDER_LINE, &eqc, &err);
    CHECK_MSG(s == DI_OK, "%s: equivalent rejected: %s", name, err.message);
    json_decref(eq);
    if (!conv || !eqc) goto done;
    check_same_conv(name, conv, eqc);
    int want_thinking = json_is_true(json_object_get(json_object_get(fx, "equivalent"), "thinking"));
    CHECK_MSG((conv->opt.thinking == DI_THINKING_ON) == want_thinking, "%s: thinking option", name);

    /* encode -> jinja references */
    const json_t *prompts = json_object_get(fx, "expected_prompts");
    static const char *fmts[] = {"v3", "r1", "v3.1"};
    di_prompt pr;
    di_prompt_init(&pr);
    for (int f = 0; f < 3; f++) {
        di_encode_opts o = {.format = (di_chat_format)f, .add_generation_prompt = conv->opt.add_generation_prompt,
                            .thinking = conv->opt.thinking, .continue_final_message = conv->opt.continue_final_message};
        const json_t *want = json_object_get(prompts, fmts[f]);
        s = di_chat_encode(conv, &o, &pr);
        if (json_is_string(want)) {
            CHECK_MSG(s == DI_OK && !strcmp(pr.text, json_string_value(want)), "%s/%s: prompt differs:\n  got  %s\n  want %s",
                      name, fmts[f], s == DI_OK ? pr.text : di_last_error(), json_string_value(want));
        } else {
            CHECK_MSG(s != DI_OK, "%s/%s: jinja raised, we rendered", name, fmts[f]);
        }
    }
    di_prompt_free(&pr);

    /* model output -> parser -> renderers */
    di_chat_format of = (di_chat_format)di_chat_format_parse(json_string_value(json_object_get(fx, "output_format")));
    int think_ids = json_is_true(json_object_get(fx, "think_ids"));
    const json_t *meta = json_object_get(fx, "meta");
    di_outparse_config cfg;
    di_outparse_config_default(&cfg, of);
    if (think_ids) {
        cfg.id_think = 128798;
        cfg.id_think_end = 128799;
    }
    cfg.starts_in_reasoning = di_chat_format_starts_in_reasoning(of, conv->opt.thinking);
    const char *prefix = json_string_value(json_object_get(fx, "tool_id_prefix"));
    cfg.tool_id_prefix = prefix ? prefix : proto == DI_PROTO_MESSAGES ? "toolu_" : "call_";
    cfg.tool_id_seed = (uint64_t)json_integer_value(json_object_get(meta, "tool_id_seed"));
    di_outparse *p = di_outparse_create(&cfg);
    const json_t *out = json_object_get(fx, "model_output");
    for (size_t i = 0; i < json_array_size(out); i++) {
        const char *t = json_string_value(json_array_get(out, i));
        CHECK_OK(di_outparse_feed(p, control_id(t, think_ids), t, strlen(t)));
    }
    CHECK_OK(di_outparse_finish(p, DI_FINISH_LENGTH, NULL));
    size_t n_ev;
    const di_out_event *evs = di_outparse_events(p, &n_ev);
    const di_out_result *r = di_outparse_result(p);
    di_render_meta m = {.id = json_string_value(json_object_get(meta, "id")),
                        .model = json_string_value(json_object_get(meta, "model")),
                        .created = json_integer_value(json_object_get(meta, "created")),
                        .prompt_tokens = json_integer_value(json_object_get(meta, "prompt_tokens")),
                        .cached_tokens = json_integer_value(json_object_get(meta, "cached_tokens")),
                        .request = conv,
                        .item_seed = (uint64_t)json_integer_value(json_object_get(meta, "item_seed"))};
    ctx c = {r, m.item_seed, ""};
    json_t *body = proto == DI_PROTO_CHAT ? di_chat_render_response(&m, &r, 1)
                   : proto == DI_PROTO_RESPONSES ? di_responses_render_response(&m, r)
                                                 : di_messages_render_response(&m, r);
    char what[128];
    snprintf(what, sizeof what, "%s: response", name);
    check_json(what, json_object_get(fx, "expected_response"), body, &c);

    int include_usage = json_is_true(json_object_get(json_object_get(fx, "stream_options"), "include_usage"));
    di_stream *st = di_stream_create(proto, &m, include_usage, 0);
    json_t *events = json_array();
    CHECK_OK(di_stream_begin(st, events));
    CHECK_OK(di_stream_events(st, evs, n_ev, events));
    CHECK_OK(di_stream_end(st, r, events));
    const json_t *want_stream = json_object_get(fx, "expected_stream");
    if (want_stream) {
        snprintf(what, sizeof what, "%s: stream", name);
        check_json(what, want_stream, events, &c);
    }
    const json_t *types = json_object_get(fx, "expected_stream_types");
    if (types) {  /* Responses: event order, sequence numbers, and the final response == non-streaming body */
        CHECK_EQ_INT(json_array_size(types), json_array_size(events));
        for (size_t i = 0; i < json_array_size(types) && i < json_array_size(events); i++) {
            const json_t *e = json_array_get(events, i);
            CHECK_EQ_STR(json_string_value(json_object_get(e, "event")), json_string_value(json_array_get(types, i)));
            const json_t *d = json_object_get(e, "data");
            CHECK_EQ_STR(json_string_value(json_object_get(d, "type")), json_string_value(json_array_get(types, i)));
            CHECK_EQ_INT(json_integer_value(json_object_get(d, "sequence_number")), i);
        }
        const json_t *last = json_object_get(json_array_get(events, json_array_size(events) - 1), "data");
        snprintf(what, sizeof what, "%s: streamed final response", name);
        check_json(what, json_object_get(fx, "expected_response"), json_object_get(last, "response"), &c);
        /* deltas add up to the .done texts */
        const json_t *first = json_object_get(json_array_get(events, 0), "data");
        CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(first, "response"), "status")), "in_progress");
    }
    char *sse = NULL;
    size_t sse_len = 0;
    CHECK_OK(di_sse_format(events, &sse, &sse_len));
    CHECK(sse && sse_len > 4 && !strcmp(sse + sse_len - 2, "\n\n"));
    if (sse && proto == DI_PROTO_CHAT) CHECK(strstr(sse, "data: [DONE]\n\n") && !strstr(sse, "event:"));
    if (sse && proto != DI_PROTO_CHAT) CHECK(!strncmp(sse, "event: ", 7) && !strstr(sse, "[DONE]"));
    free(sse);
    json_decref(events);
    di_stream_free(st);
    json_decref(body);
    di_outparse_free(p);
done:
    di_conv_free(conv);
    di_conv_free(eqc);
    json_decref(fx);
}

static void test_fixtures(void) {
    for (size_t i = 0; i < sizeof FIXTURES / sizeof FIXTURES[0]; i++) {
        fprintf(stderr, "  fixture %s\n", FIXTURES[i]);
        run_fixture(FIXTURES[i]);
    }
}

/* ---- validation errors ---- */

typedef struct bad {
    di_proto proto;
    const char *body;
    const char *param;    /* OpenAI param, or NULL */
    const char *code;     /* OpenAI code, or NULL */
    const char *message;  /* substring of the message */
} bad;

static const bad BAD[] = {
    {DI_PROTO_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", "model", "missing_required_parameter",
     "Missing required parameter: 'model'."},
    {DI_PROTO_CHAT, "{\"model\": \"m\", \"messages\": []}", "messages", "empty_array", "empty array"},
    {DI_PROTO_CHAT, "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": 5}]}", "messages[0].content",
     "invalid_type", "Invalid type for 'messages[0].content': expected one of a string or array of objects, but got an "
     "integer instead."},
    {DI_PROTO_CHAT, "{\"model\": \"m\", \"messages\": [{\"role\": \"wizard\", \"content\": \"x\"}]}", "messages[0].role",
     "invalid_value", "'wizard'. Supported values are"},
    {DI_PROTO_CHAT, "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": "
     "\"a\"}, {\"type\": \"image_url\", \"image_url\": {\"url\": \"x\"}}]}]}", "messages[0].content[1].type",
     "unsupported_value", "text only"},
    {DI_PROTO_CHAT, "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"temperature\": 3}",
     "temperature", "decimal_above_max_value", "Expected a value <= 2, but got 3 instead."},
    {DI_PROTO_CHAT, "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"top_logprobs\": 3}",
     "top_logprobs", "invalid_value", "requires 'logprobs'"},
    {DI_PROTO_CHAT, "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"n\": 0}", "n",
     "integer_below_min_value", NULL},
    {DI_PROTO_CHAT, "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"stop\": 5}", "stop",
     "invalid_type", NULL},
    {DI_PROTO_CHAT, "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"stream_options\": "
     "{\"include_usage\": true}}", "stream_options", "invalid_value", "only allowed when 'stream'"},
    {DI_PROTO_CHAT, "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": "
     "\"function\", \"function\": {\"name\": \"f\"}}], \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": "
     "\"g\"}}}", "tool_choice.function.name", "invalid_value", "no tool named 'g'"},
    {DI_PROTO_CHAT, "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tool_choice\": "
     "\"required\"}", "tool_choice", "invalid_value", "only allowed when 'tools'"},
    {DI_PROTO_CHAT, "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": "
     "\"function\", \"function\": {\"name\": \"bad name\"}}]}", "tools[0].function.name", "invalid_value", "pattern"},
    {DI_PROTO_CHAT, "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"tool\", "
     "\"content\": \"r\"}]}", "messages[1].tool_call_id", "missing_required_parameter", NULL},
    {DI_PROTO_CHAT, "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", "
     "\"content\": null}]}", "messages[1].content", "invalid_value", "needs 'content' or 'tool_calls'"},
    {DI_PROTO_CHAT, "{\"model\": \"m\", \"messages\": [{\"role\": \"assistant\", \"content\": null, \"tool_calls\": "
     "[{\"id\": \"c\", \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1}}}]}]}",
     "messages[0].tool_calls[0].function.arguments", "invalid_type", "expected a string, but got an object"},
    {DI_PROTO_CHAT, "{\"model\": \"m\", \"messages\": [{\"role\": \"function\", \"content\": \"x\", \"name\": \"f\"}]}",
     "messages[0].role", "unsupported_value", NULL},
    {DI_PROTO_CHAT, "[1, 2]", "", "invalid_type", NULL},
    {DI_PROTO_CHAT, "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": "
     "{\"type\": \"json_schema\"}}", "response_format.json_schema", "missing_required_parameter", NULL},
    {DI_PROTO_RESPONSES, "{\"model\": \"m\"}", "input", "missing_required_parameter", NULL},
    {DI_PROTO_RESPONSES, "{\"model\": \"m\", \"input\": \"x\", \"previous_response_id\": \"resp_1\"}",
     "previous_response_id", "unsupported_parameter", "stores no responses"},
    {DI_PROTO_RESPONSES, "{\"model\": \"m\", \"input\": [{\"type\": \"web_search_call\", \"id\": \"ws\"}]}",
     "input[0].type", "unsupported_value", NULL},
    {DI_PROTO_RESPONSES, "{\"model\": \"m\", \"input\": [{\"role\": \"user\", \"content\": \"x\"}, {\"type\": "
     "\"function_call\", \"name\": \"f\", \"arguments\": \"{}\"}]}", "input[1].call_id", "missing_required_parameter", NULL},
    {DI_PROTO_RESPONSES, "{\"model\": \"m\", \"input\": \"x\", \"tools\": [{\"type\": \"web_search_preview\"}]}",
     "tools[0].type", "unsupported_value", NULL},
    {DI_PROTO_RESPONSES, "{\"model\": \"m\", \"input\": \"x\", \"text\": {\"format\": {\"type\": \"json_schema\", "
     "\"name\": \"n\"}}}", "text.format.schema", "missing_required_parameter", NULL},
    {DI_PROTO_RESPONSES, "{\"model\": \"m\", \"input\": [{\"role\": \"user\", \"content\": [{\"type\": \"input_image\", "
     "\"image_url\": \"x\"}]}]}", "input[0].content[0].type", "unsupported_value", NULL},
    {DI_PROTO_MESSAGES, "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", NULL, NULL,
     "max_tokens: Field required"},
    {DI_PROTO_MESSAGES, "{\"model\": \"m\", \"max_tokens\": 5, \"messages\": [{\"role\": \"system\", \"content\": "
     "\"x\"}]}", NULL, NULL, "messages.0.role: Input should be 'user' or 'assistant'"},
    {DI_PROTO_MESSAGES, "{\"model\": \"m\", \"max_tokens\": 5, \"messages\": [{\"role\": \"user\", \"content\": "
     "[{\"type\": \"image\", \"source\": {}}]}]}", NULL, NULL, "messages.0.content.0.type: 'image' blocks are not supported"},
    {DI_PROTO_MESSAGES, "{\"model\": \"m\", \"max_tokens\": 5000, \"thinking\": {\"type\": \"enabled\", "
     "\"budget_tokens\": 100}, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", NULL, NULL,
     "thinking.budget_tokens: Expected a value >= 1024"},
    {DI_PROTO_MESSAGES, "{\"model\": \"m\", \"max_tokens\": 5, \"temperature\": 1.5, \"messages\": [{\"role\": \"user\", "
     "\"content\": \"x\"}]}", NULL, NULL, "temperature: Expected a value <= 1"},
    {DI_PROTO_MESSAGES, "{\"model\": \"m\", \"max_tokens\": 5, \"tools\": [{\"name\": \"f\"}], \"messages\": [{\"role\": "
     "\"user\", \"content\": \"x\"}]}", NULL, NULL, "tools.0.input_schema: Field required"},
    {DI_PROTO_MESSAGES, "{\"model\": \"m\", \"max_tokens\": 5, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}, "
     "{\"role\": \"user\", \"content\": []}]}", NULL, NULL, "messages.1.content: all messages must have non-empty content"},
    {DI_PROTO_MESSAGES, "{\"model\": \"m\", \"max_tokens\": 5, \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": "
     "\"text\"}]}]}", NULL, NULL, "messages.0.content.0.text: Field required"},
};

static void test_errors(void) {
    for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
        const bad *b = &BAD[i];
        json_t *req = json_loads(b->body, JSON_DECODE_ANY, NULL);
        CHECK(req != NULL);
        di_conv *c = NULL;
        di_api_error e;
        di_status s = di_request_parse(b->proto, req, 0, &c, &e);
        CHECK_MSG(s == DI_ERR_INVALID_ARG && !c, "bad request %zu accepted", i);
        if (s == DI_OK) {
            di_conv_free(c);
            json_decref(req);
            continue;
        }
        CHECK_EQ_INT(e.http_status, 400);
        CHECK_EQ_STR(e.type, "invalid_request_error");
        if (b->param) CHECK_MSG(!strcmp(e.param, b->param), "case %zu: param '%s', want '%s'", i, e.param, b->param);
        if (b->code) CHECK_MSG(!strcmp(e.code, b->code), "case %zu: code '%s', want '%s'", i, e.code, b->code);
        if (b->message) CHECK_MSG(strstr(e.message, b->message) != NULL, "case %zu: message '%s'", i, e.message);
        CHECK(!strcmp(di_last_error(), e.message));
        json_t *body = di_api_error_json(&e, b->proto);
        if (b->proto == DI_PROTO_MESSAGES) {
            CHECK_EQ_STR(json_string_value(json_object_get(body, "type")), "error");
            const json_t *er = json_object_get(body, "error");
            CHECK_EQ_STR(json_string_value(json_object_get(er, "type")), "invalid_request_error");
            CHECK_EQ_STR(json_string_value(json_object_get(er, "message")), e.message);
            CHECK_EQ_INT(json_object_size(er), 2);
        } else {
            const json_t *er = json_object_get(body, "error");
            CHECK_EQ_INT(json_object_size(body), 1);
            CHECK_EQ_STR(json_string_value(json_object_get(er, "message")), e.message);
            CHECK_EQ_STR(json_string_value(json_object_get(er, "type")), "invalid_request_error");
            const json_t *param = json_object_get(er, "param");
            CHECK(e.param[0] ? json_is_string(param) && !strcmp(json_string_value(param), e.param) : json_is_null(param));
            CHECK(json_is_string(json_object_get(er, "code")) || json_is_null(json_object_get(er, "code")));
        }
        json_decref(body);
        json_decref(req);
    }
}

/* Sampling fields land in di_request_params. */
static void test_params(void) {
    json_t *req = json_loads("{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
                             "\"max_tokens\": 10, \"max_completion_tokens\": 20, \"temperature\": 0.5, \"top_p\": 0.9, "
                             "\"top_k\": 40, \"min_p\": 0.05, \"presence_penalty\": 0.1, \"frequency_penalty\": -0.2, "
                             "\"repetition_penalty\": 1.1, \"stop\": [\"END\", \"\\n\\n\"], \"seed\": -3, \"n\": 2, "
                             "\"logprobs\": true, \"top_logprobs\": 5, \"stream\": true, \"stream_options\": "
                             "{\"include_usage\": true}, \"ignore_eos\": true, \"user\": \"u1\", \"parallel_tool_calls\": "
                             "false, \"reasoning_effort\": \"low\"}",
                             0, NULL);
    di_conv *c = NULL;
    di_api_error e;
    CHECK_OK(di_chat_request_parse(req, 0, &c, &e));
    if (c) {
        const di_request_params *p = &c->params;
        CHECK_EQ_INT(p->max_tokens, 20);
        CHECK(p->temperature == 0.5 && p->top_p == 0.9 && p->min_p == 0.05);
        CHECK(p->presence_penalty == 0.1 && p->frequency_penalty == -0.2 && p->repetition_penalty == 1.1);
        CHECK_EQ_INT(p->top_k, 40);
        CHECK(p->n_stop == 2 && !strcmp(p->stop[0], "END") && !strcmp(p->stop[1], "\n\n"));
        CHECK(p->has_seed && p->seed == -3);
        CHECK(p->n == 2 && p->logprobs && p->top_logprobs == 5 && p->stream && p->stream_include_usage && p->ignore_eos);
        CHECK_EQ_STR(c->user, "u1");
        CHECK(!c->opt.parallel_tool_calls);
        CHECK_EQ_INT(c->opt.thinking, DI_THINKING_ON);
        CHECK(c->opt.add_generation_prompt && !c->opt.continue_final_message);
    }
    di_conv_free(c);
    json_decref(req);
    /* unset fields stay unset */
    req = json_loads("{\"model\": \"m\", \"max_tokens\": 8, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", 0,
                     NULL);
    CHECK_OK(di_messages_request_parse(req, 0, &c, &e));
    if (c) {
        CHECK(isnan(c->params.temperature) && isnan(c->params.top_p) && c->params.top_k == -1 && !c->params.has_seed);
        CHECK(c->params.max_tokens == 8 && c->params.n == 1 && c->params.n_stop == 0);
        CHECK_EQ_INT(c->opt.thinking, DI_THINKING_DEFAULT);
    }
    di_conv_free(c);
    json_decref(req);
}

/* di_json_dumps_py against Python's json.dumps(v, ensure_ascii=False) (expected strings printed by
 * Python 3.11). */
static void test_json_py(void) {
    struct { const char *in, *want; } cases[] = {
        {"[0.1, 1e-05, 0.0001, 1e16, 1e15, 123456789.123, -0.0, 3.0, 1e300, 5e-324, 2.5e-7, 0.3333333333333333, "
         "100.0, -1.5e22, 12345678901234567.0]",
         "[0.1, 1e-05, 0.0001, 1e+16, 1000000000000000.0, 123456789.123, -0.0, 3.0, 1e+300, 5e-324, 2.5e-07, "
         "0.3333333333333333, 100.0, -1.5e+22, 1.2345678901234568e+16]"},
        {"{\"s\": \"a\\\"b\\\\c\\nd\\te\\u0001\\u001f\\u007f \\u00e9 \\u6771 \\ud83d\\ude42\", \"n\": [1, -2, true, false, null], "
         "\"o\": {}, \"l\": []}",
         "{\"s\": \"a\\\"b\\\\c\\nd\\te\\u0001\\u001f\x7f \xc3\xa9 \xe6\x9d\xb1 \xf0\x9f\x99\x82\", \"n\": [1, -2, true, "
         "false, null], \"o\": {}, \"l\": []}"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_error_t je;
        json_t *v = json_loads(cases[i].in, 0, &je);
        CHECK_MSG(v != NULL, "case %zu: %s", i, je.text);
        char *s = v ? di_json_dumps_py(v) : NULL;
        CHECK_EQ_STR(s, cases[i].want);
        free(s);
        json_decref(v);
    }
}

TEST_MAIN(test_fixtures, test_errors, test_params, test_json_py)
