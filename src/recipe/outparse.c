/* outparse.c - the streaming output parser (see outparse.h for the contract).
 *
 * State machine over generated tokens:
 *   REASONING / CONTENT   text goes to that channel; </think>, <think> switch between them
 *   TOOLS                 inside <calls_begin> ... <calls_end>, between calls (whitespace dropped;
 *                         other text ends the section and is content)
 *   CALL_TYPE             V3 only: "function" before <sep>
 *   CALL_NAME             V3: up to the first '\n'; V3.1: up to <sep>
 *   CALL_ARGS             V3: "```json\n" (prefix-matched) then arguments, the closing "\n```"
 *                         found by KMP; V3.1: everything up to <call_end>
 *   DONE                  after the finish event; further input is ignored
 * Invariants: exactly one text channel owns the UTF-8 tail at a time (switching flushes it);
 * `hold` contains only argument bytes that may still belong to the closing fence; events'
 * texts live in `arena` (offsets until di_outparse_events resolves them). */
#include "recipe/outparse.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "recipe/kmp.h"
#include "recipe/utf8_stream.h"

enum state { ST_REASONING, ST_CONTENT, ST_TOOLS, ST_CALL_TYPE, ST_CALL_NAME, ST_CALL_ARGS, ST_DONE };
enum channel { CH_NONE = -1, CH_REASONING = 0, CH_CONTENT = 1, CH_ARGS = 2 };

static const char OPEN_FENCE[] = "```json\n";
#define OPEN_FENCE_LEN 8
#define MAX_NAME 1024

typedef struct sbuf { char *s; size_t len, cap; } sbuf;

struct di_outparse {
    di_outparse_config cfg;
    enum state st;
    di_out_result res;
    sbuf reasoning, content;
    sbuf *args;             /* per call, parallel to res.calls */
    size_t cap_calls;
    /* events */
    di_out_event *ev;
    size_t *ev_off;
    size_t n_ev, cap_ev;
    sbuf arena;
    int events_taken;
    /* text channel */
    di_utf8_stream u8;
    enum channel u8_ch;
    int oom;
    /* current tool call */
    sbuf name;              /* V3: type then name; V3.1: name */
    int fence_pos;          /* opening fence bytes matched; OPEN_FENCE_LEN = done; -1 = absent */
    di_kmp close;           /* "\n```" */
    sbuf hold;
    int after_fence;
    char *first_error;
    char id_buf[64];
};

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

static int sb_add(sbuf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 64;
        while (nc < b->len + n + 1) nc *= 2;
        char *p = realloc(b->s, nc);
        if (!p) return -1;
        b->s = p;
        b->cap = nc;
    }
    if (n) memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
    return 0;
}

const char *di_finish_reason_name(di_finish_reason r) {
    switch (r) {
    case DI_FINISH_NONE: return "none";
    case DI_FINISH_STOP: return "stop";
    case DI_FINISH_LENGTH: return "length";
    case DI_FINISH_TOOL_CALLS: return "tool_calls";
    case DI_FINISH_STOP_SEQUENCE: return "stop_sequence";
    case DI_FINISH_ABORT: return "abort";
    case DI_FINISH_ERROR: return "error";
    }
    return "?";
}

void di_outparse_config_default(di_outparse_config *c, di_chat_format format) {
    memset(c, 0, sizeof *c);
    c->format = format;
    c->starts_in_reasoning = format == DI_CHAT_FORMAT_R1;
    c->id_think = c->id_think_end = -1;
    c->id_calls_begin = 128806;
    c->id_calls_end = 128807;
    c->id_call_begin = 128808;
    c->id_call_end = 128809;
    c->id_sep = 128814;
    c->id_eos = 1;
    for (int i = 0; i < 8; i++) c->stop_ids[i] = -1;
    c->stop_ids[0] = 128805; /* <|EOT|> */
}

/* ---- events ---- */

static void clear_taken(di_outparse *p) {
    if (!p->events_taken) return;
    p->n_ev = 0;
    p->arena.len = 0;
    p->events_taken = 0;
}

static di_out_event *new_event(di_outparse *p, di_out_kind kind) {
    if (p->n_ev == p->cap_ev) {
        size_t nc = p->cap_ev ? p->cap_ev * 2 : 16;
        di_out_event *e = realloc(p->ev, nc * sizeof *e);
        if (!e) { p->oom = 1; return NULL; }
        p->ev = e;
        size_t *o = realloc(p->ev_off, nc * sizeof *o);
        if (!o) { p->oom = 1; return NULL; }
        p->ev_off = o;
        p->cap_ev = nc;
    }
    di_out_event *e = &p->ev[p->n_ev];
    memset(e, 0, sizeof *e);
    e->kind = kind;
    e->tool_index = -1;
    p->ev_off[p->n_ev] = (size_t)-1;
    p->n_ev++;
    return e;
}

/* Appends a text delta of `kind` (coalescing with the previous event when it is the same). */
static void event_text(di_outparse *p, di_out_kind kind, int tool_index, const char *s, size_t n) {
    if (n == 0) return;
    if (p->n_ev) {
        di_out_event *last = &p->ev[p->n_ev - 1];
        if (last->kind == kind && last->tool_index == tool_index && p->ev_off[p->n_ev - 1] != (size_t)-1) {
            p->arena.len--;  /* overwrite the event's NUL, then terminate again */
            if (sb_add(&p->arena, s, n) || sb_add(&p->arena, "", 1)) { p->oom = 1; return; }
            last->len += n;
            return;
        }
    }
    di_out_event *e = new_event(p, kind);
    if (!e) return;
    e->tool_index = tool_index;
    p->ev_off[p->n_ev - 1] = p->arena.len;
    e->len = n;
    if (sb_add(&p->arena, s, n) || sb_add(&p->arena, "", 1)) p->oom = 1;
}

const di_out_event *di_outparse_events(di_outparse *p, size_t *n) {
    clear_taken(p);
    for (size_t i = 0; i < p->n_ev; i++) {
        if (p->ev_off[i] != (size_t)-1) p->ev[i].text = p->arena.s + p->ev_off[i];
        int t = p->ev[i].tool_index;
        if (t >= 0 && (size_t)t < p->res.n_calls) {
            p->ev[i].tool_id = p->res.calls[t].id;
            p->ev[i].tool_name = p->res.calls[t].name;
        }
        if (p->ev[i].kind == DI_OUT_FINISH) p->ev[i].detail = p->res.detail;
    }
    p->events_taken = 1;
    *n = p->n_ev;
    return p->ev;
}

/* ---- text channels ---- */

static int sink_reasoning(void *ud, const char *s, size_t n) {
    di_outparse *p = ud;
    if (sb_add(&p->reasoning, s, n)) return -1;
    event_text(p, DI_OUT_REASONING, -1, s, n);
    return 0;
}

static int sink_content(void *ud, const char *s, size_t n) {
    di_outparse *p = ud;
    if (sb_add(&p->content, s, n)) return -1;
    event_text(p, DI_OUT_CONTENT, -1, s, n);
    return 0;
}

static int sink_args(void *ud, const char *s, size_t n) {
    di_outparse *p = ud;
    size_t i = p->res.n_calls - 1;
    if (sb_add(&p->args[i], s, n)) return -1;
    event_text(p, DI_OUT_TOOL_ARGS, (int)i, s, n);
    return 0;
}

static di_utf8_sink channel_sink(enum channel ch) {
    return ch == CH_REASONING ? sink_reasoning : ch == CH_CONTENT ? sink_content : sink_args;
}

static void flush_channel(di_outparse *p) {
    if (p->u8_ch != CH_NONE && di_utf8_stream_flush(&p->u8, channel_sink(p->u8_ch), p)) p->oom = 1;
    p->u8_ch = CH_NONE;
}

static void emit(di_outparse *p, enum channel ch, const char *s, size_t n) {
    if (p->u8_ch != ch) {
        flush_channel(p);
        p->u8_ch = ch;
    }
    if (di_utf8_stream_push(&p->u8, s, n, channel_sink(ch), p)) p->oom = 1;
}

/* ---- tool calls ---- */

static int in_call(const di_outparse *p) {
    return p->st == ST_CALL_TYPE || p->st == ST_CALL_NAME || p->st == ST_CALL_ARGS;
}

static void begin_call(di_outparse *p) {
    flush_channel(p);
    p->name.len = 0;
    p->hold.len = 0;
    p->after_fence = 0;
    p->fence_pos = 0;
    di_kmp_init(&p->close, "\n```", 4);
    p->st = p->cfg.format == DI_CHAT_FORMAT_V31 ? ST_CALL_NAME : ST_CALL_TYPE;
}

static int name_sink(void *ud, const char *s, size_t n) { return sb_add((sbuf *)ud, s, n); }

/* The name is complete: register the call and announce it. */
static void start_call(di_outparse *p) {
    if (p->res.n_calls == p->cap_calls) {
        size_t nc = p->cap_calls ? p->cap_calls * 2 : 4;
        di_out_tool_call *c = realloc(p->res.calls, nc * sizeof *c);
        if (!c) { p->oom = 1; return; }
        p->res.calls = c;
        sbuf *a = realloc(p->args, nc * sizeof *a);
        if (!a) { p->oom = 1; return; }
        p->args = a;
        p->cap_calls = nc;
    }
    size_t i = p->res.n_calls++;  /* counted now, so di_outparse_free releases whatever follows */
    di_out_tool_call *c = &p->res.calls[i];
    memset(c, 0, sizeof *c);
    memset(&p->args[i], 0, sizeof p->args[i]);
    /* sanitise and trim the name */
    sbuf nm = {0};
    di_utf8_stream u;
    di_utf8_stream_init(&u);
    if (di_utf8_stream_push(&u, p->name.s ? p->name.s : "", p->name.len, name_sink, &nm) ||
        di_utf8_stream_flush(&u, name_sink, &nm) || sb_add(&nm, "", 0) || sb_add(&p->args[i], "", 0)) {
        free(nm.s);
        p->oom = 1;
        return;
    }
    size_t b = 0, e = nm.len;
    while (b < e && is_ws(nm.s[b])) b++;
    while (e > b && is_ws(nm.s[e - 1])) e--;
    memmove(nm.s, nm.s + b, e - b);
    nm.s[e - b] = '\0';
    c->name = nm.s;
    di_recipe_make_id(p->id_buf, sizeof p->id_buf, p->cfg.tool_id_prefix ? p->cfg.tool_id_prefix : "call_",
                      p->cfg.tool_id_seed, i);
    c->id = strdup(p->id_buf);
    if (!c->id) { p->oom = 1; return; }
    di_out_event *ev = new_event(p, DI_OUT_TOOL_START);
    if (ev) ev->tool_index = (int)i;
    p->st = ST_CALL_ARGS;
}

/* Emits the held argument bytes except the last `keep`. */
static void release_hold(di_outparse *p, size_t keep) {
    if (p->hold.len == 0) return;
    size_t n = p->hold.len - keep;
    if (n) emit(p, CH_ARGS, p->hold.s, n);
    memmove(p->hold.s, p->hold.s + n, keep);
    p->hold.len = keep;
}

/* V3 arguments after the opening fence: hold what may be the closing fence. */
static void args_fenced(di_outparse *p, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (sb_add(&p->hold, (const char *)&c, 1)) { p->oom = 1; return; }
        if (di_kmp_step(&p->close, c)) {
            release_hold(p, 4);
            p->after_fence = 1;
        } else if (p->after_fence && !is_ws((char)c)) {
            p->after_fence = 0;
        }
    }
    if (!p->after_fence) release_hold(p, p->close.state);
}

static void args_text(di_outparse *p, const char *s, size_t n) {
    if (p->cfg.format == DI_CHAT_FORMAT_V31) {
        emit(p, CH_ARGS, s, n);
        return;
    }
    size_t i = 0;
    while (i < n && p->fence_pos >= 0 && p->fence_pos < OPEN_FENCE_LEN) {
        if (s[i] == OPEN_FENCE[p->fence_pos]) {
            p->fence_pos++;
            i++;
            continue;
        }
        /* no fence: what looked like one is argument text */
        size_t matched = (size_t)p->fence_pos;
        p->fence_pos = -1;
        args_fenced(p, OPEN_FENCE, matched);
    }
    if (i < n) args_fenced(p, s + i, n - i);
}

static void set_error(di_outparse *p, const char *fmt, size_t idx, const char *name, const char *what) {
    if (p->first_error) return;
    size_t len = strlen(fmt) + strlen(name) + strlen(what) + 32;
    p->first_error = malloc(len);
    if (!p->first_error) { p->oom = 1; return; }
    snprintf(p->first_error, len, fmt, idx, name, what);
}

/* <call_end> (or the end of the stream when complete = 0). */
static void end_call(di_outparse *p, int complete) {
    if (p->st == ST_CALL_TYPE) p->name.len = 0;  /* never got a <sep>: no name */
    if (p->st == ST_CALL_TYPE || p->st == ST_CALL_NAME) start_call(p);
    if (p->oom || p->res.n_calls == 0) { p->st = ST_TOOLS; return; }
    size_t i = p->res.n_calls - 1;
    if (p->cfg.format != DI_CHAT_FORMAT_V31) {
        if (p->fence_pos > 0 && p->fence_pos < OPEN_FENCE_LEN) {
            size_t matched = (size_t)p->fence_pos;
            p->fence_pos = -1;
            args_fenced(p, OPEN_FENCE, matched);
        }
        if (p->after_fence) p->hold.len = 0;  /* the closing fence (and trailing space) */
        else release_hold(p, 0);
    }
    flush_channel(p);
    di_out_tool_call *c = &p->res.calls[i];
    c->arguments = p->args[i].s;
    c->complete = complete;
    if (complete) {
        json_error_t je;
        json_t *v = json_loadb(p->args[i].s, p->args[i].len, JSON_REJECT_DUPLICATES, &je);
        c->valid = v && json_is_object(v);
        if (!v)
            set_error(p, "tool call %zu (%s): arguments are not valid JSON: %s", i, c->name, je.text);
        else if (!c->valid)
            set_error(p, "tool call %zu (%s): arguments are %s, expected a JSON object", i, c->name,
                      json_is_array(v) ? "an array" : "not an object");
        json_decref(v);
    }
    di_out_event *ev = new_event(p, DI_OUT_TOOL_END);
    if (ev) {
        ev->tool_index = (int)i;
        ev->tool_valid = c->valid;
    }
    p->st = ST_TOOLS;
}

/* ---- driver ---- */

static void text(di_outparse *p, const char *s, size_t n) {
    switch (p->st) {
    case ST_REASONING: emit(p, CH_REASONING, s, n); break;
    case ST_CONTENT: emit(p, CH_CONTENT, s, n); break;
    case ST_TOOLS: {
        size_t i = 0;
        while (i < n && is_ws(s[i])) i++;
        if (i < n) {  /* text after the calls: the section is over */
            p->st = ST_CONTENT;
            emit(p, CH_CONTENT, s + i, n - i);
        }
        break;
    }
    case ST_CALL_TYPE:
        if (p->name.len + n <= MAX_NAME && sb_add(&p->name, s, n)) p->oom = 1;
        break;
    case ST_CALL_NAME:
        if (p->cfg.format == DI_CHAT_FORMAT_V31) {
            if (p->name.len + n <= MAX_NAME && sb_add(&p->name, s, n)) p->oom = 1;
        } else {
            const char *nl = memchr(s, '\n', n);
            size_t k = nl ? (size_t)(nl - s) : n;
            if (p->name.len + k <= MAX_NAME && sb_add(&p->name, s, k)) p->oom = 1;
            if (nl) {
                start_call(p);
                if (p->st == ST_CALL_ARGS) args_text(p, nl + 1, n - k - 1);
            }
        }
        break;
    case ST_CALL_ARGS: args_text(p, s, n); break;
    case ST_DONE: break;
    }
}

static void finish(di_outparse *p, di_finish_reason reason, const char *detail) {
    if (p->st == ST_DONE) return;
    char buf[128];
    if (in_call(p)) {
        end_call(p, 0);
        size_t idx = p->res.n_calls ? p->res.n_calls - 1 : 0;
        if (reason != DI_FINISH_LENGTH && reason != DI_FINISH_ABORT) {
            snprintf(buf, sizeof buf, "unterminated tool call %zu: the output ended before <call_end>", idx);
            reason = DI_FINISH_ERROR;
            detail = buf;
        }
    }
    flush_channel(p);
    if (p->first_error && (reason == DI_FINISH_STOP || reason == DI_FINISH_STOP_SEQUENCE)) {
        reason = DI_FINISH_ERROR;
        detail = p->first_error;
    }
    if (reason == DI_FINISH_STOP && p->res.n_calls > 0) reason = DI_FINISH_TOOL_CALLS;
    p->res.finish = reason;
    if (detail && !(p->res.detail = strdup(detail))) p->oom = 1;
    new_event(p, DI_OUT_FINISH);
    if (p->n_ev) p->ev[p->n_ev - 1].finish = reason;
    p->st = ST_DONE;
}

static int is_stop_id(const di_outparse *p, int32_t id) {
    if (id == p->cfg.id_eos) return 1;
    for (int i = 0; i < 8; i++)
        if (p->cfg.stop_ids[i] >= 0 && p->cfg.stop_ids[i] == id) return 1;
    return 0;
}

static void control(di_outparse *p, int32_t id) {
    const di_outparse_config *c = &p->cfg;
    if (id == c->id_think) {
        if (p->st == ST_CONTENT) p->st = ST_REASONING;
    } else if (id == c->id_think_end) {
        if (p->st == ST_REASONING) p->st = ST_CONTENT;
    } else if (id == c->id_calls_begin) {
        if (in_call(p)) end_call(p, 1);
        flush_channel(p);
        p->st = ST_TOOLS;
    } else if (id == c->id_call_begin) {
        if (in_call(p)) end_call(p, 1);
        begin_call(p);
    } else if (id == c->id_sep) {
        if (p->st == ST_CALL_TYPE) {
            p->name.len = 0;
            p->st = ST_CALL_NAME;
        } else if (p->st == ST_CALL_NAME && c->format == DI_CHAT_FORMAT_V31) {
            start_call(p);
        }
    } else if (id == c->id_call_end) {
        if (in_call(p)) end_call(p, 1);
    } else if (id == c->id_calls_end) {
        if (in_call(p)) end_call(p, 1);
        if (p->st == ST_TOOLS) p->st = ST_CONTENT;
    }
}

static int is_control(const di_outparse *p, int32_t id) {
    const di_outparse_config *c = &p->cfg;
    const int32_t ids[] = {c->id_think, c->id_think_end, c->id_calls_begin, c->id_call_begin,
                           c->id_sep, c->id_call_end, c->id_calls_end};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
        if (ids[i] >= 0 && ids[i] == id) return 1;
    return 0;
}

static di_status status_of(di_outparse *p) {
    return p->oom ? di_error(DI_ERR_NOMEM, "output parser: out of memory") : DI_OK;
}

di_status di_outparse_feed(di_outparse *p, int32_t id, const char *bytes, size_t len) {
    clear_taken(p);
    if (p->st == ST_DONE) return status_of(p);
    p->res.n_tokens++;
    if (p->st == ST_REASONING) p->res.n_reasoning_tokens++;
    if (id >= 0 && is_stop_id(p, id)) finish(p, DI_FINISH_STOP, NULL);
    else if (id >= 0 && is_control(p, id)) control(p, id);
    else if (len) text(p, bytes, len);
    return status_of(p);
}

di_status di_outparse_feed_text(di_outparse *p, const char *bytes, size_t len) {
    clear_taken(p);
    if (p->st != ST_DONE && len) text(p, bytes, len);
    return status_of(p);
}

di_status di_outparse_finish(di_outparse *p, di_finish_reason reason, const char *detail) {
    clear_taken(p);
    if (reason == DI_FINISH_NONE || reason == DI_FINISH_TOOL_CALLS) reason = DI_FINISH_STOP;
    finish(p, reason, detail);
    return status_of(p);
}

int di_outparse_done(const di_outparse *p) { return p->st == ST_DONE; }

const di_out_result *di_outparse_result(const di_outparse *p) {
    di_out_result *r = (di_out_result *)&p->res;
    r->reasoning = p->reasoning.s;
    r->reasoning_len = p->reasoning.len;
    r->content = p->content.s;
    r->content_len = p->content.len;
    for (size_t i = 0; i < r->n_calls; i++) r->calls[i].arguments = p->args[i].s;
    return r;
}

di_outparse *di_outparse_create(const di_outparse_config *cfg) {
    di_outparse *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->cfg = *cfg;
    p->st = cfg->starts_in_reasoning ? ST_REASONING : ST_CONTENT;
    p->u8_ch = CH_NONE;
    di_utf8_stream_init(&p->u8);
    if (sb_add(&p->reasoning, "", 0) || sb_add(&p->content, "", 0)) {
        di_outparse_free(p);
        return NULL;
    }
    return p;
}

void di_outparse_free(di_outparse *p) {
    if (!p) return;
    for (size_t i = 0; i < p->res.n_calls; i++) {
        free(p->res.calls[i].id);
        free(p->res.calls[i].name);
        free(p->args[i].s);
    }
    free(p->res.calls);
    free(p->args);
    free(p->res.detail);
    free(p->reasoning.s);
    free(p->content.s);
    free(p->ev);
    free(p->ev_off);
    free(p->arena.s);
    free(p->name.s);
    free(p->hold.s);
    free(p->first_error);
    free(p);
}
