/* outparse.h - the streaming output parser: the model's generated tokens in, reasoning /
 * content / tool-call events out.
 *
 * Fed (token id, token bytes) pairs as the model produces them. Control tokens (</think>,
 * <think>, the tool-call tokens, end-of-sentence, extra stop ids) are recognised by id only: the
 * same characters produced as ordinary text are ordinary text. Token bytes may split a UTF-8
 * character (byte-level BPE); every text delta the parser emits is complete, valid UTF-8
 * (invalid bytes become U+FFFD the way a lossy UTF-8 decode does; an incomplete tail is held
 * until the next bytes or replaced at the end).
 *
 * Tool calls: V3/R1 syntax <calls_begin><call_begin>TYPE<sep>NAME\n```json\nARGS\n```<call_end>
 * ...<calls_end>; V3.1 syntax <call_begin>NAME<sep>ARGS<call_end>. A call's start event (index,
 * id, name) is emitted as soon as the name is complete; its arguments stream as JSON text
 * fragments. The V3 closing fence "\n```" is matched incrementally with KMP across token
 * boundaries: bytes that may still be the fence are held back, nothing is re-scanned.
 *
 * Final result is independent of how the stream is chunked (token by token, several tokens per
 * feed, text split at any byte): only the grouping of deltas into events may differ.
 *
 * Malformed output never crashes and always gets a finish reason: an unterminated tool call at
 * the end of the stream is DI_FINISH_LENGTH if generation hit the token limit, else
 * DI_FINISH_ERROR; arguments that are not a JSON object make the call invalid (kept, with
 * valid = 0) and the finish reason DI_FINISH_ERROR with a description in `detail`. */
#ifndef DI_RECIPE_OUTPARSE_H
#define DI_RECIPE_OUTPARSE_H
#include <stddef.h>
#include <stdint.h>

#include "deepinfer.h"
#include "recipe/encode.h"

/* di_finish_reason and di_finish_reason_name are declared in deepinfer.h (shared with the
 * engine). */

typedef enum di_out_kind {
    DI_OUT_REASONING = 0,      /* text delta of the reasoning */
    DI_OUT_CONTENT,            /* text delta of the answer */
    DI_OUT_TOOL_START,         /* tool_index, tool_id, tool_name */
    DI_OUT_TOOL_ARGS,          /* tool_index, text = arguments JSON fragment */
    DI_OUT_TOOL_END,           /* tool_index, tool_valid */
    DI_OUT_FINISH              /* finish, detail */
} di_out_kind;

typedef struct di_out_event {
    di_out_kind kind;
    const char *text;          /* deltas; NUL-terminated */
    size_t len;
    int tool_index;
    const char *tool_id;
    const char *tool_name;
    int tool_valid;
    di_finish_reason finish;
    const char *detail;        /* FINISH: error description or matched stop string; else NULL */
} di_out_event;

typedef struct di_out_tool_call {
    char *id;
    char *name;
    char *arguments;           /* JSON text as emitted */
    int complete;              /* <call_end> seen */
    int valid;                 /* complete and arguments parse as a JSON object */
} di_out_tool_call;

typedef struct di_out_result {
    char *reasoning;           /* NUL-terminated, never NULL after create */
    size_t reasoning_len;
    char *content;
    size_t content_len;
    di_out_tool_call *calls;
    size_t n_calls;
    di_finish_reason finish;   /* DI_FINISH_NONE until finished */
    char *detail;              /* or NULL */
    size_t n_tokens;           /* tokens fed with di_outparse_feed */
    size_t n_reasoning_tokens; /* of which produced while reasoning */
} di_out_result;

/* Token ids the parser reacts to; -1 = not in this vocabulary. */
typedef struct di_outparse_config {
    di_chat_format format;      /* tool-call syntax: V3/R1 fenced, V3.1 bare */
    int starts_in_reasoning;    /* the prompt ended with <think> (see di_chat_format_starts_in_reasoning) */
    int32_t id_think, id_think_end;
    int32_t id_calls_begin, id_calls_end, id_call_begin, id_call_end, id_sep;
    int32_t id_eos;             /* <｜end▁of▁sentence｜> */
    int32_t stop_ids[8];        /* further end tokens (e.g. <|EOT|>), -1 padded */
    const char *tool_id_prefix; /* "call_" (OpenAI) or "toolu_" (Anthropic); NULL = "call_" */
    uint64_t tool_id_seed;      /* ids are di_recipe_make_id(prefix, seed, call index) */
} di_outparse_config;

/* The ids of the DeepSeek-V3 vocabulary (no think tokens: V3 has none; R1/V3.1 tokenizers use
 * di_outparse_config_from_tokenizer). */
void di_outparse_config_default(di_outparse_config *c, di_chat_format format);
struct di_tokenizer;
/* Looks every control token up by its string in tok (prompt_ids.c); missing ones stay -1. */
void di_outparse_config_from_tokenizer(di_outparse_config *c, di_chat_format format,
                                       const struct di_tokenizer *tok);

typedef struct di_outparse di_outparse;
di_outparse *di_outparse_create(const di_outparse_config *cfg);
void di_outparse_free(di_outparse *p);

/* One generated token: control ids act, any other id contributes its bytes as text. */
di_status di_outparse_feed(di_outparse *p, int32_t id, const char *bytes, size_t len);
/* Plain generated text (no control tokens), split anywhere, even inside a character. */
di_status di_outparse_feed_text(di_outparse *p, const char *bytes, size_t len);
/* Ends the stream for a reason the parser cannot see (token limit, stop string, abort, or STOP
 * when the engine stopped on an id itself). No-op if already finished by an end token. */
di_status di_outparse_finish(di_outparse *p, di_finish_reason reason, const char *detail);
int di_outparse_done(const di_outparse *p);

/* Events produced since the previous call (coalesced per kind); valid until the next call of
 * any di_outparse_* function on p. */
const di_out_event *di_outparse_events(di_outparse *p, size_t *n);
/* The accumulated result (complete after finish). */
const di_out_result *di_outparse_result(const di_outparse *p);
#endif
