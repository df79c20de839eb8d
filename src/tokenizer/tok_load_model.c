/* tok_load_model.c - loads the "model" object of tokenizer.json: a BPE model with its vocab,
 * merges (as "a b" strings or ["a", "b"] pairs) and options (unk_token, fuse_unk,
 * byte_fallback, continuing_subword_prefix, end_of_word_suffix, ignore_merges, dropout).
 *
 * vocab and merges are scanned straight from the file text (tok_json.c) into the tokenizer's
 * tables; the small option fields go through jansson. Errors name the field and what was
 * expected. Semantics follow HF `tokenizers`: merge ranks are positions in the list (legacy
 * "#version" lines skipped), a later duplicate merge replaces an earlier one, and a merge whose
 * parts or result are not in the vocab is an error. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json_util.h"
#include "tokenizer/tok_internal.h"

typedef struct {
    di_tok_buf blob;                   /* vocab strings */
    uint32_t *off, *len, *id;       /* per entry */
    size_t n, cap;
} vocab_tmp;

static void vocab_tmp_free(vocab_tmp *v) {
    di_tok_buf_free(&v->blob);
    free(v->off);
    free(v->len);
    free(v->id);
}

static di_status parse_id(di_tok_json_cursor *c, uint32_t *out) {
    di_tok_json_skip_ws(c);
    const char *p = c->p;
    uint64_t v = 0;
    if (p >= c->end || *p < '0' || *p > '9') return di_tok_json_fail(c, "expected a non-negative integer token id");
    if (*p == '0' && p + 1 < c->end && p[1] >= '0' && p[1] <= '9') return di_tok_json_fail(c, "expected a token id without leading zeros");
    while (p < c->end && *p >= '0' && *p <= '9') {
        v = v * 10 + (uint64_t)(*p - '0');
        if (v > 0x7ffffffe) return di_tok_json_fail(c, "expected a token id below 2^31 - 1");
        p++;
    }
    if (p < c->end && (*p == '.' || *p == 'e' || *p == 'E')) { c->p = p; return di_tok_json_fail(c, "expected an integer token id"); }
    c->p = p;
    *out = (uint32_t)v;
    return DI_OK;
}

static di_status parse_vocab(di_tok_json_cursor *c, vocab_tmp *v) {
    DI_TRY(di_tok_json_expect(c, '{'));
    di_tok_json_skip_ws(c);
    if (c->p < c->end && *c->p == '}') { c->p++; return DI_OK; }
    DI_TRY(di_tok_buf_reserve(&v->blob, (size_t)(c->end - c->p) / 4)); /* avoid most regrowth */
    for (;;) {
        if (v->n == v->cap) {
            size_t cap = v->cap ? v->cap * 2 : 1024;
            uint32_t *o = realloc(v->off, cap * 4), *l = o ? realloc(v->len, cap * 4) : NULL;
            if (o) v->off = o;
            if (l) v->len = l;
            uint32_t *i = (o && l) ? realloc(v->id, cap * 4) : NULL;
            if (!i) return di_error(DI_ERR_NOMEM, "%s: out of memory reading model.vocab", c->where);
            v->id = i;
            v->cap = cap;
        }
        size_t start = v->blob.n;
        DI_TRY(di_tok_json_string_append(c, &v->blob));
        if (v->blob.n - start > 0xffffff) return di_tok_json_fail(c, "model.vocab: token longer than 16 MB");
        DI_TRY(di_tok_json_expect(c, ':'));
        uint32_t id = 0;
        DI_TRY(parse_id(c, &id));
        v->off[v->n] = (uint32_t)start;
        v->len[v->n] = (uint32_t)(v->blob.n - start);
        v->id[v->n] = id;
        v->n++;
        if (v->blob.n > 0x7fffffff) return di_error(DI_ERR_UNSUPPORTED, "%s: model.vocab larger than 2 GB", c->where);
        di_tok_json_skip_ws(c);
        if (c->p < c->end && *c->p == ',') { c->p++; continue; }
        if (c->p < c->end && *c->p == '}') { c->p++; return DI_OK; }
        return di_tok_json_fail(c, "model.vocab: expected ',' or '}'");
    }
}

/* Installs the model vocab as the tokenizer's id -> string tables and builds the map. */
static di_status install_vocab(di_tokenizer *t, vocab_tmp *v) {
    uint32_t n_ids = 0;
    for (size_t i = 0; i < v->n; i++)
        if (v->id[i] + 1 > n_ids) n_ids = v->id[i] + 1;
    if (di_tok_ids_too_sparse(n_ids, v->n))
        return di_error(DI_ERR_UNSUPPORTED, "%s: model.vocab: token id %u with only %zu tokens (ids far sparser than "
                        "0..n-1 are not supported)", t->path, n_ids - 1, v->n);
    t->n_model_vocab = (uint32_t)v->n;
    t->n_model_ids = n_ids;
    t->mstr_off = malloc((n_ids ? n_ids : 1) * sizeof(uint32_t));
    t->mstr_len = malloc((n_ids ? n_ids : 1) * sizeof(uint32_t));
    if (!t->mstr_off || !t->mstr_len) return di_error(DI_ERR_NOMEM, "%s: out of memory (vocab)", t->path);
    memset(t->mstr_len, 0xff, (n_ids ? n_ids : 1) * sizeof(uint32_t));
    for (size_t i = 0; i < v->n; i++) {
        uint32_t id = v->id[i];
        if (t->mstr_len[id] != UINT32_MAX)
            return di_error(DI_ERR_FORMAT, "%s: model.vocab: id %u is used by both '%.*s' and '%.*s'", t->path, id,
                            (int)t->mstr_len[id], v->blob.p + t->mstr_off[id], (int)v->len[i], v->blob.p + v->off[i]);
        t->mstr_off[id] = v->off[i];
        t->mstr_len[id] = v->len[i];
    }
    t->mstr_blob = v->blob.p ? v->blob.p : calloc(1, 1);
    v->blob.p = NULL;
    if (!t->mstr_blob) return di_error(DI_ERR_NOMEM, "%s: out of memory (vocab)", t->path);
    return di_tok_vocab_build_map(t);
}

typedef struct { int32_t a, b, m; } merge3;
typedef struct { merge3 *v; size_t n, cap; } merge_list;

static di_status merge_ids(di_tokenizer *t, const char *a, size_t na, const char *b, size_t nb, size_t index,
                           di_tok_buf *tmp, merge_list *out) {
    int32_t ia = di_tok_vocab_lookup(t, a, na), ib = di_tok_vocab_lookup(t, b, nb);
    if (ia < 0 || ib < 0)
        return di_error(DI_ERR_FORMAT, "%s: model.merges[%zu]: token '%.*s' is not in model.vocab", t->path, index,
                        ia < 0 ? (int)na : (int)nb, ia < 0 ? a : b);
    size_t plen = t->cont_prefix ? strlen(t->cont_prefix) : 0;
    if (plen && (nb < plen || memcmp(b, t->cont_prefix, plen) != 0))
        return di_error(DI_ERR_FORMAT, "%s: model.merges[%zu]: right part '%.*s' does not start with continuing_subword_prefix '%s'",
                        t->path, index, (int)nb, b, t->cont_prefix);
    tmp->n = 0;
    DI_TRY(di_tok_buf_put(tmp, a, na));
    DI_TRY(di_tok_buf_put(tmp, b + plen, nb - plen));
    int32_t im = di_tok_vocab_lookup(t, tmp->p, tmp->n);
    if (im < 0)
        return di_error(DI_ERR_FORMAT, "%s: model.merges[%zu]: merged token '%.*s' is not in model.vocab", t->path,
                        index, (int)tmp->n, tmp->p);
    if (out->n == out->cap) {
        size_t cap = out->cap ? out->cap * 2 : 4096;
        merge3 *v = realloc(out->v, cap * sizeof *v);
        if (!v) return di_error(DI_ERR_NOMEM, "%s: out of memory reading model.merges", t->path);
        out->v = v;
        out->cap = cap;
    }
    out->v[out->n++] = (merge3){ia, ib, im};
    return DI_OK;
}

/* Needs the vocab (and continuing_subword_prefix) already loaded. */
static di_status parse_merges(di_tokenizer *t, di_tok_json_cursor *c) {
    DI_TRY(di_tok_json_expect(c, '['));
    merge_list ml = {0};
    di_tok_buf s1 = {0}, s2 = {0}, tmp = {0};
    di_status st = DI_OK;
    int format = 0; /* 1 = "a b" strings, 2 = ["a", "b"] pairs */
    size_t index = 0;
    di_tok_json_skip_ws(c);
    if (c->p < c->end && *c->p == ']') c->p++;
    else for (;; index++) {
        di_tok_json_skip_ws(c);
        if (c->p >= c->end) { st = di_tok_json_fail(c, "model.merges: expected a merge"); break; }
        int kind = *c->p == '"' ? 1 : *c->p == '[' ? 2 : 0;
        if (!kind) { st = di_tok_json_fail(c, "model.merges: expected a string \"a b\" or a pair [\"a\", \"b\"]"); break; }
        if (format && kind != format) { st = di_tok_json_fail(c, "model.merges: strings and pairs mixed in one list"); break; }
        format = kind;
        if (kind == 1) {
            const char *s;
            size_t n;
            if ((st = di_tok_json_string_ref(c, &s1, &s, &n)) != DI_OK) break;
            if (!(n >= 8 && memcmp(s, "#version", 8) == 0)) { /* "#version" lines are skipped, as HF does */
                const char *sp = memchr(s, ' ', n);
                if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp + 1 - s))) {
                    st = di_error(DI_ERR_FORMAT, "%s: model.merges[%zu]: expected two tokens separated by one space, got '%.*s'",
                                  t->path, index, (int)n, s);
                    break;
                }
                if ((st = merge_ids(t, s, (size_t)(sp - s), sp + 1, n - (size_t)(sp + 1 - s), index, &tmp, &ml)) != DI_OK) break;
            }
        } else {
            const char *a, *b;
            size_t na, nb;
            if ((st = di_tok_json_expect(c, '[')) != DI_OK || (st = di_tok_json_string_ref(c, &s1, &a, &na)) != DI_OK ||
                (st = di_tok_json_expect(c, ',')) != DI_OK || (st = di_tok_json_string_ref(c, &s2, &b, &nb)) != DI_OK)
                break;
            if ((st = di_tok_json_expect(c, ']')) != DI_OK) {
                st = di_error_context(st, "model.merges[%zu]: expected a pair of two strings: ", index);
                break;
            }
            if ((st = merge_ids(t, a, na, b, nb, index, &tmp, &ml)) != DI_OK) break;
        }
        di_tok_json_skip_ws(c);
        if (c->p < c->end && *c->p == ',') { c->p++; continue; }
        if (c->p < c->end && *c->p == ']') { c->p++; break; }
        st = di_tok_json_fail(c, "model.merges: expected ',' or ']'");
        break;
    }
    /* ranks are positions among the merges kept; a later duplicate pair replaces the earlier */
    if (st == DI_OK) st = di_tok_merges_init(t, ml.n);
    for (size_t i = 0; i < ml.n && st == DI_OK; i++) st = di_tok_merges_add(t, ml.v[i].a, ml.v[i].b, (uint32_t)i, ml.v[i].m);
    free(ml.v);
    di_tok_buf_free(&s1);
    di_tok_buf_free(&s2);
    di_tok_buf_free(&tmp);
    return st;
}

static di_status opt_string_dup(json_t *o, const char *key, const char *where, char **out) {
    const char *s = NULL;
    DI_TRY(di_json_opt_string(o, key, where, &s));
    if (s) {
        *out = strdup(s);
        if (!*out) return di_error(DI_ERR_NOMEM, "out of memory");
    }
    return DI_OK;
}

/* Options other than vocab/merges, parsed from a jansson object holding just those fields. */
static di_status load_options(di_tokenizer *t, json_t *o, const char *where, char **unk) {
    const char *type = NULL;
    free(*unk);
    free(t->cont_prefix);
    free(t->end_suffix);
    *unk = t->cont_prefix = t->end_suffix = NULL;
    DI_TRY(di_json_opt_string(o, "type", where, &type));
    if (type && strcmp(type, "BPE") != 0)
        return di_error(DI_ERR_UNSUPPORTED, "%s: model type '%s' is not supported (only BPE)", where, type);
    double dropout = 0;
    DI_TRY(di_json_opt_double(o, "dropout", where, &dropout));
    if (dropout < 0 || dropout > 1)
        return di_error(DI_ERR_FORMAT, "%s: field 'dropout': expected a number in [0, 1], got %g", where, dropout);
    if (dropout > 0)
        return di_error(DI_ERR_UNSUPPORTED, "%s: BPE dropout %g is not supported (it makes encoding random)", where, dropout);
    DI_TRY(di_json_opt_bool(o, "fuse_unk", where, &t->fuse_unk));
    DI_TRY(di_json_opt_bool(o, "byte_fallback", where, &t->byte_fallback));
    DI_TRY(di_json_opt_bool(o, "ignore_merges", where, &t->ignore_merges));
    DI_TRY(opt_string_dup(o, "unk_token", where, unk));
    DI_TRY(opt_string_dup(o, "continuing_subword_prefix", where, &t->cont_prefix));
    DI_TRY(opt_string_dup(o, "end_of_word_suffix", where, &t->end_suffix));
    if (t->cont_prefix && !*t->cont_prefix) { free(t->cont_prefix); t->cont_prefix = NULL; }
    if (t->end_suffix && !*t->end_suffix) { free(t->end_suffix); t->end_suffix = NULL; }
    return DI_OK;
}

di_status di_tok_load_model(di_tokenizer *t, di_tok_json_cursor *cur) {
    di_tok_json_cursor c = *cur;
    const char *where = c.where;
    char fwhere[512];
    snprintf(fwhere, sizeof fwhere, "%s: model", where);
    di_tok_json_skip_ws(&c);
    if (c.p >= c.end || *c.p != '{') return di_tok_json_fail(&c, "model: expected an object");
    c.p++;
    vocab_tmp v = {0};
    di_tok_buf key = {0};
    json_t *opts = json_object();
    di_tok_json_cursor merges_at = {0};
    int have_vocab = 0, have_merges = 0, merges_done = 0;
    size_t opts_at_merges = 0;
    char *unk = NULL;
    di_status st = opts ? DI_OK : di_error(DI_ERR_NOMEM, "out of memory");
    di_tok_json_skip_ws(&c);
    if (st == DI_OK && c.p < c.end && *c.p == '}') c.p++;
    else while (st == DI_OK) {
        const char *k;
        size_t kn;
        if ((st = di_tok_json_string(&c, &key, &k, &kn)) != DI_OK) break;
        if ((st = di_tok_json_expect(&c, ':')) != DI_OK) break;
        di_tok_json_skip_ws(&c);
        if (!strcmp(k, "vocab")) {
            if (have_vocab) { st = di_error(DI_ERR_FORMAT, "%s: key 'vocab' appears twice", fwhere); break; }
            if ((st = parse_vocab(&c, &v)) != DI_OK) break;
            have_vocab = 1;
        } else if (!strcmp(k, "merges")) {
            if (have_merges) { st = di_error(DI_ERR_FORMAT, "%s: key 'merges' appears twice", fwhere); break; }
            merges_at = c;
            have_merges = 1;
            if (have_vocab) { /* the usual order: parse in place (again below if options follow) */
                if ((st = load_options(t, opts, fwhere, &unk)) != DI_OK || (st = install_vocab(t, &v)) != DI_OK ||
                    (st = parse_merges(t, &c)) != DI_OK)
                    break;
                merges_done = 1;
                opts_at_merges = json_object_size(opts);
            } else if ((st = di_tok_json_skip_value(&c)) != DI_OK) {
                break;
            }
        } else {
            const char *vs = c.p;
            if ((st = di_tok_json_skip_value(&c)) != DI_OK) break;
            json_error_t e;
            json_t *val = json_loadb(vs, (size_t)(c.p - vs), JSON_DECODE_ANY, &e);
            if (!val) { st = di_error(DI_ERR_FORMAT, "%s: field '%s': %s", fwhere, k, e.text); break; }
            json_object_set_new(opts, k, val);
        }
        di_tok_json_skip_ws(&c);
        if (c.p < c.end && *c.p == ',') { c.p++; continue; }
        if (c.p < c.end && *c.p == '}') { c.p++; break; }
        st = di_tok_json_fail(&c, "model: expected ',' or '}'");
    }
    if (st == DI_OK) st = load_options(t, opts, fwhere, &unk);
    if (st == DI_OK && (!have_vocab || !have_merges))
        st = di_error(DI_ERR_FORMAT, "%s: BPE model without '%s'", fwhere, have_vocab ? "merges" : "vocab");
    if (st == DI_OK && !merges_done) st = install_vocab(t, &v);
    /* merges depend on continuing_subword_prefix: parse (again) if options came after them */
    if (st == DI_OK && (!merges_done || json_object_size(opts) != opts_at_merges)) st = parse_merges(t, &merges_at);
    t->unk_id = -1;
    if (st == DI_OK && unk) {
        t->unk_id = di_tok_vocab_lookup(t, unk, strlen(unk));
        t->unk_token = unk;
        unk = NULL;
    }
    free(unk);
    vocab_tmp_free(&v);
    di_tok_buf_free(&key);
    json_decref(opts);
    if (st == DI_OK) *cur = c;
    return st;
}
