/* tok_internal.h - internal data structures of the tokenizer module (not a public header).
 *
 * The pipeline follows Hugging Face `tokenizers` exactly:
 *   text -> added-token split on raw text (non-normalized added tokens)
 *        -> normalizers on each remaining piece -> added-token split on normalized text
 *        -> pre-tokenizer stages (Split / Digits / Whitespace / ByteLevel) -> BPE model -> ids
 *        -> post-processor (BOS/EOS) when asked.
 * Pieces of text are (offset, length) pairs into one segment buffer; bit 31 of the length marks
 * a virtual leading space (ByteLevel add_prefix_space), so no stage ever copies text.
 *
 * Ownership: di_tokenizer owns everything below and is immutable after load, so any number of
 * threads may encode/decode concurrently. Mutable scratch (PCRE2 match data, piece lists, the
 * BPE word cache) lives in di_tok_ws workspaces, claimed per call from a lock-free slot array. */
#ifndef DI_TOKENIZER_TOK_INTERNAL_H
#define DI_TOKENIZER_TOK_INTERNAL_H
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "core/threadpool.h"
#include "core/utf8.h"
#include "tokenizer/tokenizer.h"

/* di_utf8_decode with an inline fast path for the 1- and 2-byte cases: returns the length of
 * the character at s (n >= 1 bytes available) and sets *cp, or 0 if it is invalid. */
static inline int di_tok_utf8_next(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned c = s[0];
    if (c < 0x80) { *cp = c; return 1; }
    if (c >= 0xc2 && c <= 0xdf && n >= 2 && (s[1] & 0xc0) == 0x80) { *cp = ((c & 0x1f) << 6) | (s[1] & 0x3f); return 2; }
    return di_utf8_decode(s, n, cp);
}

/* ---- growable byte buffer ---- */
typedef struct di_tok_buf { char *p; size_t n, cap; } di_tok_buf;
di_status di_tok_buf_grow(di_tok_buf *b, size_t extra);
static inline di_status di_tok_buf_reserve(di_tok_buf *b, size_t extra) {
    return b->n + extra + 1 <= b->cap ? DI_OK : di_tok_buf_grow(b, extra);
}
/* Appends n bytes; the buffer stays NUL-terminated (the NUL is not counted in n). */
static inline di_status di_tok_buf_put(di_tok_buf *b, const void *s, size_t n) {
    if (b->n + n + 1 > b->cap) DI_TRY(di_tok_buf_grow(b, n));
    if (n) __builtin_memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return DI_OK;
}
void di_tok_buf_free(di_tok_buf *b);

/* ---- regex (Oniguruma/Ruby syntax and Unicode semantics as used by HF, run on PCRE2 JIT) ---- */
typedef struct di_tok_regex {
    pcre2_code *code;
    int jit;          /* JIT-compiled */
    int can_be_empty; /* the pattern can match the empty string */
    int anchored_g;   /* uses \G: matches depend on the search start, no chunked scanning */
} di_tok_regex;

typedef struct di_tok_match {
    pcre2_match_data *md;
    pcre2_jit_stack *jstack;
    pcre2_match_context *mctx;
} di_tok_match;

/* pattern: Oniguruma syntax (HF "Regex") or, with literal=1, a plain string (HF "String"). */
di_status di_tok_regex_compile(const char *pattern, size_t len, int literal, const char *where, di_tok_regex **out);
void di_tok_regex_free(di_tok_regex *re);
di_status di_tok_match_init(di_tok_match *m);
void di_tok_match_free(di_tok_match *m);
/* Leftmost match starting at or after `start` in subj[0..len) (the whole subject is visible to
 * look-behind/look-ahead). Returns 1 and sets [*ms,*me), 0 if none, -1 on a matching error
 * (message set). */
int di_tok_regex_search(const di_tok_regex *re, di_tok_match *m, const char *subj, size_t len, size_t start,
                     size_t *ms, size_t *me);
/* Iteration over all matches with HF's (onig crate) rules for empty matches. */
typedef struct di_tok_find_iter { size_t last_end, last_match_end; int has_last; } di_tok_find_iter;
int di_tok_regex_next(const di_tok_regex *re, di_tok_match *m, const char *s, size_t n, di_tok_find_iter *it, size_t *ms,
                   size_t *me);
/* Translates an Oniguruma pattern to PCRE2 syntax (exposed for tests). Caller frees. */
di_status di_tok_regex_translate(const char *pattern, size_t len, const char *where, char **out, size_t *out_len);

/* ---- Unicode helpers matching the Rust/Oniguruma tables HF was built with ---- */
int di_tok_uc_is_numeric(uint32_t cp);     /* Rust char::is_numeric (Nd | Nl | No) */
int di_tok_uc_is_whitespace(uint32_t cp);  /* Rust char::is_whitespace / White_Space */
int di_tok_uc_is_word(uint32_t cp);        /* Rust regex \w (for added tokens' single_word) */
/* Rust char::to_lowercase where it differs from utf8proc_tolower: writes up to 3 code points
 * and returns the count, or -1 when utf8proc_tolower gives the answer. */
int di_tok_uc_lower_exception(uint32_t cp, uint32_t out[3]);
/* Code points whose normalization data HF's (older) Unicode tables do not have; they pass
 * through normalization unchanged and block composition across them. */
int di_tok_uc_norm_opaque(uint32_t cp);
/* Property ranges for regex translation. */
typedef struct di_tok_uc_prop {
    const char *name;            /* canonical PCRE2 name ("L", "Lu", "Han", ...) or "s"/"d"/"w" */
    const char *pcre_base;       /* PCRE2 class items approximating the set ("\\p{L}") */
    const uint32_t *ranges;      /* HF (Oniguruma) set: [lo, hi] pairs, sorted */
    uint32_t n_ranges;
    const uint32_t *extra;       /* HF set minus PCRE2's own set, valid for PCRE2 with `pcre_unicode` */
    uint32_t n_extra;
    int superset;                /* PCRE2's own set is a subset of HF's (extras suffice) */
} di_tok_uc_prop;
const di_tok_uc_prop *di_tok_uc_prop_find(const char *name, size_t len);
extern const char *const di_tok_uc_pcre_unicode_version; /* PCRE2 Unicode version the extras were made for */

/* ---- pieces ---- */
#define DI_TOK_PIECE_SPACE 0x80000000u
typedef struct di_tok_piece { uint32_t off, len; } di_tok_piece; /* len bit 31: virtual leading ' ' */
typedef struct di_tok_pieces { di_tok_piece *v; size_t n, cap; } di_tok_pieces;
di_status di_tok_pieces_push(di_tok_pieces *l, uint32_t off, uint32_t len);

typedef struct di_tok_mlist { uint32_t *v; size_t n, cap; } di_tok_mlist;  /* [start, end) match pairs */
typedef struct di_tok_entry { uint32_t s, e; uint8_t match; } di_tok_entry;
typedef struct di_tok_elist { di_tok_entry *v; size_t n, cap; } di_tok_elist;   /* splits with match flags */

/* ---- normalizers ---- */
typedef enum {
    DI_TOK_NORM_NFC, DI_TOK_NORM_NFD, DI_TOK_NORM_NFKC, DI_TOK_NORM_NFKD,
    DI_TOK_NORM_LOWERCASE, DI_TOK_NORM_REPLACE, DI_TOK_NORM_PREPEND, DI_TOK_NORM_STRIP
} di_tok_norm_kind;
typedef struct di_tok_norm {
    di_tok_norm_kind kind;
    char *str; size_t str_len;  /* Replace content / Prepend string */
    di_tok_regex *re;              /* Replace pattern */
    int left, right;            /* Strip */
} di_tok_norm;

/* ---- pre-tokenizer stages ---- */
typedef enum {
    DI_TOK_ST_SPLIT,        /* Split: regex / string pattern */
    DI_TOK_ST_CHARS,        /* a character predicate (Digits, WhitespaceSplit) */
    DI_TOK_ST_WORDS,        /* Whitespace: runs of \w and of [^\w\s] (Rust regex classes) */
    DI_TOK_ST_PREFIX_SPACE  /* ByteLevel add_prefix_space */
} di_tok_stage_kind;
typedef enum { DI_TOK_PRED_NUMERIC, DI_TOK_PRED_WHITESPACE } di_tok_char_pred;
typedef enum {
    DI_TOK_SPLIT_REMOVED, DI_TOK_SPLIT_ISOLATED, DI_TOK_SPLIT_MERGED_PREV, DI_TOK_SPLIT_MERGED_NEXT, DI_TOK_SPLIT_CONTIGUOUS
} di_tok_split_behavior;
typedef struct di_tok_stage {
    di_tok_stage_kind kind;
    di_tok_split_behavior behavior;
    int invert;
    di_tok_regex *re;      /* DI_TOK_ST_SPLIT */
    di_tok_char_pred pred; /* DI_TOK_ST_CHARS */
} di_tok_stage;

/* ---- added tokens ---- */
typedef struct di_tok_added {
    char *content; uint32_t len;   /* as written in tokenizer.json */
    char *pattern; uint32_t plen;  /* what is matched and decoded: the normalized content when
                                      `normalized` (HF 0.23 decodes such tokens in that form) */
    int32_t id;
    uint8_t special, lstrip, rstrip, single_word, normalized;
} di_tok_added;

/* A byte trie for leftmost-longest matching of added tokens. */
typedef struct di_tok_trie_node { int32_t child, sibling, token; uint8_t byte; } di_tok_trie_node;
typedef struct di_tok_trie {
    di_tok_trie_node *nodes; size_t n, cap;
    int32_t root[256];            /* first-level children by byte (-1 none) */
    size_t count;                 /* patterns added */
    int first_byte;               /* the only first byte of all patterns, or -1 */
} di_tok_trie;
void di_tok_trie_init(di_tok_trie *tr);

typedef struct di_tok_split { uint32_t off, len; int32_t token; } di_tok_split; /* token -1 = text */
typedef struct di_tok_splits { di_tok_split *v; size_t n, cap; } di_tok_splits;

/* The text cut at added tokens: token >= 0 is an added token's id, else text at off/len in the
 * input (norm = 0) or in the normalized text buffer (norm = 1). */
typedef struct di_tok_segment { int32_t token; int norm; size_t off, len; } di_tok_segment;
typedef struct di_tok_segments { di_tok_segment *v; size_t n, cap; di_tok_buf normtext; } di_tok_segments;

/* ---- post-processing / decoding ---- */
typedef enum { DI_TOK_DEC_NONE, DI_TOK_DEC_BYTELEVEL } di_tok_decoder_kind;

/* merge table slot: key = left << 32 | right (UINT64_MAX = empty) */
typedef struct di_tok_merge { uint64_t key; uint32_t rank; int32_t merged; } di_tok_merge;
static inline size_t di_tok_merge_slot(uint64_t key, size_t mask) {
    uint64_t h = key * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 32) & mask;
}

/* ---- per-call workspace ---- */
typedef struct di_tok_cache_slot { uint64_t hash; uint32_t key_off, key_len, ids_off, ids_len; } di_tok_cache_slot;
typedef struct di_tok_ws {
    di_tok_match match;
    di_tok_buf norm, norm2, tmp;       /* normalized text and scratch */
    di_tok_buf vspace;                 /* " " + piece for pieces with a virtual space */
    di_tok_buf word;                   /* vocab-form string of a piece (BPE) */
    di_tok_pieces pa, pb;              /* piece lists */
    di_tok_mlist ml;                   /* matches of one piece */
    di_tok_elist el;                   /* splits of one piece */
    di_tok_splits raw_splits, norm_splits; /* added-token splits */
    di_tok_segments segs;              /* the call's segments */
    /* BPE scratch: symbols of one word as a linked list, pair ranks, merge heap (2 * sym_cap) */
    int32_t *sym_id, *sym_prev, *sym_next; uint32_t *sym_rank; size_t sym_cap;
    uint64_t *heap;
    /* word cache: open addressing, cleared when full */
    di_tok_cache_slot *cache; size_t cache_n;
    char *cache_keys; size_t cache_keys_n;
    int32_t *cache_ids; size_t cache_ids_n;
    int slot; /* index in di_tokenizer.ws, or -1 for a temporary workspace */
} di_tok_ws;

#define DI_TOK_MAX_WS 64

struct di_tokenizer {
    char *path;
    /* vocabulary over all ids (model vocab + added tokens) */
    uint32_t n_ids;               /* highest id + 1 */
    char *str_blob;               /* token strings by id (added content wins, as in HF) */
    uint32_t *str_off, *str_len;  /* [n_ids]; str_len UINT32_MAX = no token */
    char *dec_blob;               /* ByteLevel-decoded bytes by id */
    uint32_t *dec_off, *dec_len;
    uint8_t *id_flags;            /* [n_ids] DI_TOK_ID_* */
    /* model vocab map: string -> id, open addressing (slot = hash tag << 32 | id + 1, 0 empty) */
    uint64_t *vmap; size_t vmap_mask;
    uint32_t n_model_vocab;       /* entries in model.vocab (HF's get_vocab_size) */
    uint32_t n_model_ids;         /* highest model vocab id + 1 */
    char *mstr_blob; uint32_t *mstr_off, *mstr_len; /* model vocab strings by id */
    /* merges: (left id, right id) -> (rank, merged id) */
    di_tok_merge *merges; size_t mmask; size_t n_merges;
    /* BPE options */
    int byte_level;               /* a ByteLevel pre-tokenizer maps bytes to the byte alphabet */
    int ignore_merges, fuse_unk, byte_fallback;
    int32_t unk_id;               /* -1 none */
    char *unk_token;              /* NULL none */
    char *cont_prefix, *end_suffix; /* NULL or "" = none */
    int32_t byte_id[256];         /* byte-level: id of the single-byte symbol, -1 if absent */
    int32_t fallback_id[256];     /* byte_fallback: id of "<0xNN>", -1 if absent */
    int simple_bpe;               /* byte_level with no prefix/suffix: units are bytes */
    char bl_str[256][4];          /* UTF-8 of each byte's alphabet character */
    uint8_t bl_len[256];
    /* added tokens */
    di_tok_added *added; size_t n_added;
    struct di_strmap *added_map;  /* content -> index in added */
    di_tok_trie raw_trie, norm_trie, empty_trie;
    /* pipeline */
    di_tok_norm *norms; size_t n_norms;
    di_tok_stage *stages; size_t n_stages;
    /* post-processor */
    int32_t *pre_ids; size_t n_pre; int32_t *post_ids; size_t n_post;
    int post_adds;                /* the post-processor adds special tokens itself */
    di_tok_decoder_kind decoder;
    /* tokenizer_config.json */
    int32_t bos_id, eos_id;
    char *chat_template;
    /* workspaces */
    _Atomic(di_tok_ws *) ws[DI_TOK_MAX_WS];
    atomic_int ws_busy[DI_TOK_MAX_WS];
};

#define DI_TOK_ID_ADDED 1
#define DI_TOK_ID_SPECIAL 2
#define DI_TOK_ID_MODEL 4

/* tok_vocab.c */
di_status di_tok_vocab_build_map(di_tokenizer *t);
/* Token ids index dense tables (17 bytes per id), so an id space of n_ids for n_entries tokens
 * is refused when it is much sparser than real vocabularies, which number their tokens 0..n-1
 * (HF accepts any u32 id): more than 4 ids per entry plus 2^20 (an id of 2e9 in a 3-token
 * vocab would otherwise ask for 34 GB). */
static inline int di_tok_ids_too_sparse(uint64_t n_ids, uint64_t n_entries) {
    return n_ids > 4 * n_entries + (1u << 20);
}
int32_t di_tok_vocab_lookup(const di_tokenizer *t, const char *s, size_t n);
di_status di_tok_merges_init(di_tokenizer *t, size_t n_merges);
di_status di_tok_merges_add(di_tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t merged);
static inline int di_tok_merges_get(const di_tokenizer *t, int32_t a, int32_t b, uint32_t *rank, int32_t *merged) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t j = di_tok_merge_slot(key, t->mmask);
    for (;;) {
        const di_tok_merge *m = &t->merges[j];
        if (m->key == key) { *rank = m->rank; *merged = m->merged; return 1; }
        if (m->key == UINT64_MAX) return 0;
        j = (j + 1) & t->mmask;
    }
}
/* byte <-> byte-level alphabet code point */
uint32_t di_tok_bytelevel_char(uint8_t b);
int di_tok_bytelevel_byte(uint32_t cp); /* -1 if cp is not in the alphabet */

/* tok_json.c: fast paths for the two large fields of tokenizer.json */
typedef struct di_tok_json_cursor { const char *p, *end, *base; const char *where; } di_tok_json_cursor;
di_status di_tok_json_skip_ws(di_tok_json_cursor *c);
di_status di_tok_json_skip_value(di_tok_json_cursor *c);
/* Parses a JSON string at c->p into buf (decoded UTF-8, NUL-terminated); *out points into buf. */
di_status di_tok_json_string(di_tok_json_cursor *c, di_tok_buf *buf, const char **out, size_t *len);
/* Like di_tok_json_string, but points into the JSON text itself when the string needs no decoding
 * (then it is not NUL-terminated). */
di_status di_tok_json_string_ref(di_tok_json_cursor *c, di_tok_buf *buf, const char **out, size_t *len);
/* Appends the decoded string to buf (buf->n grows by its length; a NUL follows, uncounted). */
di_status di_tok_json_string_append(di_tok_json_cursor *c, di_tok_buf *buf);
di_status di_tok_json_expect(di_tok_json_cursor *c, char ch);
di_status di_tok_json_fail(const di_tok_json_cursor *c, const char *what);

/* tok_load_model.c */
/* Reads the "model" value at the cursor and advances past it. */
di_status di_tok_load_model(di_tokenizer *t, di_tok_json_cursor *c);
/* tok_load_pipeline.c: normalizer / pre_tokenizer / post_processor / decoder (jansson values) */
typedef struct json_t json_t;
di_status di_tok_load_normalizer(di_tokenizer *t, json_t *v, const char *where);
di_status di_tok_load_pre_tokenizer(di_tokenizer *t, json_t *v, const char *where);
di_status di_tok_load_post_processor(di_tokenizer *t, json_t *v, const char *where);
di_status di_tok_load_decoder(di_tokenizer *t, json_t *v, const char *where);
di_status di_tok_ids_set(int32_t **v, size_t *n, int32_t id);

/* tok_added.c */
di_status di_tok_trie_add(di_tok_trie *tr, const char *s, size_t n, int32_t token_index);
void di_tok_trie_free(di_tok_trie *tr);
/* Splits text[0..n) around added tokens of `trie` with HF's rules (leftmost-longest, single_word,
 * lstrip, rstrip), appending splits to `out` (token = index into di_tokenizer.added, or -1). */
di_status di_tok_added_split(const di_tokenizer *t, const di_tok_trie *trie, const char *text, size_t n,
                          di_tok_splits *out);

/* tok_normalize.c: applies all normalizers to s[0..n) into out (replaced). */
di_status di_tok_normalize(const di_tokenizer *t, const char *s, size_t n, di_tok_ws *ws, di_tok_buf *out);
/* The same on a pool, in chunks cut where normalization cannot act across (one NFx form or
 * Lowercase; anything else runs serially). */
di_status di_tok_normalize_parallel(const di_tokenizer *t, di_tok_ws **wss, int n_ws, di_threadpool *pool, const char *s,
                                 size_t n, di_tok_buf *out);

/* tok_pretok.c: pre-tokenizes seg[0..n) into final pieces (ws->pa). */
di_status di_tok_pretokenize(const di_tokenizer *t, di_tok_ws *ws, const char *seg, size_t n, di_tok_pieces **out);
di_status di_tok_pretokenize_parallel(const di_tokenizer *t, di_tok_ws **wss, int n_ws, di_threadpool *pool,
                                   const char *seg, size_t n, di_tok_pieces **out);
/* Applies one stage to the pieces in[0..n_in) of seg, appending to out (used by both paths). */
di_status di_tok_stage_apply(const di_tok_stage *st, di_tok_ws *ws, const char *seg, const di_tok_piece *in, size_t n_in,
                          di_tok_pieces *out);

/* Test hooks: work sizes of the segment-parallel encoder (0 = default). */
void di_tok_pretok_set_sizes(size_t batch_bytes, size_t big_piece);
void di_tok_parallel_set_sizes(size_t min_bytes, size_t task_bytes, size_t batch_bytes, size_t big_piece);

/* tok_encode.c: the building blocks of encoding */
di_status di_tok_ids_append(di_ids *dst, const int32_t *src, size_t n);
size_t di_tok_utf8_first_invalid(const char *s, size_t n); /* n if valid */
di_status di_tok_utf8_error(const char *text, size_t bad);
di_status di_tok_check_flags(const char *text, size_t len, unsigned flags);
di_status di_tok_check_input(const char *text, size_t len, unsigned flags); /* flags + UTF-8 */
di_status di_tok_wrap(const di_tokenizer *t, unsigned flags, int pre, di_ids *out); /* BOS / EOS */
int di_tok_is_safe(const di_tokenizer *t, unsigned flags);
di_status di_tok_seg_push(di_tok_segments *s, int32_t token, int norm, size_t off, size_t len);
di_status di_tok_cut_raw(const di_tokenizer *t, di_tok_ws *ws, const char *text, size_t len, unsigned flags); /* -> ws->raw_splits */
di_status di_tok_cut_normalized(const di_tokenizer *t, di_tok_ws *ws, const char *s, size_t n, int norm, size_t base, int safe,
                             di_tok_segments *out);
di_status di_tok_cut_piece(const di_tokenizer *t, di_tok_ws *ws, const char *text, di_tok_split sp, int safe, di_tok_segments *out);
di_status di_tok_encode_segment(const di_tokenizer *t, di_tok_ws *ws, const char *seg, size_t n, di_ids *out);
di_status di_tok_encode_segments(const di_tokenizer *t, di_tok_ws *ws, const di_tok_segments *segs, size_t lo, size_t hi,
                              const char *text, di_ids *out);
di_status di_tok_encode_raw(const di_tokenizer *t, di_tok_ws *ws, const di_tok_split *raw, size_t lo, size_t hi, const char *text,
                         int safe, di_ids *out);

/* tok_bpe.c */
di_status di_tok_bpe_piece(const di_tokenizer *t, di_tok_ws *ws, const char *seg, di_tok_piece p, di_ids *out);

/* tok_ws.c */
di_tok_ws *di_tok_ws_acquire(const di_tokenizer *t);
void di_tok_ws_release(const di_tokenizer *t, di_tok_ws *ws);
void di_tok_ws_free(di_tok_ws *ws);
void di_tok_ws_free_all(di_tokenizer *t);
di_status di_tok_ws_sym_reserve(di_tok_ws *ws, size_t n);
#endif
