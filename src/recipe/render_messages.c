/* render_messages.c - Anthropic Messages output: the message object (content blocks thinking /
 * text / tool_use, stop_reason, usage) and its event stream: message_start, ping, then per
 * block content_block_start, content_block_delta (thinking_delta + a closing signature_delta,
 * text_delta, input_json_delta), content_block_stop, and finally message_delta (stop_reason,
 * stop_sequence, usage.output_tokens) and message_stop.
 * Malformed model output has no Anthropic stop_reason: the non-streaming body is then an
 * api_error object and the stream ends with an `error` event instead of message_delta.
 * Thinking signatures are "di1-" + 16 hex digits of a hash of the thinking text: a stable
 * marker, not a cryptographic signature (we accept any signature on input). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/hash.h"
#include "core/status.h"
#include "recipe/render_internal.h"

const char *di_messages_stop_reason(di_finish_reason r) {
    switch (r) {
    case DI_FINISH_LENGTH: return "max_tokens";
    case DI_FINISH_TOOL_CALLS: return "tool_use";
    case DI_FINISH_STOP_SEQUENCE: return "stop_sequence";
    case DI_FINISH_NONE: return NULL;
    default: return "end_turn";
    }
}

static void signature(char out[24], const char *text, size_t len) {
    snprintf(out, 24, "di1-%016llx", (unsigned long long)di_hash64(text, len, 0x7369676e61747572ull));
}

static json_t *usage(const di_render_meta *m, int64_t output_tokens) {
    return json_pack("{s:I, s:I, s:I, s:I}", "input_tokens", (json_int_t)(m->prompt_tokens - m->cached_tokens),
                     "cache_creation_input_tokens", (json_int_t)0, "cache_read_input_tokens",
                     (json_int_t)m->cached_tokens, "output_tokens", (json_int_t)output_tokens);
}

/* A tool call's input object (arguments that are not a JSON object become {}). */
static json_t *tool_input(const char *args) {
    json_t *v = args ? json_loads(args, JSON_REJECT_DUPLICATES, NULL) : NULL;
    if (v && json_is_object(v)) return v;
    json_decref(v);
    return json_object();
}

static json_t *error_body(const char *detail) {
    return json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", "api_error", "message",
                     detail ? detail : "malformed model output");
}

json_t *di_messages_render_response(const di_render_meta *m, const di_out_result *r) {
    if (r->finish == DI_FINISH_ERROR) return error_body(r->detail);
    json_t *content = json_array();
    char sig[24];
    if (r->reasoning_len) {
        signature(sig, r->reasoning, r->reasoning_len);
        json_array_append_new(content, json_pack("{s:s, s:s%, s:s}", "type", "thinking", "thinking", r->reasoning,
                                                 r->reasoning_len, "signature", sig));
    }
    if (r->content_len)
        json_array_append_new(content, json_pack("{s:s, s:s%}", "type", "text", "text", r->content, r->content_len));
    for (size_t i = 0; i < r->n_calls; i++)
        json_array_append_new(content, json_pack("{s:s, s:s, s:s, s:o}", "type", "tool_use", "id", r->calls[i].id,
                                                 "name", r->calls[i].name, "input", tool_input(r->calls[i].arguments)));
    json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:o}", "id", m->id, "type", "message", "role", "assistant", "model",
                          m->model, "content", content);
    const char *sr = di_messages_stop_reason(r->finish);
    json_object_set_new(o, "stop_reason", di_render_str_or_null(sr));
    json_object_set_new(o, "stop_sequence",
                        r->finish == DI_FINISH_STOP_SEQUENCE ? di_render_str_or_null(r->detail) : json_null());
    json_object_set_new(o, "usage", usage(m, (int64_t)r->n_tokens));
    return o;
}

/* ---- streaming ---- */

static di_status ev(json_t *out, const char *type, json_t *data) {
    if (!data) return di_error(DI_ERR_NOMEM, "out of memory rendering a stream event");
    json_t *o = json_pack("{s:s}", "type", type);
    const char *k;
    json_t *v;
    json_object_foreach(data, k, v) json_object_set(o, k, v);
    json_decref(data);
    if (di_stream_push(out, type, o)) return di_error(DI_ERR_NOMEM, "out of memory rendering a stream event");
    return DI_OK;
}

di_status di_messages_stream_begin(di_stream *s, json_t *out) {
    json_t *msg = json_pack("{s:s, s:s, s:s, s:[], s:s, s:n, s:n, s:o}", "id", s->m.id, "type", "message", "role",
                            "assistant", "content", "model", s->m.model, "stop_reason", "stop_sequence", "usage",
                            usage(&s->m, 0));
    DI_TRY(ev(out, "message_start", json_pack("{s:o}", "message", msg)));
    return ev(out, "ping", json_object());
}

static di_status close_block(di_stream *s, json_t *out) {
    if (s->open == OPEN_NONE) return DI_OK;
    if (s->open == OPEN_REASONING) {
        char sig[24];
        signature(sig, s->text.s ? s->text.s : "", s->text.len);
        DI_TRY(ev(out, "content_block_delta", json_pack("{s:i, s:{s:s, s:s}}", "index", s->item_index, "delta", "type",
                                                        "signature_delta", "signature", sig)));
    }
    DI_TRY(ev(out, "content_block_stop", json_pack("{s:i}", "index", s->item_index)));
    di_stream_item_close(s);
    return DI_OK;
}

static di_status open_block(di_stream *s, json_t *out, int kind, const di_out_event *e) {
    di_stream_item_open(s, kind);
    json_t *block;
    if (kind == OPEN_REASONING) block = json_pack("{s:s, s:s}", "type", "thinking", "thinking", "");
    else if (kind == OPEN_TEXT) block = json_pack("{s:s, s:s}", "type", "text", "text", "");
    else {
        s->open_tool = e->tool_index;
        block = json_pack("{s:s, s:s, s:s, s:{}}", "type", "tool_use", "id", e->tool_id, "name", e->tool_name, "input");
    }
    return ev(out, "content_block_start", json_pack("{s:i, s:o}", "index", s->item_index, "content_block", block));
}

di_status di_messages_stream_events(di_stream *s, const di_out_event *evs, size_t n, json_t *out) {
    for (size_t i = 0; i < n; i++) {
        const di_out_event *e = &evs[i];
        json_t *d = NULL;
        switch (e->kind) {
        case DI_OUT_REASONING:
        case DI_OUT_CONTENT: {
            int kind = e->kind == DI_OUT_REASONING ? OPEN_REASONING : OPEN_TEXT;
            if (s->open != kind) {
                DI_TRY(close_block(s, out));
                DI_TRY(open_block(s, out, kind, e));
            }
            sb_put(&s->text, e->text, e->len);
            if (kind == OPEN_REASONING) d = json_pack("{s:s, s:s%}", "type", "thinking_delta", "thinking", e->text, e->len);
            else d = json_pack("{s:s, s:s%}", "type", "text_delta", "text", e->text, e->len);
            DI_TRY(ev(out, "content_block_delta", json_pack("{s:i, s:o}", "index", s->item_index, "delta", d)));
            break;
        }
        case DI_OUT_TOOL_START:
            DI_TRY(close_block(s, out));
            DI_TRY(open_block(s, out, OPEN_TOOL, e));
            break;
        case DI_OUT_TOOL_ARGS:
            if (s->open != OPEN_TOOL) break;
            d = json_pack("{s:s, s:s%}", "type", "input_json_delta", "partial_json", e->text, e->len);
            DI_TRY(ev(out, "content_block_delta", json_pack("{s:i, s:o}", "index", s->item_index, "delta", d)));
            break;
        case DI_OUT_TOOL_END:
            if (s->open == OPEN_TOOL && s->open_tool == e->tool_index) DI_TRY(close_block(s, out));
            break;
        case DI_OUT_FINISH:
            break;
        }
        if (s->text.oom) return di_error(DI_ERR_NOMEM, "out of memory rendering a stream event");
    }
    return DI_OK;
}

di_status di_messages_stream_end(di_stream *s, const di_out_result *r, json_t *out) {
    DI_TRY(close_block(s, out));
    if (r->finish == DI_FINISH_ERROR) {
        json_t *body = error_body(r->detail);
        json_t *err = json_incref(json_object_get(body, "error"));
        json_decref(body);
        return ev(out, "error", json_pack("{s:o}", "error", err));
    }
    json_t *delta = json_pack("{s:o, s:o}", "stop_reason", di_render_str_or_null(di_messages_stop_reason(r->finish)),
                              "stop_sequence",
                              r->finish == DI_FINISH_STOP_SEQUENCE ? di_render_str_or_null(r->detail) : json_null());
    DI_TRY(ev(out, "message_delta", json_pack("{s:o, s:{s:I}}", "delta", delta, "usage", "output_tokens",
                                              (json_int_t)r->n_tokens)));
    return ev(out, "message_stop", json_object());
}
