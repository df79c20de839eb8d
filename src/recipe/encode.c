/* encode.c - the di_prompt builder (text + special/text segmentation) and the dispatch to the
 * per-format chat encoders (encode_v3.c, encode_r1.c, encode_v31.c).
 * Invariant kept here: adjacent text segments are merged, special segments are never merged. */
#include "recipe/encode.h"

#include <stdlib.h>
#include <string.h>

#include "core/status.h"

int di_chat_format_parse(const char *s) {
    if (!s) return -1;
    if (!strcmp(s, "v3")) return DI_CHAT_FORMAT_V3;
    if (!strcmp(s, "r1")) return DI_CHAT_FORMAT_R1;
    if (!strcmp(s, "v3.1") || !strcmp(s, "v31")) return DI_CHAT_FORMAT_V31;
    return -1;
}

const char *di_chat_format_name(di_chat_format f) {
    switch (f) {
    case DI_CHAT_FORMAT_V3: return "v3";
    case DI_CHAT_FORMAT_R1: return "r1";
    case DI_CHAT_FORMAT_V31: return "v3.1";
    }
    return "?";
}

void di_prompt_init(di_prompt *p) { memset(p, 0, sizeof *p); }

void di_prompt_free(di_prompt *p) {
    free(p->text);
    free(p->segs);
    di_prompt_init(p);
}

static di_status reserve_text(di_prompt *p, size_t extra) {
    if (p->len + extra + 1 <= p->cap) return DI_OK;
    size_t nc = p->cap ? p->cap : 256;
    while (nc < p->len + extra + 1) nc *= 2;
    char *t = realloc(p->text, nc);
    if (!t) return di_error(DI_ERR_NOMEM, "out of memory rendering a prompt");
    p->text = t;
    p->cap = nc;
    return DI_OK;
}

static di_status push_seg(di_prompt *p, di_seg_kind kind, size_t off, size_t len) {
    if (kind == DI_SEG_TEXT && p->n_segs && p->segs[p->n_segs - 1].kind == DI_SEG_TEXT) {
        p->segs[p->n_segs - 1].len += len;
        return DI_OK;
    }
    if (p->n_segs == p->cap_segs) {
        size_t nc = p->cap_segs ? p->cap_segs * 2 : 32;
        di_seg *s = realloc(p->segs, nc * sizeof *s);
        if (!s) return di_error(DI_ERR_NOMEM, "out of memory rendering a prompt");
        p->segs = s;
        p->cap_segs = nc;
    }
    p->segs[p->n_segs++] = (di_seg){kind, off, len};
    return DI_OK;
}

static di_status append(di_prompt *p, di_seg_kind kind, const char *s, size_t len) {
    DI_TRY(reserve_text(p, len));
    size_t off = p->len;
    if (len) memcpy(p->text + off, s, len);
    p->len += len;
    p->text[p->len] = '\0';
    return push_seg(p, kind, off, len);
}

di_status di_prompt_text(di_prompt *p, const char *s, size_t len) {
    if (len == 0) {  /* keep text NUL-terminated even when nothing is appended */
        DI_TRY(reserve_text(p, 0));
        p->text[p->len] = '\0';
        return DI_OK;
    }
    return append(p, DI_SEG_TEXT, s, len);
}

di_status di_prompt_special(di_prompt *p, const char *tok) {
    return append(p, DI_SEG_SPECIAL, tok, strlen(tok));
}

di_status di_encode_need_content(const di_message *m, size_t i) {
    if (!m->content)
        return di_error(DI_ERR_INVALID_ARG, "messages[%zu]: %s message content is null", i, di_role_name(m->role));
    return DI_OK;
}

di_status di_encode_system_prefix(const di_conv *c, const di_encode_opts *o, di_prompt *out) {
    DI_TRY(di_prompt_special(out, o->bos_token ? o->bos_token : DI_TOK_STR_BOS));
    int first = 1;
    for (size_t i = 0; i < c->n_msgs; i++) {
        const di_message *m = &c->msgs[i];
        if (m->role != DI_ROLE_SYSTEM) continue;
        DI_TRY(di_encode_need_content(m, i));
        if (!first) DI_TRY(di_prompt_text(out, "\n\n", 2));
        DI_TRY(di_prompt_text(out, m->content, strlen(m->content)));
        first = 0;
    }
    return DI_OK;
}

di_status di_chat_encode(const di_conv *c, const di_encode_opts *o, di_prompt *out) {
    out->len = 0;
    out->n_segs = 0;
    DI_TRY(di_prompt_text(out, "", 0));
    if (o->continue_final_message) {
        const di_message *last = c->n_msgs ? &c->msgs[c->n_msgs - 1] : NULL;
        if (!last || last->role != DI_ROLE_ASSISTANT || !last->content || last->n_tool_calls)
            return di_error(DI_ERR_INVALID_ARG, "continue_final_message: the conversation does not end with an "
                            "assistant message with text content");
        if (o->add_generation_prompt)
            return di_error(DI_ERR_INVALID_ARG, "continue_final_message and add_generation_prompt are exclusive");
    }
    di_status s;
    switch (o->format) {
    case DI_CHAT_FORMAT_V3: s = di_encode_v3(c, o, out); break;
    case DI_CHAT_FORMAT_R1: s = di_encode_r1(c, o, out); break;
    case DI_CHAT_FORMAT_V31: s = di_encode_v31(c, o, out); break;
    default: return di_error(DI_ERR_INVALID_ARG, "unknown chat format %d", (int)o->format);
    }
    if (s != DI_OK) return di_error_context(s, "%s chat format", di_chat_format_name(o->format));
    if (o->continue_final_message) {  /* drop the final message's end-of-sentence */
        const char *eos = o->eos_token ? o->eos_token : DI_TOK_STR_EOS;
        di_seg *last = out->n_segs ? &out->segs[out->n_segs - 1] : NULL;
        if (last && last->kind == DI_SEG_SPECIAL && last->len == strlen(eos) &&
            !memcmp(out->text + last->off, eos, last->len)) {
            out->len = last->off;
            out->text[out->len] = '\0';
            out->n_segs--;
        }
    }
    return DI_OK;
}

int di_chat_format_starts_in_reasoning(di_chat_format f, di_thinking thinking) {
    if (f == DI_CHAT_FORMAT_R1) return 1;
    if (f == DI_CHAT_FORMAT_V31) return thinking == DI_THINKING_ON;
    return 0;
}

static int seg_is(const di_prompt *p, const di_seg *s, const char *tok) {
    return s->len == strlen(tok) && !memcmp(p->text + s->off, tok, s->len);
}

int di_prompt_ends_in_reasoning(const di_prompt *p) {
    for (size_t i = p->n_segs; i-- > 0;) {
        const di_seg *s = &p->segs[i];
        if (s->kind != DI_SEG_SPECIAL) continue;
        if (seg_is(p, s, DI_TOK_STR_THINK)) return 1;
        if (seg_is(p, s, DI_TOK_STR_THINK_END) || seg_is(p, s, DI_TOK_STR_USER) || seg_is(p, s, DI_TOK_STR_ASSISTANT))
            return 0;
    }
    return 0;
}
