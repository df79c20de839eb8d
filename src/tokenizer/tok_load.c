/* tok_load.c - di_tokenizer_load / di_tokenizer_free and the read-only accessors.
 *
 * Loading: tokenizer.json is read whole and its top-level object scanned with the fast JSON
 * scanner; "model" (vocab + merges, the bulk of the file) is read directly into tables
 * (tok_load_model.c), the other components are parsed by jansson (tok_load_pipeline.c) in the
 * order their dependencies need: model, normalizer, added_tokens, pre_tokenizer,
 * post_processor, decoder. Then tokenizer_config.json (optional) gives BOS/EOS, add_bos_token /
 * add_eos_token and the chat template (chat_template.jinja wins when present, as in
 * transformers).
 *
 * Added-token ids follow HF: a token whose content is in the model vocab takes that id, others
 * get the next id after the vocab. A different id in tokenizer.json is replaced (with a
 * warning) as HF does, unless that id already belongs to another vocab token (then HF's tables
 * become inconsistent and the file is refused). */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/hash.h"
#include "core/json_util.h"
#include "core/log.h"
#include "core/mmap_file.h"
#include "core/utf8.h"
#include "tokenizer/tok_internal.h"

#define MAX_FILE (2ull << 30)

typedef struct { const char *name; const char *at; size_t len; } span;

static di_status parse_span(const span *s, const char *where, json_t **out) {
    json_error_t e;
    *out = json_loadb(s->at, s->len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &e);
    if (!*out) return di_error(DI_ERR_FORMAT, "%s: field '%s': invalid JSON at line %d column %d: %s", where, s->name,
                               e.line, e.column, e.text);
    return DI_OK;
}

/* ---- added tokens ---- */
static di_status load_added(di_tokenizer *t, json_t *arr, const char *where) {
    if (!arr || json_is_null(arr)) return DI_OK;
    if (!json_is_array(arr)) return di_error(DI_ERR_FORMAT, "%s: field 'added_tokens': expected an array", where);
    size_t n = json_array_size(arr);
    t->added = calloc(n ? n : 1, sizeof *t->added);
    if (!t->added) return di_error(DI_ERR_NOMEM, "out of memory");
    di_strmap *seen = di_strmap_create(n);
    if (!seen) return di_error(DI_ERR_NOMEM, "out of memory");
    di_status st = DI_OK;
    int64_t max_added = -1;
    for (size_t i = 0; i < n && st == DI_OK; i++) {
        json_t *o = json_array_get(arr, i);
        char w[512];
        snprintf(w, sizeof w, "%s: added_tokens[%zu]", where, i);
        if (!json_is_object(o)) { st = di_error(DI_ERR_FORMAT, "%s: expected an object", w); break; }
        const char *content;
        int64_t id;
        int single = 0, lstrip = 0, rstrip = 0, normalized = 1, special = 0;
        if ((st = di_json_req_string(o, "content", w, &content)) != DI_OK || (st = di_json_req_int(o, "id", w, &id)) != DI_OK ||
            (st = di_json_opt_bool(o, "single_word", w, &single)) != DI_OK ||
            (st = di_json_opt_bool(o, "lstrip", w, &lstrip)) != DI_OK ||
            (st = di_json_opt_bool(o, "rstrip", w, &rstrip)) != DI_OK ||
            (st = di_json_opt_bool(o, "normalized", w, &normalized)) != DI_OK ||
            (st = di_json_opt_bool(o, "special", w, &special)) != DI_OK)
            break;
        size_t len = json_string_length(json_object_get(o, "content"));
        if (len == 0) continue; /* HF ignores empty added tokens */
        if (di_strmap_get(seen, content, len, NULL)) {
            st = di_error(DI_ERR_UNSUPPORTED, "%s: content '%s' appears twice in added_tokens", w, content);
            break;
        }
        /* HF's id: the vocab id if the content is in the model vocab, else the next free id */
        int32_t vid = di_tok_vocab_lookup(t, content, len);
        int64_t want = vid >= 0 ? vid : (max_added < 0 ? t->n_model_vocab
                                         : (max_added >= t->n_model_vocab ? max_added + 1 : t->n_model_vocab));
        if (id != want) {
            /* HF renumbers (with a warning); when the new id already belongs to another vocab token
             * HF's own tables end up inconsistent, so such files are refused */
            if (vid < 0 && want < t->n_model_ids && t->mstr_len[want] != UINT32_MAX) {
                st = di_error(DI_ERR_UNSUPPORTED, "%s: '%s' has id %lld, but Hugging Face tokenizers would give it id %lld, "
                              "which is already the vocab token '%.*s' (inconsistent added token ids are not supported)",
                              w, content, (long long)id, (long long)want, (int)t->mstr_len[want], t->mstr_blob + t->mstr_off[want]);
                break;
            }
            DI_LOG_W("%s: '%s' has id %lld; using id %lld as Hugging Face tokenizers does", w, content, (long long)id,
                     (long long)want);
            id = want;
        }
        if (want > max_added) max_added = want;
        di_tok_added *a = &t->added[t->n_added];
        a->content = malloc(len + 1);
        if (!a->content) { st = di_error(DI_ERR_NOMEM, "out of memory"); break; }
        memcpy(a->content, content, len + 1);
        a->len = (uint32_t)len;
        a->id = (int32_t)id;
        a->single_word = (uint8_t)single;
        a->lstrip = (uint8_t)lstrip;
        a->rstrip = (uint8_t)rstrip;
        a->normalized = (uint8_t)normalized;
        a->special = (uint8_t)special;
        t->n_added++;
        if (di_strmap_put(seen, content, len, (int64_t)(t->n_added - 1)) != 0) st = di_error(DI_ERR_NOMEM, "out of memory");
    }
    t->added_map = seen;
    return st;
}

/* The normalized form of each normalized=true added token: it is what HF matches in the
 * normalized text and what it returns when decoding the token. */
static di_status added_patterns(di_tokenizer *t) {
    di_tok_ws *ws = NULL;
    di_status st = DI_OK;
    for (size_t i = 0; i < t->n_added && st == DI_OK; i++) {
        di_tok_added *a = &t->added[i];
        if (!a->normalized || !t->n_norms) {
            a->pattern = a->content;
            a->plen = a->len;
            continue;
        }
        if (!ws && !(ws = di_tok_ws_acquire(t))) { st = di_error(DI_ERR_NOMEM, "out of memory"); break; }
        st = di_tok_normalize(t, a->content, a->len, ws, &ws->norm);
        if (st != DI_OK) break;
        a->pattern = malloc(ws->norm.n + 1);
        if (!a->pattern) { st = di_error(DI_ERR_NOMEM, "out of memory"); break; }
        memcpy(a->pattern, ws->norm.p, ws->norm.n);
        a->pattern[ws->norm.n] = '\0';
        a->plen = (uint32_t)ws->norm.n;
    }
    di_tok_ws_release(t, ws);
    return st;
}

/* Tries: special tokens first, then the others (HF's order); normalized tokens are matched in
 * their normalized form, and one that normalizes to nothing never matches. */
static di_status build_tries(di_tokenizer *t) {
    di_tok_trie_init(&t->raw_trie);
    di_tok_trie_init(&t->norm_trie);
    di_tok_trie_init(&t->empty_trie);
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < t->n_added; i++) {
            di_tok_added *a = &t->added[i];
            if (a->special != (pass == 0)) continue;
            DI_TRY(di_tok_trie_add(a->normalized ? &t->norm_trie : &t->raw_trie, a->pattern, a->plen, (int32_t)i));
        }
    }
    return DI_OK;
}

/* ---- id tables ---- */
static di_status build_tables(di_tokenizer *t) {
    uint32_t n_ids = t->n_model_ids;
    for (size_t i = 0; i < t->n_added; i++)
        if ((uint32_t)t->added[i].id + 1 > n_ids) n_ids = (uint32_t)t->added[i].id + 1;
    if (di_tok_ids_too_sparse(n_ids, (uint64_t)t->n_model_vocab + t->n_added))
        return di_error(DI_ERR_UNSUPPORTED, "%s: added_tokens: token id %u with only %zu tokens in all (ids far sparser "
                        "than 0..n-1 are not supported)", t->path, n_ids - 1, (size_t)t->n_model_vocab + t->n_added);
    t->n_ids = n_ids;
    size_t n = n_ids ? n_ids : 1;
    t->str_off = malloc(n * 4);
    t->str_len = malloc(n * 4);
    t->dec_off = malloc(n * 4);
    t->dec_len = malloc(n * 4);
    t->id_flags = calloc(n, 1);
    if (!t->str_off || !t->str_len || !t->dec_off || !t->dec_len || !t->id_flags) return di_error(DI_ERR_NOMEM, "out of memory");
    memset(t->str_len, 0xff, n * 4);
    di_tok_buf sb = {0}, db = {0};
    di_status st = DI_OK;
    for (uint32_t id = 0; id < t->n_model_ids && st == DI_OK; id++) {
        if (t->mstr_len[id] == UINT32_MAX) continue;
        t->str_off[id] = (uint32_t)sb.n;
        t->str_len[id] = t->mstr_len[id];
        t->id_flags[id] |= DI_TOK_ID_MODEL;
        st = di_tok_buf_put(&sb, t->mstr_blob + t->mstr_off[id], t->mstr_len[id]);
        if (st == DI_OK) st = di_tok_buf_put(&sb, "", 1); /* NUL-terminated for di_tokenizer_token_str */
    }
    for (size_t i = 0; i < t->n_added && st == DI_OK; i++) {
        di_tok_added *a = &t->added[i];
        t->str_off[a->id] = (uint32_t)sb.n;
        t->str_len[a->id] = a->plen;
        t->id_flags[a->id] |= DI_TOK_ID_ADDED;
        st = di_tok_buf_put(&sb, a->pattern, a->plen);
        if (st == DI_OK) st = di_tok_buf_put(&sb, "", 1);
    }
    /* HF skips a token when decoding with skip_special_tokens if its string (as decoded) is the
     * content of a special added token */
    di_strmap *specials = st == DI_OK ? di_strmap_create(t->n_added) : NULL;
    if (st == DI_OK && !specials) st = di_error(DI_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < t->n_added && st == DI_OK; i++)
        if (t->added[i].special && di_strmap_put(specials, t->added[i].content, t->added[i].len, 1) != 0)
            st = di_error(DI_ERR_NOMEM, "out of memory");
    for (uint32_t id = 0; id < n_ids && st == DI_OK && t->n_added; id++)
        if (t->str_len[id] != UINT32_MAX && di_strmap_get(specials, sb.p + t->str_off[id], t->str_len[id], NULL))
            t->id_flags[id] |= DI_TOK_ID_SPECIAL;
    di_strmap_free(specials);
    /* ByteLevel decoding of every token: characters back to bytes, or the UTF-8 itself when
     * a character is outside the byte alphabet */
    if (st == DI_OK) st = di_tok_buf_reserve(&db, sb.n);
    for (uint32_t id = 0; id < n_ids && st == DI_OK; id++) {
        t->dec_off[id] = (uint32_t)db.n;
        t->dec_len[id] = 0;
        if (t->str_len[id] == UINT32_MAX) continue;
        const unsigned char *s = (const unsigned char *)sb.p + t->str_off[id];
        size_t len = t->str_len[id], i = 0;
        if ((st = di_tok_buf_reserve(&db, len)) != DI_OK) break;
        char *o = db.p + db.n;
        size_t k = 0;
        while (i < len) {
            uint32_t cp = s[i];
            int l = 1;
            if (cp >= 0x80 && !(l = di_tok_utf8_next(s + i, len - i, &cp))) break;
            int b = di_tok_bytelevel_byte(cp);
            if (b < 0) break;
            o[k++] = (char)b;
            i += (size_t)l;
        }
        if (i < len) { memcpy(o, s, len); k = len; } /* a character outside the byte alphabet */
        db.n += k;
        t->dec_len[id] = (uint32_t)k;
        if (db.n > 0xffffffffu) st = di_error(DI_ERR_UNSUPPORTED, "%s: vocabulary text larger than 4 GB", t->path);
    }
    if (st == DI_OK && !sb.p) st = di_tok_buf_put(&sb, "", 0);
    if (st == DI_OK && !db.p) st = di_tok_buf_put(&db, "", 0);
    t->str_blob = sb.p;
    t->dec_blob = db.p;
    if (st != DI_OK) return st;
    /* byte-level symbols and byte fallback tokens */
    for (int b = 0; b < 256; b++) {
        uint32_t cp = di_tok_bytelevel_char((uint8_t)b);
        t->bl_len[b] = (uint8_t)di_utf8_encode(cp, t->bl_str[b]);
        t->byte_id[b] = di_tok_vocab_lookup(t, t->bl_str[b], t->bl_len[b]);
        char fb[8];
        snprintf(fb, sizeof fb, "<0x%02X>", b);
        t->fallback_id[b] = di_tok_vocab_lookup(t, fb, 6);
    }
    t->simple_bpe = t->byte_level && !t->cont_prefix && !t->end_suffix;
    return DI_OK;
}

/* ---- tokenizer_config.json ---- */
static di_status config_token(di_tokenizer *t, json_t *cfg, const char *key, const char *where, int32_t *id) {
    json_t *v = json_object_get(cfg, key);
    const char *s = NULL;
    if (!v || json_is_null(v)) return DI_OK;
    if (json_is_string(v)) s = json_string_value(v);
    else if (json_is_object(v)) DI_TRY(di_json_req_string(v, "content", where, &s));
    else return di_error(DI_ERR_FORMAT, "%s: field '%s': expected a string or an AddedToken object, got %s", where, key,
                         di_json_type_name(v));
    *id = di_tokenizer_token_id(t, s);
    if (*id < 0) DI_LOG_W("%s: %s '%s' is not a token of this tokenizer", where, key, s);
    return DI_OK;
}

static di_status load_config(di_tokenizer *t, const char *dir) {
    char *path = di_path_join(dir, "tokenizer_config.json");
    char *jpath = di_path_join(dir, "chat_template.jinja");
    if (!path || !jpath) { free(path); free(jpath); return di_error(DI_ERR_NOMEM, "out of memory"); }
    di_status st = DI_OK;
    json_t *cfg = NULL;
    if (di_file_exists(path)) {
        st = di_json_load_file(path, &cfg);
        if (st == DI_OK && !json_is_object(cfg)) st = di_error(DI_ERR_FORMAT, "%s: expected a JSON object", path);
        if (st == DI_OK) st = config_token(t, cfg, "bos_token", path, &t->bos_id);
        if (st == DI_OK) st = config_token(t, cfg, "eos_token", path, &t->eos_id);
        int add_bos = 0, add_eos = 0;
        if (st == DI_OK) st = di_json_opt_bool(cfg, "add_bos_token", path, &add_bos);
        if (st == DI_OK) st = di_json_opt_bool(cfg, "add_eos_token", path, &add_eos);
        /* the post-processor decides when it adds tokens itself (HF tokenizers); otherwise the
         * config's add_bos_token / add_eos_token (transformers' slow/fast tokenizer classes) */
        if (st == DI_OK && !t->post_adds) {
            if (add_bos && t->bos_id >= 0) st = di_tok_ids_set(&t->pre_ids, &t->n_pre, t->bos_id);
            if (st == DI_OK && add_eos && t->eos_id >= 0) st = di_tok_ids_set(&t->post_ids, &t->n_post, t->eos_id);
        }
        json_t *ct = json_object_get(cfg, "chat_template");
        if (st == DI_OK && json_is_string(ct)) {
            t->chat_template = strdup(json_string_value(ct));
            if (!t->chat_template) st = di_error(DI_ERR_NOMEM, "out of memory");
        } else if (st == DI_OK && json_is_array(ct)) {
            for (size_t i = 0; i < json_array_size(ct); i++) {
                json_t *e = json_array_get(ct, i);
                const char *name = json_string_value(json_object_get(e, "name"));
                const char *tmpl = json_string_value(json_object_get(e, "template"));
                if (tmpl && (!t->chat_template || (name && !strcmp(name, "default")))) {
                    free(t->chat_template);
                    t->chat_template = strdup(tmpl);
                }
            }
        }
    }
    if (st == DI_OK && di_file_exists(jpath)) {
        char *s = NULL;
        size_t n;
        st = di_read_file(jpath, &s, &n, 16u << 20);
        if (st == DI_OK) { free(t->chat_template); t->chat_template = s; }
    }
    json_decref(cfg);
    free(path);
    free(jpath);
    return st;
}

di_status di_tok_ids_set(int32_t **v, size_t *n, int32_t id) {
    int32_t *r = realloc(*v, sizeof *r);
    if (!r) return di_error(DI_ERR_NOMEM, "out of memory");
    r[0] = id;
    *v = r;
    *n = 1;
    return DI_OK;
}

/* ---- top level ---- */
static di_status load_json(di_tokenizer *t, const char *buf, size_t len) {
    const char *where = t->path;
    di_tok_json_cursor c = {buf, buf + len, buf, where};
    span spans[6] = {{"model", 0, 0}, {"normalizer", 0, 0}, {"added_tokens", 0, 0},
                     {"pre_tokenizer", 0, 0}, {"post_processor", 0, 0}, {"decoder", 0, 0}};
    di_tok_buf key = {0};
    di_status st = di_tok_json_expect(&c, '{');
    di_tok_json_skip_ws(&c);
    if (st == DI_OK && c.p < c.end && *c.p == '}') { c.p++; }
    else while (st == DI_OK) {
        const char *k;
        size_t kn;
        if ((st = di_tok_json_string(&c, &key, &k, &kn)) != DI_OK || (st = di_tok_json_expect(&c, ':')) != DI_OK) break;
        di_tok_json_skip_ws(&c);
        const char *v = c.p;
        if (!strcmp(k, "model")) { /* the bulk of the file: read straight into the tables */
            if (spans[0].at) { st = di_error(DI_ERR_FORMAT, "%s: key 'model' appears twice", where); break; }
            if ((st = di_tok_load_model(t, &c)) != DI_OK) break;
            spans[0].at = v;
            di_tok_json_skip_ws(&c);
            if (c.p < c.end && *c.p == ',') { c.p++; continue; }
            if (c.p < c.end && *c.p == '}') { c.p++; break; }
            st = di_tok_json_fail(&c, "expected ',' or '}' in the top-level object");
            break;
        }
        if ((st = di_tok_json_skip_value(&c)) != DI_OK) break;
        for (int i = 1; i < 6; i++)
            if (!strcmp(k, spans[i].name)) {
                if (spans[i].at) { st = di_error(DI_ERR_FORMAT, "%s: key '%s' appears twice", where, k); break; }
                spans[i].at = v;
                spans[i].len = (size_t)(c.p - v);
            }
        if ((!strcmp(k, "truncation") || !strcmp(k, "padding")) && !(c.p - v == 4 && !memcmp(v, "null", 4)))
            DI_LOG_W("%s: '%s' is set; deepinfer never truncates or pads (ignored)", where, k);
        di_tok_json_skip_ws(&c);
        if (c.p < c.end && *c.p == ',') { c.p++; continue; }
        if (c.p < c.end && *c.p == '}') { c.p++; break; }
        st = di_tok_json_fail(&c, "expected ',' or '}' in the top-level object");
    }
    di_tok_buf_free(&key);
    if (st == DI_OK) {
        di_tok_json_skip_ws(&c);
        if (c.p != c.end) st = di_tok_json_fail(&c, "expected the end of the file after the top-level object");
    }
    if (st != DI_OK) return st;
    if (!spans[0].at) return di_error(DI_ERR_FORMAT, "%s: no 'model' object", where);
    json_t *j[6] = {0};
    for (int i = 1; i < 6 && st == DI_OK; i++)
        if (spans[i].at) st = parse_span(&spans[i], where, &j[i]);
    char w[512];
    if (st == DI_OK) { snprintf(w, sizeof w, "%s: normalizer", where); st = di_tok_load_normalizer(t, j[1], w); }
    if (st == DI_OK) st = load_added(t, j[2], where);
    if (st == DI_OK) st = added_patterns(t);
    if (st == DI_OK) { snprintf(w, sizeof w, "%s: pre_tokenizer", where); st = di_tok_load_pre_tokenizer(t, j[3], w); }
    if (st == DI_OK) { snprintf(w, sizeof w, "%s: post_processor", where); st = di_tok_load_post_processor(t, j[4], w); }
    if (st == DI_OK) { snprintf(w, sizeof w, "%s: decoder", where); st = di_tok_load_decoder(t, j[5], w); }
    for (int i = 1; i < 6; i++) json_decref(j[i]);
    if (st == DI_OK) st = build_tables(t);
    if (st == DI_OK) st = build_tries(t);
    for (size_t i = 0; i < t->n_pre + t->n_post && st == DI_OK; i++) {
        int32_t id = i < t->n_pre ? t->pre_ids[i] : t->post_ids[i - t->n_pre];
        if (id < 0 || (uint32_t)id >= t->n_ids || t->str_len[id] == UINT32_MAX)
            st = di_error(DI_ERR_FORMAT, "%s: post_processor: special token id %d is not in the vocabulary", where, id);
    }
    return st;
}

static di_tokenizer *di_tok_alloc(const char *name) {
    di_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->path = strdup(name);
    if (!t->path) { free(t); return NULL; }
    t->bos_id = t->eos_id = t->unk_id = -1;
    return t;
}

di_status di_tokenizer_load(const char *path, di_tokenizer **out) {
    *out = NULL;
    if (!path) return di_error(DI_ERR_INVALID_ARG, "tokenizer: NULL path");
    struct stat sb;
    if (stat(path, &sb) != 0) return di_error(DI_ERR_IO, "%s: cannot access tokenizer (no such file or directory)", path);
    char *file = S_ISDIR(sb.st_mode) ? di_path_join(path, "tokenizer.json") : strdup(path);
    char *dir = NULL;
    if (file && S_ISDIR(sb.st_mode)) dir = strdup(path);
    else if (file) {
        dir = strdup(path);
        char *slash = dir ? strrchr(dir, '/') : NULL;
        if (dir && slash) *slash = '\0';
        else if (dir) { free(dir); dir = strdup("."); }
    }
    di_tokenizer *t = file ? di_tok_alloc(file) : NULL;
    free(file);
    if (!dir || !t) { free(dir); di_tokenizer_free(t); return di_error(DI_ERR_NOMEM, "out of memory"); }
    char *buf = NULL;
    size_t len = 0;
    di_status st = di_read_file(t->path, &buf, &len, MAX_FILE);
    if (st == DI_OK) st = load_json(t, buf, len);
    free(buf);
    if (st == DI_OK) st = load_config(t, dir);
    free(dir);
    if (st != DI_OK) { di_tokenizer_free(t); return st; }
    *out = t;
    return DI_OK;
}

di_status di_tokenizer_load_json(const char *json, size_t len, const char *name, di_tokenizer **out) {
    *out = NULL;
    if (!json && len) return di_error(DI_ERR_INVALID_ARG, "tokenizer: NULL JSON buffer");
    di_tokenizer *t = di_tok_alloc(name ? name : "tokenizer.json");
    if (!t) return di_error(DI_ERR_NOMEM, "out of memory");
    di_status st = load_json(t, json ? json : "", len);
    if (st != DI_OK) { di_tokenizer_free(t); return st; }
    *out = t;
    return DI_OK;
}

void di_tokenizer_free(di_tokenizer *t) {
    if (!t) return;
    di_tok_ws_free_all(t);
    free(t->path);
    free(t->str_blob); free(t->str_off); free(t->str_len);
    free(t->dec_blob); free(t->dec_off); free(t->dec_len);
    free(t->id_flags);
    free(t->vmap);
    free(t->mstr_blob); free(t->mstr_off); free(t->mstr_len);
    free(t->merges);
    free(t->cont_prefix); free(t->end_suffix); free(t->unk_token);
    for (size_t i = 0; i < t->n_added; i++) {
        if (t->added[i].pattern != t->added[i].content) free(t->added[i].pattern);
        free(t->added[i].content);
    }
    free(t->added);
    di_strmap_free(t->added_map);
    di_tok_trie_free(&t->raw_trie);
    di_tok_trie_free(&t->norm_trie);
    di_tok_trie_free(&t->empty_trie);
    for (size_t i = 0; i < t->n_norms; i++) { free(t->norms[i].str); di_tok_regex_free(t->norms[i].re); }
    free(t->norms);
    for (size_t i = 0; i < t->n_stages; i++) di_tok_regex_free(t->stages[i].re);
    free(t->stages);
    free(t->pre_ids);
    free(t->post_ids);
    free(t->chat_template);
    free(t);
}

/* ---- accessors ---- */
size_t di_tokenizer_vocab_size(const di_tokenizer *t) { return t->n_ids; }

int32_t di_tokenizer_token_id(const di_tokenizer *t, const char *token) {
    if (!token) return -1;
    size_t n = strlen(token);
    int64_t k;
    if (t->added_map && di_strmap_get(t->added_map, token, n, &k)) return t->added[k].id;
    return di_tok_vocab_lookup(t, token, n);
}

const char *di_tokenizer_token_str(const di_tokenizer *t, int32_t id) {
    if (id < 0 || (uint32_t)id >= t->n_ids || t->str_len[id] == UINT32_MAX) return NULL;
    return t->str_blob + t->str_off[id];
}

int di_tokenizer_is_special(const di_tokenizer *t, int32_t id) {
    return id >= 0 && (uint32_t)id < t->n_ids && (t->id_flags[id] & DI_TOK_ID_SPECIAL);
}

int di_tokenizer_is_added(const di_tokenizer *t, int32_t id) {
    return id >= 0 && (uint32_t)id < t->n_ids && (t->id_flags[id] & DI_TOK_ID_ADDED);
}

int32_t di_tokenizer_bos_id(const di_tokenizer *t) { return t->bos_id; }
int32_t di_tokenizer_eos_id(const di_tokenizer *t) { return t->eos_id; }
const char *di_tokenizer_chat_template(const di_tokenizer *t) { return t->chat_template; }
