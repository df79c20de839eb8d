/* render_stream.c - the streaming renderer object (dispatch to the per-protocol renderers) and
 * the Server-Sent Events serialisation of rendered events. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "recipe/render_internal.h"

di_stream *di_stream_create(di_proto proto, const di_render_meta *m, int include_usage, int choice) {
    di_stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->proto = proto;
    s->m = *m;
    s->include_usage = include_usage;
    s->choice = choice;
    s->open_tool = -1;
    s->item_index = -1;
    s->items = json_array();
    if (!s->items) {
        free(s);
        return NULL;
    }
    return s;
}

void di_stream_free(di_stream *s) {
    if (!s) return;
    json_decref(s->items);
    free(s->text.s);
    free(s->tool_name);
    free(s);
}

void di_stream_item_open(di_stream *s, int kind) {
    s->open = kind;
    s->item_index = s->n_items++;
    s->text.len = 0;
    sb_put(&s->text, "", 0);
}

void di_stream_item_close(di_stream *s) {
    s->open = OPEN_NONE;
    s->text.len = 0;
}

int di_stream_push(json_t *out, const char *event, json_t *data) {
    if (!data) return -1;
    json_t *e = json_pack("{s:o, s:o}", "event", event ? json_string(event) : json_null(), "data", data);
    if (!e) return -1;
    return json_array_append_new(out, e);
}

di_status di_stream_begin(di_stream *s, json_t *out) {
    switch (s->proto) {
    case DI_PROTO_CHAT: return di_chat_stream_begin(s, out);
    case DI_PROTO_RESPONSES: return di_responses_stream_begin(s, out);
    case DI_PROTO_MESSAGES: return di_messages_stream_begin(s, out);
    }
    return di_error(DI_ERR_INVALID_ARG, "unknown protocol");
}

di_status di_stream_events(di_stream *s, const di_out_event *ev, size_t n, json_t *out) {
    switch (s->proto) {
    case DI_PROTO_CHAT: return di_chat_stream_events(s, ev, n, out);
    case DI_PROTO_RESPONSES: return di_responses_stream_events(s, ev, n, out);
    case DI_PROTO_MESSAGES: return di_messages_stream_events(s, ev, n, out);
    }
    return di_error(DI_ERR_INVALID_ARG, "unknown protocol");
}

di_status di_stream_end(di_stream *s, const di_out_result *r, json_t *out) {
    switch (s->proto) {
    case DI_PROTO_CHAT: return di_chat_stream_end(s, r, out);
    case DI_PROTO_RESPONSES: return di_responses_stream_end(s, r, out);
    case DI_PROTO_MESSAGES: return di_messages_stream_end(s, r, out);
    }
    return di_error(DI_ERR_INVALID_ARG, "unknown protocol");
}

di_status di_sse_format(const json_t *events, char **buf, size_t *len) {
    di_strbuf b = {*buf, *buf ? strlen(*buf) : 0, *buf ? strlen(*buf) + 1 : 0, 0};
    for (size_t i = 0; i < json_array_size(events); i++) {
        const json_t *e = json_array_get(events, i);
        const json_t *name = json_object_get(e, "event"), *data = json_object_get(e, "data");
        if (json_is_string(name)) {
            sb_puts(&b, "event: ");
            sb_puts(&b, json_string_value(name));
            sb_puts(&b, "\n");
        }
        sb_puts(&b, "data: ");
        if (json_is_string(data)) {
            sb_puts(&b, json_string_value(data));
        } else {
            char *d = json_dumps(data, JSON_COMPACT);
            if (!d) b.oom = 1;
            else sb_puts(&b, d);
            free(d);
        }
        sb_puts(&b, "\n\n");
    }
    sb_put(&b, "", 0);
    *buf = b.s;
    if (len) *len = b.len;
    if (b.oom) return di_error(DI_ERR_NOMEM, "out of memory formatting server-sent events");
    return DI_OK;
}

json_t *di_render_str_or_null(const char *s) { return s ? json_string(s) : json_null(); }

double di_render_or(double v, double dflt) { return isnan(v) ? dflt : v; }
