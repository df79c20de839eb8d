/* prompt_ids.c - the token-id side of the recipe layer (the only recipe file that calls the
 * tokenizer): a rendered di_prompt -> token ids, the output parser's control ids looked up in a
 * tokenizer, and the one-call path from a request line to prompt ids used by the engine.
 *
 * Invariant: special segments become exactly one id each (looked up by string); all other text
 * is encoded with DI_TOK_SAFE, so user- or tool-supplied text never yields a control token.
 * Text runs are encoded whole (never split at template/user boundaries) so the ids equal what
 * Hugging Face's tokenizer produces for the rendered prompt whenever the user text spells no
 * special token. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/hash.h"
#include "core/status.h"
#include "recipe/recipe.h"

/* Control tokens that fall back to plain text when the vocabulary lacks them. */
static int may_fall_back(const char *s, size_t n) {
    return (n == strlen(DI_TOK_STR_THINK) && !memcmp(s, DI_TOK_STR_THINK, n)) ||
           (n == strlen(DI_TOK_STR_THINK_END) && !memcmp(s, DI_TOK_STR_THINK_END, n));
}

di_status di_prompt_to_ids(const di_prompt *p, const di_tokenizer *tok, di_ids *out, size_t *n_text_fallbacks) {
    size_t fallbacks = 0;
    size_t run_off = 0, run_len = 0;  /* pending text run: contiguous bytes of p->text */
    char name[128];
    for (size_t i = 0; i <= p->n_segs; i++) {
        const di_seg *s = i < p->n_segs ? &p->segs[i] : NULL;
        int32_t id = -1;
        if (s && s->kind == DI_SEG_SPECIAL) {
            if (s->len >= sizeof name)
                return di_error(DI_ERR_INVALID_ARG, "prompt: control token of %zu bytes is too long", s->len);
            memcpy(name, p->text + s->off, s->len);
            name[s->len] = '\0';
            id = di_tokenizer_token_id(tok, name);
            if (id < 0 && !may_fall_back(name, s->len))
                return di_error(DI_ERR_NOT_FOUND, "prompt: the tokenizer has no token '%s' required by this chat format",
                                name);
            if (id < 0) fallbacks++;
        }
        if (s && (s->kind == DI_SEG_TEXT || id < 0)) {  /* extend the text run */
            if (run_len == 0) run_off = s->off;
            run_len = s->off + s->len - run_off;
            continue;
        }
        if (run_len) {
            DI_TRY(di_tokenizer_encode(tok, p->text + run_off, run_len, DI_TOK_SAFE, out));
            run_len = 0;
        }
        if (s) DI_TRY(di_ids_push(out, id));
    }
    if (n_text_fallbacks) *n_text_fallbacks = fallbacks;
    return DI_OK;
}

void di_outparse_config_from_tokenizer(di_outparse_config *c, di_chat_format format, const di_tokenizer *tok) {
    di_outparse_config_default(c, format);
    c->id_think = di_tokenizer_token_id(tok, DI_TOK_STR_THINK);
    c->id_think_end = di_tokenizer_token_id(tok, DI_TOK_STR_THINK_END);
    c->id_calls_begin = di_tokenizer_token_id(tok, DI_TOK_STR_CALLS_BEGIN);
    c->id_calls_end = di_tokenizer_token_id(tok, DI_TOK_STR_CALLS_END);
    c->id_call_begin = di_tokenizer_token_id(tok, DI_TOK_STR_CALL_BEGIN);
    c->id_call_end = di_tokenizer_token_id(tok, DI_TOK_STR_CALL_END);
    c->id_sep = di_tokenizer_token_id(tok, DI_TOK_STR_SEP);
    int32_t eos = di_tokenizer_eos_id(tok);
    c->id_eos = eos >= 0 ? eos : di_tokenizer_token_id(tok, DI_TOK_STR_EOS);
    for (int i = 0; i < 8; i++) c->stop_ids[i] = -1;
    c->stop_ids[0] = di_tokenizer_token_id(tok, DI_TOK_STR_EOT);
}

void di_recipe_request_clear(di_recipe_request *r) {
    di_conv_free(r->conv);
    di_prompt_free(&r->prompt);
    di_ids_free(&r->ids);
    memset(r, 0, sizeof *r);
}

di_status di_recipe_request_prepare(di_proto proto, const json_t *body, unsigned flags, di_chat_format format,
                                    const di_tokenizer *tok, di_recipe_request *out, di_api_error *err) {
    memset(out, 0, sizeof *out);
    di_prompt_init(&out->prompt);
    out->format = format;
    DI_TRY(di_request_parse(proto, body, flags, &out->conv, err));
    const di_conv *c = out->conv;
    di_encode_opts o = {.format = format,
                        .add_generation_prompt = c->opt.add_generation_prompt,
                        .thinking = c->opt.thinking,
                        .continue_final_message = c->opt.continue_final_message,
                        .tools_prompt = format == DI_CHAT_FORMAT_V31 && c->n_tools > 0 &&
                                        c->opt.tool_choice != DI_TOOL_CHOICE_NONE};
    di_status s = di_chat_encode(c, &o, &out->prompt);
    if (s == DI_OK) s = di_prompt_to_ids(&out->prompt, tok, &out->ids, &out->n_text_fallbacks);
    if (s != DI_OK) {
        memset(err, 0, sizeof *err);
        err->http_status = s == DI_ERR_INVALID_ARG ? 400 : 500;
        snprintf(err->type, sizeof err->type, "%s", s == DI_ERR_INVALID_ARG ? "invalid_request_error" : "api_error");
        snprintf(err->message, sizeof err->message, "%s", di_last_error());
        di_recipe_request_clear(out);
        return s;
    }
    di_outparse_config_from_tokenizer(&out->parser, format, tok);
    /* decided from the prompt itself, so a continued (prefilled) reasoning block counts too */
    out->parser.starts_in_reasoning = di_prompt_ends_in_reasoning(&out->prompt);
    out->parser.tool_id_prefix = proto == DI_PROTO_MESSAGES ? "toolu_" : "call_";
    out->parser.tool_id_seed = c->params.has_seed ? (uint64_t)c->params.seed
                                                  : di_hash64(out->prompt.text, out->prompt.len, 0x746f6f6c2d696473ull);
    return DI_OK;
}
