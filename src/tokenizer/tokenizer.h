/* tokenizer.h - Hugging Face tokenizer.json (byte-level BPE) encode/decode, bit-exact with the
 * `tokenizers` library (0.23), plus the streaming detokenizer. See docs/tokenizer.md.
 *
 * Owner: tokenizer. Two encode modes:
 *   DI_TOK_HF   added tokens spelled in the text become their ids (HF encode(text,
 *               add_special_tokens=False)).
 *   DI_TOK_SAFE text that spells any added token (special or not, e.g. "<｜User｜>", "</think>")
 *               is encoded as ordinary text, so user input can never inject control tokens
 *               (used for user text, tool results and tool arguments).
 * DI_TOK_ADD_SPECIAL adds BOS/EOS as the post-processor says, or, when it adds none, as
 * tokenizer_config.json's add_bos_token / add_eos_token say.
 * Invalid UTF-8 input is rejected with DI_ERR_FORMAT naming the byte offset.
 * A loaded tokenizer is read-only: any number of threads may use it at the same time. */
#ifndef DI_TOKENIZER_TOKENIZER_H
#define DI_TOKENIZER_TOKENIZER_H
#include <stddef.h>
#include <stdint.h>
#include "deepinfer.h"

typedef struct di_tokenizer di_tokenizer;

/* A growable id vector; free with di_ids_free. */
typedef struct di_ids { int32_t *data; size_t n, cap; } di_ids;
di_status di_ids_push(di_ids *v, int32_t id);
void di_ids_free(di_ids *v);

enum {
    DI_TOK_HF = 0,
    DI_TOK_SAFE = 1 << 0,
    DI_TOK_ADD_SPECIAL = 1 << 1,
    DI_TOK_SKIP_SPECIAL = 1 << 2  /* decode: drop tokens marked special */
};

/* `path` is a directory holding tokenizer.json (and optionally tokenizer_config.json) or the
 * tokenizer.json file itself. */
di_status di_tokenizer_load(const char *path, di_tokenizer **out);
/* Loads tokenizer.json content from memory (no tokenizer_config.json); `name` is used in error
 * messages. */
di_status di_tokenizer_load_json(const char *json, size_t len, const char *name, di_tokenizer **out);
void di_tokenizer_free(di_tokenizer *t);

/* Appends the ids of text[0..len) to *out (on error nothing is appended). Thread-safe: any
 * number of threads may encode with one tokenizer at the same time. */
di_status di_tokenizer_encode(const di_tokenizer *t, const char *text, size_t len, unsigned flags, di_ids *out);
/* The same ids, computed on `pool` (see core/threadpool.h; one caller per pool at a time) for
 * long inputs: the text is cut at added tokens and inside long segments at pre-tokenizer
 * boundaries, and the pieces are encoded in parallel. Identical output to di_tokenizer_encode.
 * Inputs under 64 KB, or a NULL / 1-thread pool, are encoded serially. */
struct di_threadpool;
di_status di_tokenizer_encode_parallel(const di_tokenizer *t, const char *text, size_t len, unsigned flags,
                                       struct di_threadpool *pool, di_ids *out);
/* Decodes ids into a malloc'd NUL-terminated string (caller frees); *len (if not NULL) gets its
 * length. As HF: ids with no token are dropped, DI_TOK_SKIP_SPECIAL drops special=true tokens,
 * invalid UTF-8 from byte-level tokens becomes U+FFFD (one per maximal invalid subsequence). */
di_status di_tokenizer_decode(const di_tokenizer *t, const int32_t *ids, size_t n, unsigned flags,
                              char **text, size_t *len);

size_t di_tokenizer_vocab_size(const di_tokenizer *t);   /* highest id + 1 */
/* id of a token by its exact string (vocab or added token); -1 if none. */
int32_t di_tokenizer_token_id(const di_tokenizer *t, const char *token);
/* The token's string (vocab form, e.g. byte-level "Ġthe"), or NULL. */
const char *di_tokenizer_token_str(const di_tokenizer *t, int32_t id);
/* special=true in tokenizer.json (what DI_TOK_SKIP_SPECIAL drops). Note: DeepSeek-V3's role and
 * tool tokens (<｜User｜>, <｜Assistant｜>, <｜tool▁calls▁begin｜>, ...) are added but not special;
 * use di_tokenizer_is_added to recognize control tokens. */
int di_tokenizer_is_special(const di_tokenizer *t, int32_t id);
int di_tokenizer_is_added(const di_tokenizer *t, int32_t id);    /* any added token */
/* From tokenizer_config.json (or -1 / NULL if unknown). */
int32_t di_tokenizer_bos_id(const di_tokenizer *t);
int32_t di_tokenizer_eos_id(const di_tokenizer *t);
const char *di_tokenizer_chat_template(const di_tokenizer *t);

/* Streaming detokenizer: push ids one at a time; each call appends only complete UTF-8 text
 * (bytes of a character split across tokens are held back). The concatenation of all outputs
 * plus di_detok_flush equals di_tokenizer_decode of the whole sequence. */
typedef struct di_detok di_detok;
di_detok *di_detok_create(const di_tokenizer *t, unsigned flags);
void di_detok_free(di_detok *d);
/* Appends newly completed text to *buf (realloc'd; *len updated, NUL-terminated). */
di_status di_detok_push(di_detok *d, int32_t id, char **buf, size_t *len, size_t *cap);
/* Emits any held bytes (invalid sequences become U+FFFD, as HF's lossy decode does). */
di_status di_detok_flush(di_detok *d, char **buf, size_t *len, size_t *cap);
#endif
