/* render_chat.c - OpenAI Chat Completions responses: the chat.completion object and the
 * chat.completion.chunk stream (delta.role, delta.reasoning_content, delta.content,
 * delta.tool_calls with the call's id/name first and its arguments as fragments, then a final
 * chunk with finish_reason, the usage chunk when stream_options.include_usage, and [DONE]).
 * reasoning_content is DeepSeek's field for the reasoning text. finish_reason extends OpenAI's
 * vocabulary with "abort" and "error" (malformed model output; the choice then carries
 * "error": {"message"}); a matched stop string also sets vLLM's "stop_reason". */
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "recipe/render_internal.h"

const char *di_chat_finish_reason(di_finish_reason r) {
    switch (r) {
    case DI_FINISH_NONE: return NULL;
    case DI_FINISH_STOP:
    case DI_FINISH_STOP_SEQUENCE: return "stop";
    case DI_FINISH_LENGTH: return "length";
    case DI_FINISH_TOOL_CALLS: return "tool_calls";
    case DI_FINISH_ABORT: return "abort";
    case DI_FINISH_ERROR: return "error";
    }
    return "stop";
}

static json_t *usage(const di_render_meta *m, const di_out_result *const *rs, size_t n) {
    int64_t out = 0, reasoning = 0;
    for (size_t i = 0; i < n; i++) {
        out += (int64_t)rs[i]->n_tokens;
        reasoning += (int64_t)rs[i]->n_reasoning_tokens;
    }
    return json_pack("{s:I, s:I, s:I, s:{s:I}, s:{s:I}}", "prompt_tokens", (json_int_t)m->prompt_tokens,
                     "completion_tokens", (json_int_t)out, "total_tokens", (json_int_t)(m->prompt_tokens + out),
                     "prompt_tokens_details", "cached_tokens", (json_int_t)m->cached_tokens,
                     "completion_tokens_details", "reasoning_tokens", (json_int_t)reasoning);
}

static json_t *tool_call_json(const di_out_tool_call *c) {
    return json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", c->id, "type", "function", "function", "name", c->name,
                     "arguments", c->arguments ? c->arguments : "");
}

static json_t *choice(const di_out_result *r, size_t index) {
    json_t *msg = json_pack("{s:s}", "role", "assistant");
    int empty = r->content_len == 0;
    json_object_set_new(msg, "content", empty && r->n_calls ? json_null() : json_stringn(r->content, r->content_len));
    if (r->reasoning_len) json_object_set_new(msg, "reasoning_content", json_stringn(r->reasoning, r->reasoning_len));
    if (r->n_calls) {
        json_t *calls = json_array();
        for (size_t i = 0; i < r->n_calls; i++) json_array_append_new(calls, tool_call_json(&r->calls[i]));
        json_object_set_new(msg, "tool_calls", calls);
    }
    json_t *ch = json_pack("{s:I, s:o, s:n, s:s}", "index", (json_int_t)index, "message", msg, "logprobs",
                           "finish_reason", di_chat_finish_reason(r->finish) ? di_chat_finish_reason(r->finish) : "stop");
    if (r->finish == DI_FINISH_STOP_SEQUENCE && r->detail) json_object_set_new(ch, "stop_reason", json_string(r->detail));
    if (r->finish == DI_FINISH_ERROR)
        json_object_set_new(ch, "error", json_pack("{s:s}", "message", r->detail ? r->detail : "malformed output"));
    return ch;
}

json_t *di_chat_render_response(const di_render_meta *m, const di_out_result *const *results, size_t n) {
    json_t *choices = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(choices, choice(results[i], i));
    return json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", m->id, "object", "chat.completion", "created",
                     (json_int_t)m->created, "model", m->model, "choices", choices, "usage", usage(m, results, n));
}

/* ---- streaming ---- */

static json_t *chunk(const di_stream *s, json_t *delta, const char *finish) {
    json_t *c = json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:o, s:n, s:o}]}", "id", s->m.id, "object",
                          "chat.completion.chunk", "created", (json_int_t)s->m.created, "model", s->m.model, "choices",
                          "index", s->choice, "delta", delta, "logprobs", "finish_reason",
                          finish ? json_string(finish) : json_null());
    if (c && s->include_usage) json_object_set_new(c, "usage", json_null());
    return c;
}

static di_status push(json_t *out, json_t *data) {
    if (di_stream_push(out, NULL, data)) return di_error(DI_ERR_NOMEM, "out of memory rendering a stream chunk");
    return DI_OK;
}

di_status di_chat_stream_begin(di_stream *s, json_t *out) {
    return push(out, chunk(s, json_pack("{s:s, s:s}", "role", "assistant", "content", ""), NULL));
}

di_status di_chat_stream_events(di_stream *s, const di_out_event *ev, size_t n, json_t *out) {
    for (size_t i = 0; i < n; i++) {
        const di_out_event *e = &ev[i];
        json_t *delta = NULL;
        switch (e->kind) {
        case DI_OUT_REASONING: delta = json_pack("{s:s%}", "reasoning_content", e->text, e->len); break;
        case DI_OUT_CONTENT: delta = json_pack("{s:s%}", "content", e->text, e->len); break;
        case DI_OUT_TOOL_START:
            delta = json_pack("{s:[{s:i, s:s, s:s, s:{s:s, s:s}}]}", "tool_calls", "index", e->tool_index, "id",
                              e->tool_id, "type", "function", "function", "name", e->tool_name, "arguments", "");
            break;
        case DI_OUT_TOOL_ARGS:
            delta = json_pack("{s:[{s:i, s:{s:s%}}]}", "tool_calls", "index", e->tool_index, "function", "arguments",
                              e->text, e->len);
            break;
        case DI_OUT_TOOL_END:
        case DI_OUT_FINISH: continue;
        }
        DI_TRY(push(out, chunk(s, delta, NULL)));
    }
    return DI_OK;
}

di_status di_chat_stream_end(di_stream *s, const di_out_result *r, json_t *out) {
    const char *fin = di_chat_finish_reason(r->finish);
    json_t *c = chunk(s, json_object(), fin ? fin : "stop");
    if (c && r->finish == DI_FINISH_STOP_SEQUENCE && r->detail)
        json_object_set_new(json_array_get(json_object_get(c, "choices"), 0), "stop_reason", json_string(r->detail));
    if (c && r->finish == DI_FINISH_ERROR)
        json_object_set_new(json_array_get(json_object_get(c, "choices"), 0), "error",
                            json_pack("{s:s}", "message", r->detail ? r->detail : "malformed output"));
    DI_TRY(push(out, c));
    if (s->include_usage) {
        const di_out_result *rs[1] = {r};
        DI_TRY(push(out, json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", s->m.id, "object", "chat.completion.chunk",
                                   "created", (json_int_t)s->m.created, "model", s->m.model, "choices", "usage",
                                   usage(&s->m, rs, 1))));
    }
    return push(out, json_string("[DONE]"));
}
