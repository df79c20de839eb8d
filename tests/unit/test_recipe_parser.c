/* test_recipe_parser.c - the streaming output parser: reasoning / content / tool-call
 * separation for the V3, R1 and V3.1 formats, control tokens by id only, UTF-8 split across
 * tokens, the KMP-matched json fence, malformed and truncated output; and the property that the
 * final result does not depend on chunking (token by token, text merged across tokens and cut
 * at random byte offsets, byte by byte), over hand-written and seeded random streams. Random
 * ids and bytes must never crash (this test also runs under ASan/UBSan) and always yield valid
 * UTF-8 and events consistent with the result. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/utf8.h"
#include "recipe/kmp.h"
#include "recipe/outparse.h"
#include "recipe/utf8_stream.h"
#include "test_util.h"

enum { THINK = 128798, THINK_END = 128799, CALLS_B = 128806, CALLS_E = 128807, CALL_B = 128808, CALL_E = 128809,
       SEP = 128814, EOS = 1, EOT = 128805, TEXT_ID = 4242 };

typedef struct tok { int32_t id; char b[8]; size_t n; } tok;
typedef struct stream { tok *t; size_t n, cap; } stream;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {  /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static size_t rndn(size_t n) { return n ? (size_t)(rnd() % n) : 0; }

static void push_tok(stream *s, int32_t id, const char *b, size_t n) {
    if (s->n == s->cap) s->t = realloc(s->t, (s->cap = s->cap ? s->cap * 2 : 64) * sizeof *s->t);
    tok *t = &s->t[s->n++];
    t->id = id;
    t->n = n;
    if (n) memcpy(t->b, b, n);
}
/* Text as tokens of 1..max bytes (cuts may fall inside UTF-8 characters, as byte-level BPE). */
static void push_text(stream *s, const char *text, size_t max) {
    size_t len = strlen(text), i = 0;
    while (i < len) {
        size_t k = 1 + rndn(max);
        if (k > len - i) k = len - i;
        push_tok(s, TEXT_ID, text + i, k);
        i += k;
    }
}
static void ctl(stream *s, int32_t id) {
    static const char *names[] = {"<think>", "</think>"};
    const char *nm = id == THINK ? names[0] : id == THINK_END ? names[1] : "<ctl>";
    push_tok(s, id, nm, strlen(nm) > 8 ? 8 : strlen(nm));
}

static di_outparse_config config(di_chat_format f, int think_ids) {
    di_outparse_config c;
    di_outparse_config_default(&c, f);
    if (think_ids) {
        c.id_think = THINK;
        c.id_think_end = THINK_END;
    }
    c.tool_id_seed = 77;
    return c;
}

/* Per-channel text reassembled from events, to compare with the result. */
typedef struct evacc { char *reasoning, *content, *args[16]; int starts, ends, finishes; size_t rl, cl, al[16]; } evacc;
static void acc(evacc *a, char **dst, size_t *l, const char *s, size_t n) {
    *dst = realloc(*dst, *l + n + 1);
    memcpy(*dst + *l, s, n);
    *l += n;
    (*dst)[*l] = 0;
}
static void collect(di_outparse *p, evacc *a) {
    size_t n;
    const di_out_event *ev = di_outparse_events(p, &n);
    for (size_t i = 0; i < n; i++) {
        const di_out_event *e = &ev[i];
        if (e->kind == DI_OUT_REASONING) acc(a, &a->reasoning, &a->rl, e->text, e->len);
        if (e->kind == DI_OUT_CONTENT) acc(a, &a->content, &a->cl, e->text, e->len);
        if (e->kind == DI_OUT_TOOL_ARGS && e->tool_index < 16)
            acc(a, &a->args[e->tool_index], &a->al[e->tool_index], e->text, e->len);
        if (e->kind == DI_OUT_TOOL_START) a->starts++;
        if (e->kind == DI_OUT_TOOL_END) a->ends++;
        if (e->kind == DI_OUT_FINISH) a->finishes++;
        if (e->kind != DI_OUT_FINISH && e->kind != DI_OUT_TOOL_START && e->kind != DI_OUT_TOOL_END)
            CHECK(e->text && e->text[e->len] == '\0' && e->len > 0);
    }
}
static void evacc_free(evacc *a) {
    free(a->reasoning);
    free(a->content);
    for (int i = 0; i < 16; i++) free(a->args[i]);
}

enum { MODE_TOKENS, MODE_RANDOM_CHUNKS, MODE_BYTES, N_MODES };

/* Runs the stream; end = finish reason passed at the end (if no end token came). */
static di_outparse *run(const di_outparse_config *cfg, const stream *s, int mode, di_finish_reason end, evacc *a) {
    di_outparse *p = di_outparse_create(cfg);
    memset(a, 0, sizeof *a);
    size_t i = 0;
    while (i < s->n) {
        const tok *t = &s->t[i];
        int is_text = t->id == TEXT_ID;
        if (mode == MODE_TOKENS || !is_text) {
            CHECK_OK(di_outparse_feed(p, t->id, t->b, t->n));
            i++;
        } else {  /* merge the run of text tokens, cut it anew */
            char buf[4096];
            size_t len = 0;
            while (i < s->n && s->t[i].id == TEXT_ID && len + s->t[i].n <= sizeof buf) {
                memcpy(buf + len, s->t[i].b, s->t[i].n);
                len += s->t[i].n;
                i++;
            }
            size_t off = 0;
            while (off < len) {
                size_t k = mode == MODE_BYTES ? 1 : 1 + rndn(len - off);
                CHECK_OK(di_outparse_feed_text(p, buf + off, k));
                off += k;
                if (rndn(3) == 0) collect(p, a);
            }
        }
        if (rndn(2) == 0) collect(p, a);
    }
    CHECK_OK(di_outparse_finish(p, end, end == DI_FINISH_STOP_SEQUENCE ? "STOP" : NULL));
    collect(p, a);
    return p;
}

static int same_str(const char *a, size_t al, const char *b, size_t bl) {
    return al == bl && (al == 0 || !memcmp(a, b, al));
}

/* Compares two final results (token counts excluded: feed_text does not count tokens). */
static int same_result(const di_out_result *x, const di_out_result *y) {
    if (!same_str(x->reasoning, x->reasoning_len, y->reasoning, y->reasoning_len)) return 0;
    if (!same_str(x->content, x->content_len, y->content, y->content_len)) return 0;
    if (x->n_calls != y->n_calls || x->finish != y->finish) return 0;
    if ((x->detail == NULL) != (y->detail == NULL) || (x->detail && strcmp(x->detail, y->detail))) return 0;
    for (size_t i = 0; i < x->n_calls; i++) {
        const di_out_tool_call *a = &x->calls[i], *b = &y->calls[i];
        if (strcmp(a->id, b->id) || strcmp(a->name, b->name) || strcmp(a->arguments, b->arguments) ||
            a->complete != b->complete || a->valid != b->valid)
            return 0;
    }
    return 1;
}

/* Result is valid UTF-8 and equals what the events carried. */
static void check_consistent(const di_out_result *r, const evacc *a) {
    CHECK(di_utf8_valid(r->reasoning, r->reasoning_len, NULL));
    CHECK(di_utf8_valid(r->content, r->content_len, NULL));
    CHECK(same_str(r->reasoning, r->reasoning_len, a->reasoning, a->rl));
    CHECK(same_str(r->content, r->content_len, a->content, a->cl));
    CHECK_EQ_INT(a->starts, r->n_calls);
    CHECK_EQ_INT(a->ends, r->n_calls);
    CHECK_EQ_INT(a->finishes, 1);
    for (size_t i = 0; i < r->n_calls && i < 16; i++) {
        CHECK(di_utf8_valid(r->calls[i].arguments, strlen(r->calls[i].arguments), NULL));
        CHECK(di_utf8_valid(r->calls[i].name, strlen(r->calls[i].name), NULL));
        CHECK(same_str(r->calls[i].arguments, strlen(r->calls[i].arguments), a->args[i], a->al[i]));
    }
    CHECK(r->finish != DI_FINISH_NONE);
}

/* Runs all chunking modes; checks they agree; returns the token-mode parser (caller frees). */
static di_outparse *run_all(const di_outparse_config *cfg, const stream *s, di_finish_reason end) {
    evacc a0;
    di_outparse *p0 = run(cfg, s, MODE_TOKENS, end, &a0);
    check_consistent(di_outparse_result(p0), &a0);
    evacc_free(&a0);
    for (int mode = 1; mode < N_MODES; mode++) {
        for (int rep = 0; rep < (mode == MODE_RANDOM_CHUNKS ? 3 : 1); rep++) {
            evacc a;
            di_outparse *p = run(cfg, s, mode, end, &a);
            check_consistent(di_outparse_result(p), &a);
            CHECK_MSG(same_result(di_outparse_result(p0), di_outparse_result(p)), "chunking mode %d changed the result",
                      mode);
            evacc_free(&a);
            di_outparse_free(p);
        }
    }
    return p0;
}

static void test_v3_content_and_tools(void) {
    di_outparse_config cfg = config(DI_CHAT_FORMAT_V3, 0);
    stream s = {0};
    push_text(&s, "Let me check the weather in 東京 🌧.", 3);
    ctl(&s, CALLS_B);
    ctl(&s, CALL_B);
    push_text(&s, "function", 3);
    ctl(&s, SEP);
    push_text(&s, "get_weather\n```json\n{\"location\": \"東京\", \"unit\": \"c\"}\n```", 4);
    ctl(&s, CALL_E);
    push_text(&s, "\n", 1);
    ctl(&s, CALL_B);
    push_text(&s, "function", 8);
    ctl(&s, SEP);
    push_text(&s, "get_time\n```json\n{}\n```", 2);
    ctl(&s, CALL_E);
    ctl(&s, CALLS_E);
    ctl(&s, EOS);
    push_text(&s, "ignored after the end", 5);
    di_outparse *p = run_all(&cfg, &s, DI_FINISH_LENGTH);
    const di_out_result *r = di_outparse_result(p);
    CHECK_EQ_STR(r->content, "Let me check the weather in 東京 🌧.");
    CHECK_EQ_STR(r->reasoning, "");
    CHECK_EQ_INT(r->n_calls, 2);
    if (r->n_calls == 2) {
        CHECK_EQ_STR(r->calls[0].name, "get_weather");
        CHECK_EQ_STR(r->calls[0].arguments, "{\"location\": \"東京\", \"unit\": \"c\"}");
        CHECK_EQ_STR(r->calls[1].name, "get_time");
        CHECK_EQ_STR(r->calls[1].arguments, "{}");
        CHECK(r->calls[0].valid && r->calls[1].valid && r->calls[0].complete);
        CHECK(!strncmp(r->calls[0].id, "call_", 5) && strlen(r->calls[0].id) == 29);
        CHECK(strcmp(r->calls[0].id, r->calls[1].id) != 0);
        char id[64];
        di_recipe_make_id(id, sizeof id, "call_", 77, 1);
        CHECK_EQ_STR(r->calls[1].id, id);
    }
    CHECK_EQ_INT(r->finish, DI_FINISH_TOOL_CALLS);  /* EOS ended it before the LENGTH hint */
    CHECK(r->detail == NULL);
    di_outparse_free(p);
    free(s.t);
}

static void test_r1_reasoning(void) {
    di_outparse_config cfg = config(DI_CHAT_FORMAT_R1, 1);
    CHECK(cfg.starts_in_reasoning);
    stream s = {0};
    push_text(&s, "Okay, 2+2. The literal text </think> is not the token.\n", 3);
    ctl(&s, THINK_END);
    push_text(&s, "\n\nThe answer is **4**.", 2);
    ctl(&s, EOT);
    di_outparse *p = run_all(&cfg, &s, DI_FINISH_STOP);
    const di_out_result *r = di_outparse_result(p);
    CHECK_EQ_STR(r->reasoning, "Okay, 2+2. The literal text </think> is not the token.\n");
    CHECK_EQ_STR(r->content, "\n\nThe answer is **4**.");
    CHECK_EQ_INT(r->finish, DI_FINISH_STOP);
    CHECK(r->n_reasoning_tokens > 0 && r->n_reasoning_tokens < r->n_tokens);
    di_outparse_free(p);
    free(s.t);

    /* <think> at the start of a content-mode stream enters reasoning */
    cfg.starts_in_reasoning = 0;
    stream t = {0};
    ctl(&t, THINK);
    push_text(&t, "hmm", 1);
    ctl(&t, THINK_END);
    push_text(&t, "ok", 1);
    p = run_all(&cfg, &t, DI_FINISH_STOP);
    r = di_outparse_result(p);
    CHECK_EQ_STR(r->reasoning, "hmm");
    CHECK_EQ_STR(r->content, "ok");
    di_outparse_free(p);
    free(t.t);
}

static void test_v31_tools(void) {
    di_outparse_config cfg = config(DI_CHAT_FORMAT_V31, 1);
    cfg.starts_in_reasoning = 1;
    cfg.tool_id_prefix = "toolu_";
    stream s = {0};
    push_text(&s, "need weather", 2);
    ctl(&s, THINK_END);
    push_text(&s, "Checking.", 2);
    ctl(&s, CALLS_B);
    ctl(&s, CALL_B);
    push_text(&s, "get_weather", 3);
    ctl(&s, SEP);
    push_text(&s, "{\"city\": \"Zürich\", \"days\": [1, 2]}", 3);
    ctl(&s, CALL_E);
    ctl(&s, CALL_B);
    push_text(&s, "noop", 3);
    ctl(&s, SEP);
    push_text(&s, "{}", 1);
    ctl(&s, CALL_E);
    ctl(&s, CALLS_E);
    ctl(&s, EOS);
    di_outparse *p = run_all(&cfg, &s, DI_FINISH_STOP);
    const di_out_result *r = di_outparse_result(p);
    CHECK_EQ_STR(r->reasoning, "need weather");
    CHECK_EQ_STR(r->content, "Checking.");
    CHECK_EQ_INT(r->n_calls, 2);
    if (r->n_calls == 2) {
        CHECK_EQ_STR(r->calls[0].name, "get_weather");
        CHECK_EQ_STR(r->calls[0].arguments, "{\"city\": \"Zürich\", \"days\": [1, 2]}");
        CHECK_EQ_STR(r->calls[1].name, "noop");
        CHECK(!strncmp(r->calls[0].id, "toolu_", 6));
    }
    CHECK_EQ_INT(r->finish, DI_FINISH_TOOL_CALLS);
    di_outparse_free(p);
    free(s.t);
}

/* Delimiter strings as ordinary text stay text; the fence matcher strips only the real fence. */
static void test_text_lookalikes_and_fences(void) {
    di_outparse_config cfg = config(DI_CHAT_FORMAT_V3, 1);
    stream s = {0};
    push_text(&s, "```json\n{\"x\": 1}\n``` and <｜tool▁calls▁begin｜> typed as text", 2);
    ctl(&s, CALL_B);  /* a call without <calls_begin> is accepted */
    push_text(&s, "function", 4);
    ctl(&s, SEP);
    /* the fence candidate "\n```" appears twice: only the last one, followed by whitespace, closes */
    push_text(&s, "f\n```json\n{\"a\": \"b\"}\n```x\n```  \n", 1);
    ctl(&s, CALL_E);
    ctl(&s, CALL_B);
    push_text(&s, "function", 4);
    ctl(&s, SEP);
    push_text(&s, "g\n{\"no\": \"fence\"}", 3);  /* no opening fence at all */
    ctl(&s, CALL_E);
    ctl(&s, CALLS_E);
    push_text(&s, "tail text", 2);
    ctl(&s, EOS);
    di_outparse *p = run_all(&cfg, &s, DI_FINISH_STOP);
    const di_out_result *r = di_outparse_result(p);
    CHECK_EQ_STR(r->content, "```json\n{\"x\": 1}\n``` and <｜tool▁calls▁begin｜> typed as texttail text");
    CHECK_EQ_INT(r->n_calls, 2);
    if (r->n_calls == 2) {
        CHECK_EQ_STR(r->calls[0].arguments, "{\"a\": \"b\"}\n```x");
        CHECK(!r->calls[0].valid);
        CHECK_EQ_STR(r->calls[1].arguments, "{\"no\": \"fence\"}");
        CHECK(r->calls[1].valid);
    }
    CHECK_EQ_INT(r->finish, DI_FINISH_ERROR);
    CHECK(r->detail && strstr(r->detail, "tool call 0 (f)") && strstr(r->detail, "not valid JSON"));
    di_outparse_free(p);
    free(s.t);
}

static void test_malformed_and_truncated(void) {
    di_outparse_config cfg = config(DI_CHAT_FORMAT_V3, 0);
    /* truncated inside the arguments: LENGTH keeps the partial call */
    stream s = {0};
    ctl(&s, CALLS_B);
    ctl(&s, CALL_B);
    push_text(&s, "function", 3);
    ctl(&s, SEP);
    push_text(&s, "search\n```json\n{\"q\": \"dee", 3);
    di_outparse *p = run_all(&cfg, &s, DI_FINISH_LENGTH);
    const di_out_result *r = di_outparse_result(p);
    CHECK_EQ_INT(r->finish, DI_FINISH_LENGTH);
    CHECK_EQ_INT(r->n_calls, 1);
    if (r->n_calls) {
        CHECK_EQ_STR(r->calls[0].arguments, "{\"q\": \"dee");
        CHECK(!r->calls[0].complete && !r->calls[0].valid);
    }
    di_outparse_free(p);
    /* the same stream ended by an end token: an error naming the unterminated call */
    ctl(&s, EOS);
    p = run_all(&cfg, &s, DI_FINISH_STOP);
    r = di_outparse_result(p);
    CHECK_EQ_INT(r->finish, DI_FINISH_ERROR);
    CHECK(r->detail && strstr(r->detail, "unterminated tool call 0"));
    di_outparse_free(p);
    free(s.t);

    /* arguments that are JSON but not an object */
    stream t = {0};
    ctl(&t, CALL_B);
    push_text(&t, "function", 3);
    ctl(&t, SEP);
    push_text(&t, "f\n```json\n[1, 2]\n```", 3);
    ctl(&t, CALL_E);
    ctl(&t, EOS);
    p = run_all(&cfg, &t, DI_FINISH_STOP);
    r = di_outparse_result(p);
    CHECK_EQ_INT(r->finish, DI_FINISH_ERROR);
    CHECK(r->detail && strstr(r->detail, "expected a JSON object"));
    di_outparse_free(p);
    free(t.t);

    /* stop sequence and abort pass through; a stop string overrides nothing else */
    stream u = {0};
    push_text(&u, "abc", 1);
    p = run_all(&cfg, &u, DI_FINISH_STOP_SEQUENCE);
    r = di_outparse_result(p);
    CHECK_EQ_INT(r->finish, DI_FINISH_STOP_SEQUENCE);
    CHECK_EQ_STR(r->detail, "STOP");
    di_outparse_free(p);
    free(u.t);
}

static void test_utf8(void) {
    di_outparse_config cfg = config(DI_CHAT_FORMAT_V3, 0);
    stream s = {0};
    /* "é" split, a stray continuation byte, an overlong, a truncated 3-byte char before a
     * control token, and a truncated char at the very end */
    push_tok(&s, TEXT_ID, "a\xc3", 2);
    push_tok(&s, TEXT_ID, "\xa9" "b", 2);
    push_tok(&s, TEXT_ID, "\x80" "c\xc0\xaf", 4);
    push_tok(&s, TEXT_ID, "\xe6\x97", 2);
    ctl(&s, CALLS_B);
    ctl(&s, CALLS_E);
    push_tok(&s, TEXT_ID, "d\xf0\x9f", 3);
    di_outparse *p = run_all(&cfg, &s, DI_FINISH_LENGTH);
    const di_out_result *r = di_outparse_result(p);
    /* Rust/HF from_utf8_lossy: one U+FFFD per maximal invalid subpart */
    CHECK_EQ_STR(r->content, "a\xc3\xa9" "b\xef\xbf\xbd" "c\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd" "d\xef\xbf\xbd");
    di_outparse_free(p);
    free(s.t);

    /* the sanitiser directly, against Python's bytes.decode('utf-8', 'replace') */
    struct { const char *in; size_t n; const char *want; } cases[] = {
        {"\xed\xa0\x80", 3, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},  /* surrogate: 3 replacements */
        {"\xf4\x90\x80\x80", 4, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xe2\x82", 2, "\xef\xbf\xbd"},
        {"\xe2\x82" "A", 3, "\xef\xbf\xbd" "A"},
        {"\xf0\x9f\x98\x80", 4, "\xf0\x9f\x98\x80"},
        {"\xff\xfe", 2, "\xef\xbf\xbd\xef\xbf\xbd"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        for (size_t cut = 0; cut <= cases[i].n; cut++) {  /* every split point gives the same output */
            di_outparse *q = di_outparse_create(&cfg);
            di_outparse_feed_text(q, cases[i].in, cut);
            di_outparse_feed_text(q, cases[i].in + cut, cases[i].n - cut);
            di_outparse_finish(q, DI_FINISH_STOP, NULL);
            CHECK_MSG(!strcmp(di_outparse_result(q)->content, cases[i].want), "case %zu cut %zu", i, cut);
            di_outparse_free(q);
        }
    }
}

static void test_kmp(void) {
    di_kmp k;
    CHECK_EQ_INT(di_kmp_init(&k, "aab", 3), 0);
    const char *s = "aaabaab";
    int hits = 0, at[4];
    for (int i = 0; s[i]; i++)
        if (di_kmp_step(&k, (unsigned char)s[i])) at[hits++] = i;
    CHECK_EQ_INT(hits, 2);
    CHECK(hits == 2 && at[0] == 3 && at[1] == 6);
    CHECK_EQ_INT(di_kmp_init(&k, "abab", 4), 0);  /* overlapping matches */
    hits = 0;
    for (const char *q = "ababab"; *q; q++) hits += di_kmp_step(&k, (unsigned char)*q);
    CHECK_EQ_INT(hits, 2);
    CHECK_EQ_INT(di_kmp_init(&k, "", 0), -1);
}

/* Seeded random streams over a vocabulary of tricky fragments and every control id. */
static void random_stream(stream *s, di_chat_format f) {
    static const char *frags[] = {"a", " ", "\n", "```", "json", "\n```", "```json\n", "{\"k\": ", "1}", "\"v\"", "}",
                                  "東", "京", "🙂", "</think>", "function", "get_x", "\t", "é", "\xc3", "\xa9", "\xff",
                                  "\xe6\x97", "\xa5", "[", "]", ",", "\n\n"};
    const int32_t ctls[] = {THINK, THINK_END, CALLS_B, CALLS_E, CALL_B, CALL_E, SEP};
    size_t n = 1 + rndn(60);
    for (size_t i = 0; i < n; i++) {
        if (rndn(5) == 0) ctl(s, ctls[rndn(7)]);
        else push_text(s, frags[rndn(sizeof frags / sizeof frags[0])], 1 + rndn(4));
    }
    /* sometimes a well-formed call */
    if (rndn(2)) {
        ctl(s, CALL_B);
        if (f == DI_CHAT_FORMAT_V31) {
            push_text(s, "tool", 2);
            ctl(s, SEP);
            push_text(s, "{\"a\": [1, \"\\n```\"]}", 3);
        } else {
            push_text(s, "function", 3);
            ctl(s, SEP);
            push_text(s, "tool\n```json\n{\"a\": [1, \"\\n```\"]}\n```", 3);
        }
        if (rndn(4)) ctl(s, CALL_E);
    }
    if (rndn(3)) ctl(s, rndn(2) ? EOS : EOT);
}

static void test_chunking_property(void) {
    const di_finish_reason ends[] = {DI_FINISH_STOP, DI_FINISH_LENGTH, DI_FINISH_ABORT, DI_FINISH_STOP_SEQUENCE};
    for (int iter = 0; iter < 300; iter++) {
        di_chat_format f = (di_chat_format)(iter % 3);
        di_outparse_config cfg = config(f, 1);
        cfg.starts_in_reasoning = (int)rndn(2);
        stream s = {0};
        random_stream(&s, f);
        di_outparse *p = run_all(&cfg, &s, ends[rndn(4)]);
        di_outparse_free(p);
        free(s.t);
    }
}

/* Random ids (any value, control or not) and random bytes: no crash, sane results. */
static void test_random_garbage(void) {
    for (int iter = 0; iter < 300; iter++) {
        di_outparse_config cfg = config((di_chat_format)(iter % 3), (int)rndn(2));
        cfg.starts_in_reasoning = (int)rndn(2);
        di_outparse *p = di_outparse_create(&cfg);
        evacc a;
        memset(&a, 0, sizeof a);
        size_t n = rndn(200);
        for (size_t i = 0; i < n; i++) {
            char b[8];
            size_t len = rndn(8);
            for (size_t k = 0; k < len; k++) b[k] = (char)rndn(256);
            int32_t id;
            switch (rndn(4)) {
            case 0: id = (int32_t)(128798 + rndn(17)); break;
            case 1: id = (int32_t)rndn(3); break;
            case 2: id = (int32_t)(rnd() & 0x7fffffff) * (rndn(2) ? 1 : -1); break;
            default: id = TEXT_ID;
            }
            if (rndn(3) == 0) di_outparse_feed_text(p, b, len);
            else di_outparse_feed(p, id, b, len);
            if (rndn(4) == 0) collect(p, &a);
        }
        di_outparse_finish(p, rndn(2) ? DI_FINISH_STOP : DI_FINISH_LENGTH, NULL);
        collect(p, &a);
        check_consistent(di_outparse_result(p), &a);
        evacc_free(&a);
        di_outparse_free(p);
    }
    di_outparse_free(NULL);
}

TEST_MAIN(test_v3_content_and_tools, test_r1_reasoning, test_v31_tools, test_text_lookalikes_and_fences,
          test_malformed_and_truncated, test_utf8, test_kmp, test_chunking_property, test_random_garbage)
