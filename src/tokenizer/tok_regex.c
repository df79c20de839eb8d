/* tok_regex.c - pre-tokenizer regexes: Oniguruma (Ruby syntax, as HF `tokenizers` uses) translated
 * to PCRE2 and compiled with the JIT.
 *
 * HF matches `Split` / `Replace` patterns with Oniguruma and Unicode 16 tables; PCRE2 has its own
 * (older) tables and a few syntax differences. The translation keeps the pattern's meaning:
 *   \p{X} \P{X} \p{^X} \s \S \d \D \w \W   -> HF's exact character sets (tok_unicode_data.c):
 *        PCRE2's own class plus the code points it lacks when PCRE2's Unicode version is the one
 *        the tables were measured against, else explicit ranges
 *   \h \H (Ruby: hex digit)  \v (vertical tab)  \uHHHH  {,n}  (?m) (Ruby: dot-all)
 * and rejects what PCRE2 cannot express (nested classes, class intersection, absent operator)
 * with an error naming the pattern offset. Compile options: UTF, UCP, MULTILINE (Ruby's ^ and $
 * are line anchors), newline = LF.
 *
 * Invariant: a compiled di_tok_regex is immutable and shared by all threads; matching state lives
 * in a per-thread di_tok_match. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "tokenizer/tok_internal.h"

/* ---- property names ---- */
static const struct { const char *alias, *name; } g_alias[] = {
    {"letter", "L"}, {"uppercaseletter", "Lu"}, {"lowercaseletter", "Ll"}, {"titlecaseletter", "Lt"},
    {"modifierletter", "Lm"}, {"otherletter", "Lo"}, {"mark", "M"}, {"combiningmark", "M"},
    {"nonspacingmark", "Mn"}, {"spacingmark", "Mc"}, {"enclosingmark", "Me"}, {"number", "N"},
    {"decimalnumber", "Nd"}, {"letternumber", "Nl"}, {"othernumber", "No"}, {"punctuation", "P"},
    {"connectorpunctuation", "Pc"}, {"dashpunctuation", "Pd"}, {"openpunctuation", "Ps"},
    {"closepunctuation", "Pe"}, {"initialpunctuation", "Pi"}, {"finalpunctuation", "Pf"},
    {"otherpunctuation", "Po"}, {"symbol", "S"}, {"mathsymbol", "Sm"}, {"currencysymbol", "Sc"},
    {"modifiersymbol", "Sk"}, {"othersymbol", "So"}, {"separator", "Z"}, {"spaceseparator", "Zs"},
    {"lineseparator", "Zl"}, {"paragraphseparator", "Zp"}, {"control", "Cc"}, {"cntrl", "Cc"},
    {"format", "Cf"}, {"privateuse", "Co"}, {"hani", "Han"}, {"hira", "Hiragana"}, {"kana", "Katakana"},
    {"hang", "Hangul"}, {"latn", "Latin"}, {"grek", "Greek"}, {"cyrl", "Cyrillic"}, {"arab", "Arabic"},
    {"hebr", "Hebrew"}, {"deva", "Devanagari"}, {"zyyy", "Common"},
};

/* Oniguruma property names are case-insensitive and ignore ' ', '_' and '-'. */
static const di_tok_uc_prop *lookup_prop(const char *s, size_t n) {
    char key[64];
    size_t k = 0;
    for (size_t i = 0; i < n && k + 1 < sizeof key; i++) {
        char c = s[i];
        if (c == ' ' || c == '_' || c == '-') continue;
        key[k++] = (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
    }
    key[k] = '\0';
    for (size_t i = 0; i < sizeof g_alias / sizeof g_alias[0]; i++)
        if (!strcmp(key, g_alias[i].alias)) return di_tok_uc_prop_find(g_alias[i].name, strlen(g_alias[i].name));
    /* canonical short names, matched case-insensitively */
    static const char *const names[] = {"L", "Lu", "Ll", "Lt", "Lm", "Lo", "M", "Mn", "Mc", "Me", "N", "Nd", "Nl",
                                        "No", "P", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "S", "Sm", "Sc", "Sk",
                                        "So", "Z", "Zs", "Zl", "Zp", "Cc", "Cf", "Co", "Han", "Hiragana", "Katakana",
                                        "Hangul", "Latin", "Greek", "Cyrillic", "Arabic", "Hebrew", "Thai",
                                        "Devanagari", "Common"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strlen(names[i]) == k && !strcasecmp(names[i], key)) return di_tok_uc_prop_find(names[i], k);
    return NULL;
}

static int pcre_tables_match(void) {
    static atomic_int cached = -1;
    int v = atomic_load(&cached);
    if (v >= 0) return v;
    char ver[64] = {0};
    pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, ver);
    v = strcmp(ver, di_tok_uc_pcre_unicode_version) == 0;
    atomic_store(&cached, v);
    return v;
}

static di_status put_cp(di_tok_buf *o, uint32_t cp) {
    char tmp[16];
    int n = snprintf(tmp, sizeof tmp, "\\x{%X}", cp);
    return di_tok_buf_put(o, tmp, (size_t)n);
}

static di_status put_ranges(di_tok_buf *o, const uint32_t *r, size_t n_pairs) {
    for (size_t i = 0; i < n_pairs; i++) {
        DI_TRY(put_cp(o, r[2 * i]));
        if (r[2 * i + 1] != r[2 * i]) {
            DI_TRY(di_tok_buf_put(o, "-", 1));
            DI_TRY(put_cp(o, r[2 * i + 1]));
        }
    }
    return DI_OK;
}

/* Complement of a range set over [0, 0x10FFFF] minus surrogates. */
static di_status put_complement(di_tok_buf *o, const uint32_t *r, size_t n_pairs) {
    uint32_t next = 0;
    for (size_t i = 0; i <= n_pairs; i++) {
        uint32_t lo = i < n_pairs ? r[2 * i] : 0x110000;
        if (lo > next) {
            uint32_t a = next, b = lo - 1;
            /* skip the surrogate block, which PCRE2 rejects in UTF mode */
            if (a <= 0xDFFF && b >= 0xD800) {
                if (a < 0xD800) { uint32_t p[2] = {a, 0xD7FF}; DI_TRY(put_ranges(o, p, 1)); }
                if (b > 0xDFFF) { uint32_t p[2] = {0xE000, b}; DI_TRY(put_ranges(o, p, 1)); }
            } else {
                uint32_t p[2] = {a, b};
                DI_TRY(put_ranges(o, p, 1));
            }
        }
        if (i < n_pairs) next = r[2 * i + 1] + 1;
    }
    return DI_OK;
}

/* Class items for property p go to `items`; code points HF has beyond PCRE2's own property go to
 * `extra` (as ranges), so the caller can test them in a separate pure-range class: PCRE2
 * rejects a character outside such a class with one min/max comparison, while a long range
 * list inside a class with \p{..} would be scanned for every non-matching character. */
static di_status put_prop_items(di_tok_buf *items, di_tok_buf *extra, const di_tok_uc_prop *p, int negated) {
    if (negated) return put_complement(items, p->ranges, p->n_ranges);
    if (p->superset && pcre_tables_match()) {
        DI_TRY(di_tok_buf_put(items, p->pcre_base, strlen(p->pcre_base)));
        return put_ranges(extra, p->extra, p->n_extra);
    }
    return put_ranges(items, p->ranges, p->n_ranges);
}

/* Emits a complete class from its items and extras: [items] when there are no extras, else
 * (?:[items]|[extras]) or, negated, (?:(?![extras])[^items]). */
static di_status put_class(di_tok_buf *o, const di_tok_buf *items, const di_tok_buf *extra, int negated) {
    if (!extra->n) {
        DI_TRY(di_tok_buf_put(o, negated ? "[^" : "[", negated ? 2 : 1));
        DI_TRY(di_tok_buf_put(o, items->p, items->n));
        return di_tok_buf_put(o, "]", 1);
    }
    if (negated) {
        DI_TRY(di_tok_buf_put(o, "(?:(?![", 7));
        DI_TRY(di_tok_buf_put(o, extra->p, extra->n));
        DI_TRY(di_tok_buf_put(o, "])[^", 4));
        DI_TRY(di_tok_buf_put(o, items->p, items->n));
        return di_tok_buf_put(o, "])", 2);
    }
    DI_TRY(di_tok_buf_put(o, "(?:[", 4));
    DI_TRY(di_tok_buf_put(o, items->p, items->n));
    DI_TRY(di_tok_buf_put(o, "]|[", 3));
    DI_TRY(di_tok_buf_put(o, extra->p, extra->n));
    return di_tok_buf_put(o, "])", 2);
}

typedef struct {
    di_tok_buf out;          /* the translated pattern */
    di_tok_buf items, extra; /* the class being translated */
    int in_class, negated;
} xlat;

/* A property: inside a class it adds to the class; outside it becomes a class of its own. */
static di_status put_prop(xlat *x, const di_tok_uc_prop *p, int negated) {
    if (x->in_class) return put_prop_items(&x->items, &x->extra, p, negated);
    di_tok_buf items = {0}, extra = {0};
    di_status st = put_prop_items(&items, &extra, p, 0);
    if (st == DI_OK) st = di_tok_buf_put(&items, "", 0);
    if (st == DI_OK) st = put_class(&x->out, &items, &extra, negated);
    di_tok_buf_free(&items);
    di_tok_buf_free(&extra);
    return st;
}

static di_status bad(const char *where, size_t off, const char *what) {
    return di_error(DI_ERR_UNSUPPORTED, "%s: regex: %s at pattern offset %zu", where, what, off);
}

static int is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

static size_t utf8_len(unsigned char c) { return c < 0x80 ? 1 : c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1; }

/* Translates one escape at s[i] == '\\'; returns the number of pattern bytes consumed (0 = error). */
static di_status translate_escape(const char *s, size_t n, size_t i, xlat *x, const char *where, size_t *used,
                                  int *uses_g) {
    int in_class = x->in_class;
    di_tok_buf *o = in_class ? &x->items : &x->out;
    if (i + 1 >= n) return bad(where, i, "pattern ends with a backslash");
    char e = s[i + 1];
    const di_tok_uc_prop *p;
    switch (e) {
    case 'p':
    case 'P': {
        if (i + 2 >= n || s[i + 2] != '{') return bad(where, i, "\\p without {name}");
        const char *close = memchr(s + i + 3, '}', n - i - 3);
        if (!close) return bad(where, i, "unterminated \\p{");
        const char *name = s + i + 3;
        size_t nlen = (size_t)(close - name);
        int neg = e == 'P';
        if (nlen && name[0] == '^') { neg = !neg; name++; nlen--; }
        *used = (size_t)(close + 1 - (s + i));
        p = lookup_prop(name, nlen);
        if (p) return put_prop(x, p, neg);
        /* a property we have no table for (e.g. a rare script): PCRE2's own definition */
        DI_TRY(di_tok_buf_put(o, neg ? "\\P{" : "\\p{", 3));
        DI_TRY(di_tok_buf_put(o, name, nlen));
        return di_tok_buf_put(o, "}", 1);
    }
    case 's': case 'S': case 'd': case 'D': case 'w': case 'W': {
        char key = (char)(e | 0x20);
        p = di_tok_uc_prop_find(&key, 1);
        if (!p) return di_error(DI_ERR_INTERNAL, "tokenizer: missing Unicode table for \\%c", key);
        *used = 2;
        return put_prop(x, p, e != key);
    }
    case 'h':
        *used = 2;
        return di_tok_buf_put(o, in_class ? "0-9a-fA-F" : "[0-9a-fA-F]", in_class ? 9 : 11);
    case 'H': {
        *used = 2;
        if (!in_class) return di_tok_buf_put(o, "[^0-9a-fA-F]", 12);
        static const uint32_t hex[] = {'0', '9', 'A', 'F', 'a', 'f'};
        return put_complement(o, hex, 3);
    }
    case 'v':
        *used = 2;
        return di_tok_buf_put(o, "\\x{B}", 5);
    case 'u': {
        if (i + 5 < n && is_hex(s[i + 2]) && is_hex(s[i + 3]) && is_hex(s[i + 4]) && is_hex(s[i + 5])) {
            *used = 6;
            DI_TRY(di_tok_buf_put(o, "\\x{", 3));
            DI_TRY(di_tok_buf_put(o, s + i + 2, 4));
            return di_tok_buf_put(o, "}", 1);
        }
        return bad(where, i, "\\u must be followed by 4 hex digits");
    }
    case 'G':
        *uses_g = 1;
        /* fall through */
    default: {
        size_t l = 1 + utf8_len((unsigned char)e);
        if (i + l > n) l = n - i;
        *used = l;
        return di_tok_buf_put(o, s + i, l);
    }
    }
}

di_status di_tok_regex_translate_ex(const char *s, size_t n, const char *where, char **out, size_t *out_len, int *uses_g) {
    xlat x = {0};
    di_status st = di_tok_buf_reserve(&x.out, n + 16);
    size_t i = 0;
    *uses_g = 0;
    while (st == DI_OK && i < n) {
        char c = s[i];
        size_t used = 1;
        di_tok_buf *o = x.in_class ? &x.items : &x.out;
        if (c == '\\') {
            st = translate_escape(s, n, i, &x, where, &used, uses_g);
        } else if (x.in_class) {
            if (c == ']') {
                x.in_class = 0;
                st = di_tok_buf_put(&x.items, "", 0);
                if (st == DI_OK) st = put_class(&x.out, &x.items, &x.extra, x.negated);
            } else if (c == '[') {
                if (i + 1 < n && s[i + 1] == ':') {
                    /* POSIX bracket class: HF's (Oniguruma's Unicode) set, as explicit ranges */
                    const char *end = NULL;
                    for (size_t j = i + 2; j + 1 < n; j++)
                        if (s[j] == ':' && s[j + 1] == ']') { end = s + j + 2; break; }
                    if (!end) {
                        st = bad(where, i, "unterminated POSIX class");
                    } else {
                        used = (size_t)(end - (s + i));
                        const char *nm = s + i + 2;
                        size_t nl = used - 4;
                        int neg = nl && nm[0] == '^';
                        char key[32];
                        const di_tok_uc_prop *p = NULL;
                        if (nl - (size_t)neg < 20) {
                            snprintf(key, sizeof key, "posix_%.*s", (int)(nl - (size_t)neg), nm + neg);
                            p = di_tok_uc_prop_find(key, strlen(key));
                        }
                        if (p) st = neg ? put_complement(o, p->ranges, p->n_ranges) : put_ranges(o, p->ranges, p->n_ranges);
                        else st = bad(where, i, "unknown POSIX class");
                    }
                } else {
                    st = bad(where, i, "nested character class (not supported)");
                }
            } else if (c == '&' && i + 1 < n && s[i + 1] == '&') {
                st = bad(where, i, "character class intersection '&&' (not supported)");
            } else {
                used = utf8_len((unsigned char)c);
                if (i + used > n) used = n - i;
                st = di_tok_buf_put(o, s + i, used);
            }
        } else if (c == '[') {
            x.in_class = 1;
            x.negated = 0;
            x.items.n = 0;
            x.extra.n = 0;
            if (i + 1 < n && s[i + 1] == '^') { x.negated = 1; used++; }
            /* a ']' right after '[' or '[^' is a literal in both syntaxes */
            if (i + used < n && s[i + used] == ']') { st = di_tok_buf_put(&x.items, "\\]", 2); used++; }
        } else if (c == '(' && i + 2 < n && s[i + 1] == '?') {
            size_t j = i + 2;
            if (s[j] == '~') { st = bad(where, i, "absent operator (?~...) (not supported)"); break; }
            /* option groups (?imx-imx) / (?imx-imx:...): Ruby's m is dot-all (PCRE2 s) */
            size_t k = j;
            while (k < n && (s[k] == 'i' || s[k] == 'm' || s[k] == 'x' || s[k] == '-')) k++;
            if (k > j && k < n && (s[k] == ':' || s[k] == ')')) {
                st = di_tok_buf_put(o, "(?", 2);
                for (size_t q = j; q < k && st == DI_OK; q++) st = di_tok_buf_put(o, s[q] == 'm' ? "s" : s + q, 1);
                used = k - i;
            } else {
                st = di_tok_buf_put(o, "(?", 2);
                used = 2;
            }
        } else if (c == '{' && i + 1 < n && s[i + 1] == ',') {
            /* Ruby {,n} = {0,n}; PCRE2 10.42 would read it as a literal */
            size_t j = i + 2;
            while (j < n && s[j] >= '0' && s[j] <= '9') j++;
            if (j > i + 2 && j < n && s[j] == '}') {
                st = di_tok_buf_put(o, "{0,", 3);
                if (st == DI_OK) st = di_tok_buf_put(o, s + i + 2, j - i - 1);
                used = j + 1 - i;
            } else {
                st = di_tok_buf_put(o, "\\{", 2);
            }
        } else {
            used = utf8_len((unsigned char)c);
            if (i + used > n) used = n - i;
            st = di_tok_buf_put(o, s + i, used);
        }
        i += used;
    }
    if (st == DI_OK && x.in_class) st = bad(where, n, "unterminated character class");
    if (st == DI_OK) st = di_tok_buf_put(&x.out, "", 0);
    di_tok_buf_free(&x.items);
    di_tok_buf_free(&x.extra);
    if (st != DI_OK) { di_tok_buf_free(&x.out); return st; }
    *out = x.out.p;
    *out_len = x.out.n;
    return DI_OK;
}

di_status di_tok_regex_translate(const char *pattern, size_t len, const char *where, char **out, size_t *out_len) {
    int g;
    return di_tok_regex_translate_ex(pattern, len, where, out, out_len, &g);
}

/* Escapes a literal string (HF "String" pattern) for PCRE2. */
static di_status escape_literal(const char *s, size_t n, char **out, size_t *out_len) {
    di_tok_buf o = {0};
    DI_TRY(di_tok_buf_reserve(&o, n * 2 + 1));
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x80 || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
            DI_TRY(di_tok_buf_put(&o, s + i, 1));
        } else {
            char tmp[12];
            int k = snprintf(tmp, sizeof tmp, "\\x{%X}", c);
            DI_TRY(di_tok_buf_put(&o, tmp, (size_t)k));
        }
    }
    *out = o.p ? o.p : strdup("");
    *out_len = o.n;
    return *out ? DI_OK : di_error(DI_ERR_NOMEM, "out of memory");
}

di_status di_tok_regex_compile(const char *pattern, size_t len, int literal, const char *where, di_tok_regex **out) {
    char *pc = NULL;
    size_t pn = 0;
    int uses_g = 0;
    DI_TRY(literal ? escape_literal(pattern, len, &pc, &pn) : di_tok_regex_translate_ex(pattern, len, where, &pc, &pn, &uses_g));
    pcre2_compile_context *cc = pcre2_compile_context_create(NULL);
    if (!cc) { free(pc); return di_error(DI_ERR_NOMEM, "out of memory"); }
    pcre2_set_newline(cc, PCRE2_NEWLINE_LF);
    pcre2_set_bsr(cc, PCRE2_BSR_UNICODE);
    int err;
    PCRE2_SIZE eoff;
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)pc, pn, PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &err, &eoff, cc);
    pcre2_compile_context_free(cc);
    if (!code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        di_status st = di_error(DI_ERR_FORMAT, "%s: regex '%.*s' does not compile: %s (translated pattern offset %zu)",
                                where, (int)(len > 200 ? 200 : len), pattern, (const char *)msg, (size_t)eoff);
        free(pc);
        return st;
    }
    free(pc);
    di_tok_regex *re = calloc(1, sizeof *re);
    if (!re) { pcre2_code_free(code); return di_error(DI_ERR_NOMEM, "out of memory"); }
    re->code = code;
    re->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
    uint32_t minlen = 0;
    pcre2_pattern_info(code, PCRE2_INFO_MINLENGTH, &minlen);
    re->can_be_empty = minlen == 0;
    re->anchored_g = uses_g;
    *out = re;
    return DI_OK;
}

void di_tok_regex_free(di_tok_regex *re) {
    if (!re) return;
    pcre2_code_free(re->code);
    free(re);
}

di_status di_tok_match_init(di_tok_match *m) {
    m->md = pcre2_match_data_create(1, NULL);
    m->mctx = pcre2_match_context_create(NULL);
    m->jstack = pcre2_jit_stack_create(32 * 1024, 16 * 1024 * 1024, NULL);
    if (!m->md || !m->mctx || !m->jstack) {
        di_tok_match_free(m);
        return di_error(DI_ERR_NOMEM, "tokenizer: out of memory (regex match data)");
    }
    pcre2_jit_stack_assign(m->mctx, NULL, m->jstack);
    return DI_OK;
}

void di_tok_match_free(di_tok_match *m) {
    pcre2_match_data_free(m->md);
    pcre2_match_context_free(m->mctx);
    pcre2_jit_stack_free(m->jstack);
    m->md = NULL;
    m->mctx = NULL;
    m->jstack = NULL;
}

int di_tok_regex_search(const di_tok_regex *re, di_tok_match *m, const char *subj, size_t len, size_t start, size_t *ms,
                     size_t *me) {
    int r = re->jit ? pcre2_jit_match(re->code, (PCRE2_SPTR)subj, len, start, PCRE2_NO_UTF_CHECK, m->md, m->mctx)
                    : pcre2_match(re->code, (PCRE2_SPTR)subj, len, start, PCRE2_NO_UTF_CHECK, m->md, m->mctx);
    if (r == PCRE2_ERROR_NOMATCH) return 0;
    if (r < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(r, msg, sizeof msg);
        di_error(DI_ERR_INTERNAL, "tokenizer: regex match failed at byte %zu: %s", start, (const char *)msg);
        return -1;
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(m->md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}

/* HF iterates matches with the `onig` crate's FindMatches: an empty match right where the
 * previous match ended is skipped by advancing one character, and iteration stops once the
 * search position passes the end. */
int di_tok_regex_next(const di_tok_regex *re, di_tok_match *m, const char *s, size_t n, di_tok_find_iter *it, size_t *ms,
                   size_t *me) {
    for (;;) {
        if (it->last_end > n) return 0;
        int r = di_tok_regex_search(re, m, s, n, it->last_end, ms, me);
        if (r <= 0) return r;
        if (*ms == *me && it->has_last && it->last_match_end == *me) {
            size_t step = 1;
            if (it->last_end < n) {
                unsigned char c = (unsigned char)s[it->last_end];
                step = c < 0x80 ? 1 : c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
            }
            it->last_end += step;
            continue;
        }
        it->last_end = *me;
        it->last_match_end = *me;
        it->has_last = 1;
        return 1;
    }
}
