/* encode.h - chat encoders: a di_conv in, the model's prompt out (DeepSeek V3, R1, V3.1 formats).
 *
 * An encoder produces a di_prompt: the rendered text plus a segmentation of it into special
 * tokens (emitted by the template) and text runs. The text is byte-identical to rendering the
 * format's Jinja template with jinja2 the way transformers' apply_chat_template does
 * (tests/data/recipe/templates/ hold the reference templates). di_prompt_to_ids turns the
 * segments into token ids: special tokens by id, every text run through the tokenizer's safe
 * mode, so text supplied by users or tools can never become a control token.
 *
 * Where the Jinja template would raise (a null content concatenated to a string, ...), the
 * encoder returns DI_ERR_INVALID_ARG naming the message. Documented divergences from the
 * templates are listed in docs/recipe.md. */
#ifndef DI_RECIPE_ENCODE_H
#define DI_RECIPE_ENCODE_H
#include <stddef.h>
#include <stdint.h>

#include "recipe/conv.h"

typedef enum di_chat_format {
    DI_CHAT_FORMAT_V3 = 0,   /* DeepSeek-V3 tokenizer_config.json chat_template */
    DI_CHAT_FORMAT_R1,       /* DeepSeek-R1 (forced "<think>\n" generation prompt) */
    DI_CHAT_FORMAT_V31       /* DeepSeek-V3.1 hybrid thinking, name<sep>args tool calls */
} di_chat_format;

/* Parses "v3", "r1", "v3.1" (also "v31"); returns -1 if unknown. */
int di_chat_format_parse(const char *s);
const char *di_chat_format_name(di_chat_format f);

/* DeepSeek control-token strings (U+FF5C fullwidth bars, U+2581 lower blocks). */
#define DI_TOK_STR_BOS "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define DI_TOK_STR_EOS "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define DI_TOK_STR_USER "<\xef\xbd\x9cUser\xef\xbd\x9c>"
#define DI_TOK_STR_ASSISTANT "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"
#define DI_TOK_STR_CALLS_BEGIN "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DI_TOK_STR_CALLS_END "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DI_TOK_STR_CALL_BEGIN "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DI_TOK_STR_CALL_END "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DI_TOK_STR_OUTPUTS_BEGIN "<\xef\xbd\x9ctool\xe2\x96\x81outputs\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DI_TOK_STR_OUTPUTS_END "<\xef\xbd\x9ctool\xe2\x96\x81outputs\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DI_TOK_STR_OUTPUT_BEGIN "<\xef\xbd\x9ctool\xe2\x96\x81output\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DI_TOK_STR_OUTPUT_END "<\xef\xbd\x9ctool\xe2\x96\x81output\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DI_TOK_STR_SEP "<\xef\xbd\x9ctool\xe2\x96\x81sep\xef\xbd\x9c>"
#define DI_TOK_STR_EOT "<|EOT|>"
#define DI_TOK_STR_THINK "<think>"
#define DI_TOK_STR_THINK_END "</think>"

typedef enum di_seg_kind {
    DI_SEG_TEXT = 0,     /* ordinary text: encoded in safe mode */
    DI_SEG_SPECIAL       /* one control token, by its string */
} di_seg_kind;

typedef struct di_seg {
    di_seg_kind kind;
    size_t off, len;     /* byte range in di_prompt.text */
} di_seg;

/* The rendered prompt and its segmentation. Adjacent text segments are merged, so a text
 * segment is always bounded by special tokens or the ends of the prompt. */
typedef struct di_prompt {
    char *text;          /* NUL-terminated */
    size_t len, cap;
    di_seg *segs;
    size_t n_segs, cap_segs;
} di_prompt;

void di_prompt_init(di_prompt *p);
void di_prompt_free(di_prompt *p);   /* releases buffers; p may be reused after init */
di_status di_prompt_text(di_prompt *p, const char *s, size_t len);
di_status di_prompt_special(di_prompt *p, const char *tok);

typedef struct di_encode_opts {
    di_chat_format format;
    int add_generation_prompt;
    di_thinking thinking;        /* V3.1: ON -> "<think>" generation prompt; R1 ignores it */
    int tools_prompt;            /* V3.1: describe conv's tools in the system prompt the way the
                                    DeepSeek-V3.1 model card lays it out (the Jinja template renders
                                    no tools); ignored by V3 and R1, which document no such text */
    int continue_final_message;  /* the conversation ends with an assistant message to be
                                    continued: its trailing end-of-sentence is not emitted (what
                                    transformers' continue_final_message does to these templates);
                                    add_generation_prompt must then be 0 */
    const char *bos_token;       /* NULL = DI_TOK_STR_BOS */
    const char *eos_token;       /* NULL = DI_TOK_STR_EOS */
} di_encode_opts;

/* Renders conv with the chosen format into out (which must be initialised; it is reset). */
di_status di_chat_encode(const di_conv *c, const di_encode_opts *o, di_prompt *out);

/* Per-format encoders (used by di_chat_encode). */
di_status di_encode_v3(const di_conv *c, const di_encode_opts *o, di_prompt *out);
di_status di_encode_r1(const di_conv *c, const di_encode_opts *o, di_prompt *out);
di_status di_encode_v31(const di_conv *c, const di_encode_opts *o, di_prompt *out);

/* Shared by the encoders: DI_ERR_INVALID_ARG naming message i when its content is null (where
 * the Jinja template would fail concatenating None to a string). */
di_status di_encode_need_content(const di_message *m, size_t i);
/* Shared by the encoders: "<bos>" + all system contents joined by "\n\n". */
di_status di_encode_system_prefix(const di_conv *c, const di_encode_opts *o, di_prompt *out);
/* Shared by V3 and R1: type<sep>name + "\n```json\n" + arguments + "\n```" (no call begin/end). */
di_status di_encode_fenced_call(di_prompt *out, const di_tool_call *tc);

/* Where the model's generated text starts for this conversation under these options: 1 if the
 * prompt ends inside a reasoning block (R1 always; V3.1 with thinking on), else 0. */
int di_chat_format_starts_in_reasoning(di_chat_format f, di_thinking thinking);
/* The same decided from a rendered prompt: 1 if its last <think> control segment comes after
 * the last </think>, <User> and <Assistant> ones (covers continue_final_message prompts). */
int di_prompt_ends_in_reasoning(const di_prompt *p);

/* ---- token ids (prompt_ids.c; needs the tokenizer) ---- */
struct di_tokenizer;
struct di_ids;
/* Appends the ids of p to *out: each special segment as its token id, each text run encoded
 * with DI_TOK_SAFE. "<think>"/"</think>" missing from the vocabulary are encoded as plain text
 * together with the neighbouring text (what HF's tokenizer does with the rendered string);
 * any other missing control token is DI_ERR_NOT_FOUND. *n_text_fallbacks (may be NULL) counts
 * the control tokens that fell back to text. */
di_status di_prompt_to_ids(const di_prompt *p, const struct di_tokenizer *tok, struct di_ids *out,
                           size_t *n_text_fallbacks);
#endif
