/* render_internal.h - state shared by the streaming renderers (render_chat.c,
 * render_responses.c, render_messages.c) and their dispatcher (render_stream.c).
 * Not part of the recipe API. Invariant: at most one output item / content block is open at a
 * time (`open`), and `text` holds the full text streamed into it so far. */
#ifndef DI_RECIPE_RENDER_INTERNAL_H
#define DI_RECIPE_RENDER_INTERNAL_H
#include <jansson.h>

#include "recipe/proto.h"
#include "recipe/proto_util.h"

enum { OPEN_NONE = 0, OPEN_REASONING, OPEN_TEXT, OPEN_TOOL };

struct di_stream {
    di_proto proto;
    di_render_meta m;
    int include_usage;
    int choice;
    int64_t seq;          /* Responses sequence_number */
    int open;             /* OPEN_* */
    int open_tool;        /* parser tool index of the open tool item */
    char *tool_name;      /* name and call id of the open tool item (owned copy) */
    char tool_call_id[64];
    int tool_complete;    /* its <call_end> was seen */
    int n_items;          /* items / blocks started so far */
    int item_index;       /* output_index / block index of the open one */
    char item_id[64];
    di_strbuf text;       /* text of the open item */
    json_t *items;        /* Responses: finished output items */
};

/* The open-item invariant, kept by these two: di_stream_item_open makes the next item / block
 * (index n_items) of `kind` the open one, with empty text; di_stream_item_close leaves none open. */
void di_stream_item_open(di_stream *s, int kind);
void di_stream_item_close(di_stream *s);

/* Appends {"event": event-or-null, "data": data} to out (steals data). Returns 0 or -1. */
int di_stream_push(json_t *out, const char *event, json_t *data);

di_status di_chat_stream_begin(di_stream *s, json_t *out);
di_status di_chat_stream_events(di_stream *s, const di_out_event *ev, size_t n, json_t *out);
di_status di_chat_stream_end(di_stream *s, const di_out_result *r, json_t *out);
di_status di_responses_stream_begin(di_stream *s, json_t *out);
di_status di_responses_stream_events(di_stream *s, const di_out_event *ev, size_t n, json_t *out);
di_status di_responses_stream_end(di_stream *s, const di_out_result *r, json_t *out);
di_status di_messages_stream_begin(di_stream *s, json_t *out);
di_status di_messages_stream_events(di_stream *s, const di_out_event *ev, size_t n, json_t *out);
di_status di_messages_stream_end(di_stream *s, const di_out_result *r, json_t *out);

/* Shared pieces of response objects. */
json_t *di_render_str_or_null(const char *s);
double di_render_or(double v, double dflt);   /* NAN -> dflt */
#endif
