/* render_responses.c - OpenAI Responses API output: the response object (output items
 * reasoning / message / function_call, status, usage, echoed request settings) and its
 * semantic stream: response.created, response.in_progress, then per item
 * response.output_item.added, response.content_part.added, response.reasoning_text.delta /
 * response.output_text.delta / response.function_call_arguments.delta, the matching .done
 * events, response.content_part.done, response.output_item.done, and finally
 * response.completed / response.incomplete (token limit) / response.failed (malformed output)
 * carrying the full response. Every event has a sequence_number counting from 0.
 * Item ids are di_recipe_make_id("rs_" / "msg_" / "fc_", meta.item_seed, output_index). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "recipe/render_internal.h"

static const char *status_of(di_finish_reason r) {
    switch (r) {
    case DI_FINISH_LENGTH: return "incomplete";
    case DI_FINISH_ERROR: return "failed";
    case DI_FINISH_ABORT: return "cancelled";
    case DI_FINISH_NONE: return "in_progress";
    default: return "completed";
    }
}

static void item_id(char *out, size_t n, const char *prefix, const di_render_meta *m, int index) {
    di_recipe_make_id(out, n, prefix, m->item_seed, (uint64_t)index);
}

static json_t *reasoning_item(const char *id, const char *text, size_t len, const char *status) {
    json_t *content = json_array();
    if (text) json_array_append_new(content, json_pack("{s:s, s:s%}", "type", "reasoning_text", "text", text, len));
    json_t *it = json_pack("{s:s, s:s, s:[], s:o}", "id", id, "type", "reasoning", "summary", "content", content);
    if (status) json_object_set_new(it, "status", json_string(status));
    return it;
}

static json_t *text_part(const char *text, size_t len) {
    return json_pack("{s:s, s:s%, s:[]}", "type", "output_text", "text", text, len, "annotations");
}

static json_t *message_item(const char *id, const char *status, json_t *content) {
    return json_pack("{s:s, s:s, s:s, s:s, s:o}", "id", id, "type", "message", "status", status, "role", "assistant",
                     "content", content);
}

static json_t *call_item(const char *id, const char *call_id, const char *name, const char *args,
                         const char *status) {
    return json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "id", id, "type", "function_call", "status", status, "call_id",
                     call_id, "name", name, "arguments", args);
}

/* The response object around `output` (stolen). */
static json_t *response(const di_render_meta *m, const di_out_result *r, json_t *output, const char *status) {
    const di_conv *q = m->request;
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:n, s:n}", "id", m->id, "object", "response", "created_at",
                          (json_int_t)m->created, "status", status, "error", "incomplete_details");
    if (r && r->finish == DI_FINISH_ERROR)
        json_object_set_new(o, "error", json_pack("{s:s, s:s}", "code", "server_error", "message",
                                                  r->detail ? r->detail : "malformed model output"));
    if (r && r->finish == DI_FINISH_LENGTH)
        json_object_set_new(o, "incomplete_details", json_pack("{s:s}", "reason", "max_output_tokens"));
    const char *instructions = NULL;
    if (q && q->n_msgs && q->msgs[0].role == DI_ROLE_SYSTEM) instructions = q->msgs[0].content;
    json_object_set_new(o, "instructions", di_render_str_or_null(instructions));
    json_object_set_new(o, "max_output_tokens",
                        q && q->params.max_tokens > 0 ? json_integer(q->params.max_tokens) : json_null());
    json_object_set_new(o, "model", json_string(m->model));
    json_object_set_new(o, "output", output);
    json_object_set_new(o, "parallel_tool_calls", json_boolean(q ? q->opt.parallel_tool_calls : 1));
    json_object_set_new(o, "previous_response_id", json_null());
    json_object_set_new(o, "reasoning", json_pack("{s:o, s:n}", "effort",
                                                  di_render_str_or_null(q ? q->opt.reasoning_effort : NULL), "summary"));
    json_object_set_new(o, "store", json_false());
    json_object_set_new(o, "temperature", json_real(di_render_or(q ? q->params.temperature : NAN, 1.0)));
    const char *fmt = "text";
    if (q && q->opt.response_format == DI_RESPONSE_FORMAT_JSON_OBJECT) fmt = "json_object";
    if (q && q->opt.response_format == DI_RESPONSE_FORMAT_JSON_SCHEMA) fmt = "json_schema";
    json_t *format = json_pack("{s:s}", "type", fmt);
    if (q && q->opt.response_format == DI_RESPONSE_FORMAT_JSON_SCHEMA) {
        json_object_set_new(format, "name", di_render_str_or_null(q->opt.response_format_name));
        if (q->opt.response_schema) json_object_set(format, "schema", q->opt.response_schema);
        json_object_set_new(format, "strict", json_boolean(q->opt.response_format_strict));
    }
    json_object_set_new(o, "text", json_pack("{s:o}", "format", format));
    json_t *tc;
    switch (q ? q->opt.tool_choice : DI_TOOL_CHOICE_AUTO) {
    case DI_TOOL_CHOICE_NONE: tc = json_string("none"); break;
    case DI_TOOL_CHOICE_REQUIRED: tc = json_string("required"); break;
    case DI_TOOL_CHOICE_NAMED: tc = json_pack("{s:s, s:s}", "type", "function", "name", q->opt.tool_choice_name); break;
    default: tc = json_string("auto");
    }
    json_object_set_new(o, "tool_choice", tc);
    json_t *tools = json_array();
    for (size_t i = 0; q && i < q->n_tools; i++) {
        const di_tool *t = &q->tools[i];
        json_t *jt = json_pack("{s:s, s:s, s:o, s:o, s:b}", "type", "function", "name", t->name, "description",
                               di_render_str_or_null(t->description), "parameters",
                               t->parameters ? json_incref(t->parameters) : json_null(), "strict", t->strict);
        json_array_append_new(tools, jt);
    }
    json_object_set_new(o, "tools", tools);
    json_object_set_new(o, "top_p", json_real(di_render_or(q ? q->params.top_p : NAN, 1.0)));
    json_object_set_new(o, "truncation", json_string("disabled"));
    if (r) {
        json_int_t out = (json_int_t)r->n_tokens;
        json_object_set_new(o, "usage", json_pack("{s:I, s:{s:I}, s:I, s:{s:I}, s:I}", "input_tokens",
                                                  (json_int_t)m->prompt_tokens, "input_tokens_details",
                                                  "cached_tokens", (json_int_t)m->cached_tokens, "output_tokens", out,
                                                  "output_tokens_details", "reasoning_tokens",
                                                  (json_int_t)r->n_reasoning_tokens, "total_tokens",
                                                  (json_int_t)m->prompt_tokens + out));
    } else {
        json_object_set_new(o, "usage", json_null());
    }
    json_object_set_new(o, "user", di_render_str_or_null(q ? q->user : NULL));
    json_object_set_new(o, "metadata", json_object());
    return o;
}

json_t *di_responses_render_response(const di_render_meta *m, const di_out_result *r) {
    json_t *output = json_array();
    char id[64];
    int k = 0;
    const char *item_status = r->finish == DI_FINISH_LENGTH ? "incomplete" : "completed";
    if (r->reasoning_len) {
        item_id(id, sizeof id, "rs_", m, k++);
        json_array_append_new(output, reasoning_item(id, r->reasoning, r->reasoning_len, NULL));
    }
    if (r->content_len) {
        item_id(id, sizeof id, "msg_", m, k++);
        json_array_append_new(output, message_item(id, item_status, json_pack("[o]", text_part(r->content,
                                                                                            r->content_len))));
    }
    for (size_t i = 0; i < r->n_calls; i++) {
        item_id(id, sizeof id, "fc_", m, k++);
        const di_out_tool_call *c = &r->calls[i];
        json_array_append_new(output, call_item(id, c->id, c->name, c->arguments ? c->arguments : "",
                                                c->complete ? "completed" : "incomplete"));
    }
    return response(m, r, output, status_of(r->finish));
}

/* ---- streaming ---- */

static di_status ev(di_stream *s, json_t *out, const char *type, json_t *data) {
    if (!data) return di_error(DI_ERR_NOMEM, "out of memory rendering a stream event");
    json_object_set_new(data, "type", json_string(type));
    json_object_set_new(data, "sequence_number", json_integer(s->seq++));
    /* "type" first, as the API writes it */
    json_t *ordered = json_pack("{s:s}", "type", type);
    const char *k;
    json_t *v;
    json_object_foreach(data, k, v) if (strcmp(k, "type")) json_object_set(ordered, k, v);
    json_decref(data);
    if (di_stream_push(out, type, ordered)) return di_error(DI_ERR_NOMEM, "out of memory rendering a stream event");
    return DI_OK;
}

di_status di_responses_stream_begin(di_stream *s, json_t *out) {
    DI_TRY(ev(s, out, "response.created", json_pack("{s:o}", "response", response(&s->m, NULL, json_array(),
                                                                                   "in_progress"))));
    return ev(s, out, "response.in_progress",
              json_pack("{s:o}", "response", response(&s->m, NULL, json_array(), "in_progress")));
}

/* Closes the open item, emitting its .done events and keeping it for the final response. */
static di_status close_item(di_stream *s, json_t *out, int incomplete) {
    json_t *item = NULL;
    const char *st = incomplete ? "incomplete" : "completed";
    const char *text = s->text.s ? s->text.s : "";
    int idx = s->item_index;
    if (s->open == OPEN_REASONING) {
        DI_TRY(ev(s, out, "response.reasoning_text.done",
                  json_pack("{s:s, s:i, s:i, s:s%}", "item_id", s->item_id, "output_index", idx, "content_index", 0,
                            "text", text, s->text.len)));
        DI_TRY(ev(s, out, "response.content_part.done",
                  json_pack("{s:s, s:i, s:i, s:{s:s, s:s%}}", "item_id", s->item_id, "output_index", idx,
                            "content_index", 0, "part", "type", "reasoning_text", "text", text, s->text.len)));
        item = reasoning_item(s->item_id, text, s->text.len, NULL);
    } else if (s->open == OPEN_TEXT) {
        DI_TRY(ev(s, out, "response.output_text.done",
                  json_pack("{s:s, s:i, s:i, s:s%, s:[]}", "item_id", s->item_id, "output_index", idx, "content_index",
                            0, "text", text, s->text.len, "logprobs")));
        DI_TRY(ev(s, out, "response.content_part.done",
                  json_pack("{s:s, s:i, s:i, s:o}", "item_id", s->item_id, "output_index", idx, "content_index", 0,
                            "part", text_part(text, s->text.len))));
        item = message_item(s->item_id, st, json_pack("[o]", text_part(text, s->text.len)));
    } else if (s->open == OPEN_TOOL) {
        const char *name = s->tool_name ? s->tool_name : "";
        DI_TRY(ev(s, out, "response.function_call_arguments.done",
                  json_pack("{s:s, s:i, s:s, s:s%}", "item_id", s->item_id, "output_index", idx, "name", name,
                            "arguments", text, s->text.len)));
        item = call_item(s->item_id, s->tool_call_id, name, text, s->tool_complete ? "completed" : "incomplete");
    } else {
        return DI_OK;
    }
    if (!item) return di_error(DI_ERR_NOMEM, "out of memory rendering a stream event");
    json_array_append(s->items, item);
    DI_TRY(ev(s, out, "response.output_item.done", json_pack("{s:i, s:o}", "output_index", idx, "item", item)));
    di_stream_item_close(s);
    return DI_OK;
}

static di_status open_item(di_stream *s, json_t *out, int kind, const di_out_event *e) {
    di_stream_item_open(s, kind);
    json_t *item;
    if (kind == OPEN_REASONING) {
        item_id(s->item_id, sizeof s->item_id, "rs_", &s->m, s->item_index);
        item = reasoning_item(s->item_id, NULL, 0, NULL);
    } else if (kind == OPEN_TEXT) {
        item_id(s->item_id, sizeof s->item_id, "msg_", &s->m, s->item_index);
        item = message_item(s->item_id, "in_progress", json_array());
    } else {
        item_id(s->item_id, sizeof s->item_id, "fc_", &s->m, s->item_index);
        s->open_tool = e->tool_index;
        s->tool_complete = 0;
        free(s->tool_name);
        if (!(s->tool_name = strdup(e->tool_name ? e->tool_name : "")))
            return di_error(DI_ERR_NOMEM, "out of memory rendering a stream event");
        snprintf(s->tool_call_id, sizeof s->tool_call_id, "%s", e->tool_id ? e->tool_id : "");
        item = call_item(s->item_id, s->tool_call_id, s->tool_name, "", "in_progress");
    }
    DI_TRY(ev(s, out, "response.output_item.added", json_pack("{s:i, s:o}", "output_index", s->item_index, "item", item)));
    if (kind == OPEN_REASONING)
        return ev(s, out, "response.content_part.added",
                  json_pack("{s:s, s:i, s:i, s:{s:s, s:s}}", "item_id", s->item_id, "output_index", s->item_index,
                            "content_index", 0, "part", "type", "reasoning_text", "text", ""));
    if (kind == OPEN_TEXT)
        return ev(s, out, "response.content_part.added",
                  json_pack("{s:s, s:i, s:i, s:o}", "item_id", s->item_id, "output_index", s->item_index,
                            "content_index", 0, "part", text_part("", 0)));
    return DI_OK;
}

di_status di_responses_stream_events(di_stream *s, const di_out_event *evs, size_t n, json_t *out) {
    for (size_t i = 0; i < n; i++) {
        const di_out_event *e = &evs[i];
        switch (e->kind) {
        case DI_OUT_REASONING:
        case DI_OUT_CONTENT: {
            int kind = e->kind == DI_OUT_REASONING ? OPEN_REASONING : OPEN_TEXT;
            if (s->open != kind) {
                DI_TRY(close_item(s, out, 0));
                DI_TRY(open_item(s, out, kind, e));
            }
            sb_put(&s->text, e->text, e->len);
            const char *type = kind == OPEN_REASONING ? "response.reasoning_text.delta" : "response.output_text.delta";
            json_t *d = json_pack("{s:s, s:i, s:i, s:s%}", "item_id", s->item_id, "output_index", s->item_index,
                                  "content_index", 0, "delta", e->text, e->len);
            if (d && kind == OPEN_TEXT) json_object_set_new(d, "logprobs", json_array());
            DI_TRY(ev(s, out, type, d));
            break;
        }
        case DI_OUT_TOOL_START:
            DI_TRY(close_item(s, out, 0));
            DI_TRY(open_item(s, out, OPEN_TOOL, e));
            break;
        case DI_OUT_TOOL_ARGS:
            if (s->open != OPEN_TOOL) break;
            sb_put(&s->text, e->text, e->len);
            DI_TRY(ev(s, out, "response.function_call_arguments.delta",
                      json_pack("{s:s, s:i, s:s%}", "item_id", s->item_id, "output_index", s->item_index, "delta",
                                e->text, e->len)));
            break;
        case DI_OUT_TOOL_END:
            if (s->open == OPEN_TOOL && s->open_tool == e->tool_index) {
                s->tool_complete = 1;
                DI_TRY(close_item(s, out, 0));
            }
            break;
        case DI_OUT_FINISH:
            break;  /* di_stream_end closes what is open */
        }
        if (s->text.oom) return di_error(DI_ERR_NOMEM, "out of memory rendering a stream event");
    }
    return DI_OK;
}

di_status di_responses_stream_end(di_stream *s, const di_out_result *r, json_t *out) {
    DI_TRY(close_item(s, out, r->finish == DI_FINISH_LENGTH));
    const char *status = status_of(r->finish);
    const char *type = !strcmp(status, "incomplete") ? "response.incomplete"
                       : !strcmp(status, "failed")   ? "response.failed"
                                                     : "response.completed";
    json_t *resp = response(&s->m, r, json_incref(s->items), status);
    return ev(s, out, type, json_pack("{s:o}", "response", resp));
}
