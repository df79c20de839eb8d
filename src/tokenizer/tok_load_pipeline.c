/* tok_load_pipeline.c - reads the pipeline components of tokenizer.json (parsed by jansson):
 * normalizer, pre_tokenizer, post_processor and decoder, into the tokenizer's flat lists.
 *
 * Supported (anything else is DI_ERR_UNSUPPORTED naming the component and its JSON path):
 *   normalizer:     Sequence, NFC, NFD, NFKC, NFKD, Lowercase, Replace, Prepend, Strip
 *   pre_tokenizer:  Sequence, Split (String/Regex, every behavior, invert), Digits, Whitespace,
 *                   WhitespaceSplit, ByteLevel (with or without its regex; must come last)
 *   post_processor: ByteLevel, TemplateProcessing, RobertaProcessing, BertProcessing, Sequence
 *   decoder:        ByteLevel (alone or as the only member of a Sequence), none
 * Nested Sequences are flattened, which is what HF's sequential application amounts to. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json_util.h"
#include "tokenizer/tok_internal.h"

#define GPT2_PATTERN "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

static di_status type_of(json_t *v, const char *where, const char **type) {
    if (!json_is_object(v)) return di_error(DI_ERR_FORMAT, "%s: expected an object, got %s", where, di_json_type_name(v));
    return di_json_req_string(v, "type", where, type);
}

static di_status pattern_of(json_t *v, const char *where, di_tok_regex **re) {
    json_t *p = json_object_get(v, "pattern");
    char w[600];
    snprintf(w, sizeof w, "%s.pattern", where);
    if (!json_is_object(p)) return di_error(DI_ERR_FORMAT, "%s: expected {\"String\": ...} or {\"Regex\": ...}", w);
    json_t *s = json_object_get(p, "String"), *r = json_object_get(p, "Regex");
    json_t *x = s ? s : r;
    if (!x || !json_is_string(x) || (s && r))
        return di_error(DI_ERR_FORMAT, "%s: expected exactly one of \"String\" or \"Regex\" with a string value", w);
    return di_tok_regex_compile(json_string_value(x), json_string_length(x), s != NULL, w, re);
}

/* ---- normalizer ---- */
static di_status add_norm(di_tokenizer *t, di_tok_norm n) {
    di_tok_norm *v = realloc(t->norms, (t->n_norms + 1) * sizeof *v);
    if (!v) return di_error(DI_ERR_NOMEM, "out of memory");
    t->norms = v;
    t->norms[t->n_norms++] = n;
    return DI_OK;
}

static di_status dup_str(json_t *v, const char *key, const char *where, char **out, size_t *len) {
    const char *s;
    DI_TRY(di_json_req_string(v, key, where, &s));
    json_t *j = json_object_get(v, key);
    *len = json_string_length(j);
    *out = malloc(*len + 1);
    if (!*out) return di_error(DI_ERR_NOMEM, "out of memory");
    memcpy(*out, s, *len + 1);
    return DI_OK;
}

static di_status normalizer_rec(di_tokenizer *t, json_t *v, const char *where, int depth) {
    if (json_is_null(v)) return DI_OK;
    if (depth > 16) return di_error(DI_ERR_UNSUPPORTED, "%s: Sequence nested too deeply", where);
    const char *type;
    DI_TRY(type_of(v, where, &type));
    di_tok_norm n = {0};
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(v, "normalizers");
        if (!json_is_array(list)) return di_error(DI_ERR_FORMAT, "%s: field 'normalizers': expected an array", where);
        for (size_t i = 0; i < json_array_size(list); i++) {
            char w[600];
            snprintf(w, sizeof w, "%s.normalizers[%zu]", where, i);
            DI_TRY(normalizer_rec(t, json_array_get(list, i), w, depth + 1));
        }
        return DI_OK;
    }
    if (!strcmp(type, "NFC")) n.kind = DI_TOK_NORM_NFC;
    else if (!strcmp(type, "NFD")) n.kind = DI_TOK_NORM_NFD;
    else if (!strcmp(type, "NFKC")) n.kind = DI_TOK_NORM_NFKC;
    else if (!strcmp(type, "NFKD")) n.kind = DI_TOK_NORM_NFKD;
    else if (!strcmp(type, "Lowercase")) n.kind = DI_TOK_NORM_LOWERCASE;
    else if (!strcmp(type, "Replace")) {
        n.kind = DI_TOK_NORM_REPLACE;
        DI_TRY(dup_str(v, "content", where, &n.str, &n.str_len));
        di_status st = pattern_of(v, where, &n.re);
        if (st != DI_OK) { free(n.str); return st; }
    } else if (!strcmp(type, "Prepend")) {
        n.kind = DI_TOK_NORM_PREPEND;
        DI_TRY(dup_str(v, "prepend", where, &n.str, &n.str_len));
    } else if (!strcmp(type, "Strip")) {
        n.kind = DI_TOK_NORM_STRIP;
        n.left = n.right = 1;
        DI_TRY(di_json_opt_bool(v, "strip_left", where, &n.left));
        DI_TRY(di_json_opt_bool(v, "strip_right", where, &n.right));
    } else {
        return di_error(DI_ERR_UNSUPPORTED, "%s: normalizer type '%s' is not supported", where, type);
    }
    di_status st = add_norm(t, n);
    if (st != DI_OK) { free(n.str); di_tok_regex_free(n.re); }
    return st;
}

di_status di_tok_load_normalizer(di_tokenizer *t, json_t *v, const char *where) {
    return v ? normalizer_rec(t, v, where, 0) : DI_OK;
}

/* ---- pre-tokenizer ---- */
static di_status add_stage(di_tokenizer *t, di_tok_stage s) {
    di_tok_stage *v = realloc(t->stages, (t->n_stages + 1) * sizeof *v);
    if (!v) { di_tok_regex_free(s.re); return di_error(DI_ERR_NOMEM, "out of memory"); }
    t->stages = v;
    t->stages[t->n_stages++] = s;
    return DI_OK;
}

static di_status behavior_of(json_t *v, const char *where, di_tok_split_behavior *b) {
    const char *s;
    DI_TRY(di_json_req_string(v, "behavior", where, &s));
    if (!strcmp(s, "Removed")) *b = DI_TOK_SPLIT_REMOVED;
    else if (!strcmp(s, "Isolated")) *b = DI_TOK_SPLIT_ISOLATED;
    else if (!strcmp(s, "MergedWithPrevious")) *b = DI_TOK_SPLIT_MERGED_PREV;
    else if (!strcmp(s, "MergedWithNext")) *b = DI_TOK_SPLIT_MERGED_NEXT;
    else if (!strcmp(s, "Contiguous")) *b = DI_TOK_SPLIT_CONTIGUOUS;
    else return di_error(DI_ERR_FORMAT, "%s: field 'behavior': unknown value '%s'", where, s);
    return DI_OK;
}

static di_status pretok_rec(di_tokenizer *t, json_t *v, const char *where, int depth, int last) {
    if (json_is_null(v)) return DI_OK;
    if (depth > 16) return di_error(DI_ERR_UNSUPPORTED, "%s: Sequence nested too deeply", where);
    const char *type;
    DI_TRY(type_of(v, where, &type));
    if (t->byte_level)
        return di_error(DI_ERR_UNSUPPORTED, "%s: pre_tokenizer '%s' after ByteLevel is not supported (ByteLevel must be last)",
                        where, type);
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(v, "pretokenizers");
        if (!json_is_array(list)) return di_error(DI_ERR_FORMAT, "%s: field 'pretokenizers': expected an array", where);
        size_t n = json_array_size(list);
        for (size_t i = 0; i < n; i++) {
            char w[600];
            snprintf(w, sizeof w, "%s.pretokenizers[%zu]", where, i);
            DI_TRY(pretok_rec(t, json_array_get(list, i), w, depth + 1, last && i + 1 == n));
        }
        return DI_OK;
    }
    di_tok_stage s = {0};
    if (!strcmp(type, "Split")) {
        s.kind = DI_TOK_ST_SPLIT;
        DI_TRY(behavior_of(v, where, &s.behavior));
        DI_TRY(di_json_opt_bool(v, "invert", where, &s.invert));
        DI_TRY(pattern_of(v, where, &s.re));
        return add_stage(t, s);
    }
    if (!strcmp(type, "Digits")) {
        int individual = 0;
        DI_TRY(di_json_opt_bool(v, "individual_digits", where, &individual));
        s.kind = DI_TOK_ST_CHARS;
        s.pred = DI_TOK_PRED_NUMERIC;
        s.behavior = individual ? DI_TOK_SPLIT_ISOLATED : DI_TOK_SPLIT_CONTIGUOUS;
        return add_stage(t, s);
    }
    if (!strcmp(type, "WhitespaceSplit")) {
        s.kind = DI_TOK_ST_CHARS;
        s.pred = DI_TOK_PRED_WHITESPACE;
        s.behavior = DI_TOK_SPLIT_REMOVED;
        return add_stage(t, s);
    }
    if (!strcmp(type, "Whitespace")) { /* \w+|[^\w\s]+ kept, the rest removed */
        s.kind = DI_TOK_ST_WORDS;
        s.behavior = DI_TOK_SPLIT_REMOVED;
        s.invert = 1;
        return add_stage(t, s);
    }
    if (!strcmp(type, "ByteLevel")) {
        int prefix = 1, use_regex = 1;
        DI_TRY(di_json_opt_bool(v, "add_prefix_space", where, &prefix));
        DI_TRY(di_json_opt_bool(v, "use_regex", where, &use_regex));
        if (prefix) DI_TRY(add_stage(t, (di_tok_stage){.kind = DI_TOK_ST_PREFIX_SPACE}));
        if (use_regex) {
            s.kind = DI_TOK_ST_SPLIT;
            s.behavior = DI_TOK_SPLIT_ISOLATED;
            DI_TRY(di_tok_regex_compile(GPT2_PATTERN, strlen(GPT2_PATTERN), 0, where, &s.re));
            DI_TRY(add_stage(t, s));
        }
        t->byte_level = 1;
        return DI_OK;
    }
    return di_error(DI_ERR_UNSUPPORTED, "%s: pre_tokenizer type '%s' is not supported", where, type);
}

di_status di_tok_load_pre_tokenizer(di_tokenizer *t, json_t *v, const char *where) {
    return v ? pretok_rec(t, v, where, 0, 1) : DI_OK;
}

/* ---- post-processor ---- */
static di_status ids_cat(int32_t **v, size_t *n, const int32_t *add, size_t k, int front) {
    if (k == 0) return DI_OK;
    int32_t *r = realloc(*v, (*n + k + 1) * sizeof *r);
    if (!r) return di_error(DI_ERR_NOMEM, "out of memory");
    if (front) {
        memmove(r + k, r, *n * sizeof *r);
        memcpy(r, add, k * sizeof *r);
    } else {
        memcpy(r + *n, add, k * sizeof *r);
    }
    *v = r;
    *n += k;
    return DI_OK;
}

static di_status pair_id(json_t *v, const char *key, const char *where, int32_t *id) {
    json_t *p = json_object_get(v, key);
    if (!json_is_array(p) || json_array_size(p) != 2 || !json_is_integer(json_array_get(p, 1)))
        return di_error(DI_ERR_FORMAT, "%s: field '%s': expected [\"token\", id]", where, key);
    *id = (int32_t)json_integer_value(json_array_get(p, 1));
    return DI_OK;
}

/* Template items before the sequence "A" go in front, those after it at the back. */
static di_status template_ids(json_t *v, const char *where, int32_t **pre, size_t *npre, int32_t **post, size_t *npost) {
    json_t *single = json_object_get(v, "single"), *specials = json_object_get(v, "special_tokens");
    if (!json_is_array(single)) return di_error(DI_ERR_FORMAT, "%s: field 'single': expected an array", where);
    int seen_a = 0;
    for (size_t i = 0; i < json_array_size(single); i++) {
        json_t *it = json_array_get(single, i);
        json_t *sp = json_object_get(it, "SpecialToken"), *seq = json_object_get(it, "Sequence");
        if (seq) {
            const char *id;
            DI_TRY(di_json_req_string(seq, "id", where, &id));
            if (strcmp(id, "A") != 0 || seen_a)
                return di_error(DI_ERR_UNSUPPORTED, "%s: single template sequence '%s' is not supported (only one 'A')", where, id);
            seen_a = 1;
            continue;
        }
        const char *name;
        if (!sp || di_json_req_string(sp, "id", where, &name) != DI_OK)
            return di_error(DI_ERR_FORMAT, "%s: single[%zu]: expected {\"SpecialToken\": {\"id\": ...}} or {\"Sequence\": ...}", where, i);
        json_t *def = json_object_get(specials, name);
        json_t *ids = json_object_get(def, "ids");
        if (!json_is_array(ids))
            return di_error(DI_ERR_FORMAT, "%s: special_tokens: no entry with 'ids' for '%s'", where, name);
        for (size_t k = 0; k < json_array_size(ids); k++) {
            json_t *x = json_array_get(ids, k);
            if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > INT32_MAX)
                return di_error(DI_ERR_FORMAT, "%s: special_tokens['%s'].ids: expected non-negative integers", where, name);
            int32_t id = (int32_t)json_integer_value(x);
            DI_TRY(seen_a ? ids_cat(post, npost, &id, 1, 0) : ids_cat(pre, npre, &id, 1, 0));
        }
    }
    if (!seen_a) return di_error(DI_ERR_FORMAT, "%s: single template has no sequence 'A'", where);
    return DI_OK;
}

static di_status post_rec(di_tokenizer *t, json_t *v, const char *where, int depth) {
    if (json_is_null(v)) return DI_OK;
    if (depth > 16) return di_error(DI_ERR_UNSUPPORTED, "%s: Sequence nested too deeply", where);
    const char *type;
    DI_TRY(type_of(v, where, &type));
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(v, "processors");
        if (!json_is_array(list)) return di_error(DI_ERR_FORMAT, "%s: field 'processors': expected an array", where);
        for (size_t i = 0; i < json_array_size(list); i++) {
            char w[600];
            snprintf(w, sizeof w, "%s.processors[%zu]", where, i);
            DI_TRY(post_rec(t, json_array_get(list, i), w, depth + 1));
        }
        return DI_OK;
    }
    if (!strcmp(type, "ByteLevel")) return DI_OK; /* only adjusts offsets */
    int32_t *pre = NULL, *post = NULL;
    size_t npre = 0, npost = 0;
    di_status st;
    if (!strcmp(type, "TemplateProcessing")) {
        st = template_ids(v, where, &pre, &npre, &post, &npost);
    } else if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
        int32_t cls, sep;
        st = pair_id(v, "cls", where, &cls);
        if (st == DI_OK) st = pair_id(v, "sep", where, &sep);
        if (st == DI_OK) st = ids_cat(&pre, &npre, &cls, 1, 0);
        if (st == DI_OK) st = ids_cat(&post, &npost, &sep, 1, 0);
    } else {
        return di_error(DI_ERR_UNSUPPORTED, "%s: post_processor type '%s' is not supported", where, type);
    }
    /* each processor wraps what the previous ones produced */
    if (st == DI_OK) st = ids_cat(&t->pre_ids, &t->n_pre, pre, npre, 1);
    if (st == DI_OK) st = ids_cat(&t->post_ids, &t->n_post, post, npost, 0);
    if (st == DI_OK) t->post_adds = 1;
    free(pre);
    free(post);
    return st;
}

di_status di_tok_load_post_processor(di_tokenizer *t, json_t *v, const char *where) {
    return v ? post_rec(t, v, where, 0) : DI_OK;
}

/* ---- decoder ---- */
di_status di_tok_load_decoder(di_tokenizer *t, json_t *v, const char *where) {
    t->decoder = DI_TOK_DEC_NONE;
    if (!v || json_is_null(v)) return DI_OK;
    const char *type;
    DI_TRY(type_of(v, where, &type));
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(v, "decoders");
        if (json_is_array(list) && json_array_size(list) == 1) {
            char w[600];
            snprintf(w, sizeof w, "%s.decoders[0]", where);
            return di_tok_load_decoder(t, json_array_get(list, 0), w);
        }
        return di_error(DI_ERR_UNSUPPORTED, "%s: decoder Sequence is supported only with a single ByteLevel member", where);
    }
    if (!strcmp(type, "ByteLevel")) { t->decoder = DI_TOK_DEC_BYTELEVEL; return DI_OK; }
    return di_error(DI_ERR_UNSUPPORTED, "%s: decoder type '%s' is not supported", where, type);
}
