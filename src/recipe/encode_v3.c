/* encode_v3.c - the DeepSeek-V3 chat format: byte-identical to rendering the chat_template of
 * DeepSeek-V3's tokenizer_config.json (tests/data/recipe/templates/deepseek-v3.jinja) with
 * jinja2 as transformers' apply_chat_template does, quirks included:
 *   - tools are not rendered at all;
 *   - an assistant turn with content renders only the content (its tool calls are dropped);
 *     one with null content renders its tool calls;
 *   - `is_first` is set by the first tool call of the conversation and never reset: only that
 *     call opens with <Assistant><tool_calls_begin>; every later call (in any turn) is
 *     "\n<call_begin>...<call_end><tool_calls_end><eos>", and a single-call turn never closes
 *     its tool_calls block;
 *   - `is_output_first` is never reset: only the first tool output of the conversation opens
 *     <tool_outputs_begin>, later ones start with "\n";
 *   - <tool_outputs_end> is emitted only before an assistant turn with content or at the very
 *     end, not before a user turn;
 *   - the generation prompt <Assistant> is omitted when the conversation ends with a tool turn. */
#include "recipe/encode.h"

#include <string.h>

#include "core/status.h"

#define TEXT(s) DI_TRY(di_prompt_text(p, (s), strlen(s)))
#define SPECIAL(t) DI_TRY(di_prompt_special(p, (t)))

di_status di_encode_fenced_call(di_prompt *p, const di_tool_call *tc) {
    TEXT(tc->type ? tc->type : "function");
    SPECIAL(DI_TOK_STR_SEP);
    TEXT(tc->name);
    TEXT("\n```json\n");
    TEXT(tc->arguments);
    TEXT("\n```");
    return DI_OK;
}

di_status di_encode_v3(const di_conv *c, const di_encode_opts *o, di_prompt *p) {
    const char *eos = o->eos_token ? o->eos_token : DI_TOK_STR_EOS;
    DI_TRY(di_encode_system_prefix(c, o, p));
    int is_first = 0, is_tool = 0, is_output_first = 1;
    for (size_t i = 0; i < c->n_msgs; i++) {
        const di_message *m = &c->msgs[i];
        switch (m->role) {
        case DI_ROLE_SYSTEM:
            break;
        case DI_ROLE_USER:
            DI_TRY(di_encode_need_content(m, i));
            is_tool = 0;
            SPECIAL(DI_TOK_STR_USER);
            TEXT(m->content);
            break;
        case DI_ROLE_ASSISTANT:
            if (!m->content) {
                is_tool = 0;
                for (size_t k = 0; k < m->n_tool_calls; k++) {
                    if (!is_first) {
                        SPECIAL(DI_TOK_STR_ASSISTANT);
                        SPECIAL(DI_TOK_STR_CALLS_BEGIN);
                        SPECIAL(DI_TOK_STR_CALL_BEGIN);
                        DI_TRY(di_encode_fenced_call(p, &m->tool_calls[k]));
                        SPECIAL(DI_TOK_STR_CALL_END);
                        is_first = 1;
                    } else {
                        TEXT("\n");
                        SPECIAL(DI_TOK_STR_CALL_BEGIN);
                        DI_TRY(di_encode_fenced_call(p, &m->tool_calls[k]));
                        SPECIAL(DI_TOK_STR_CALL_END);
                        SPECIAL(DI_TOK_STR_CALLS_END);
                        SPECIAL(eos);
                    }
                }
            } else if (is_tool) {
                SPECIAL(DI_TOK_STR_OUTPUTS_END);
                TEXT(m->content);
                SPECIAL(eos);
                is_tool = 0;
            } else {
                SPECIAL(DI_TOK_STR_ASSISTANT);
                TEXT(m->content);
                SPECIAL(eos);
            }
            break;
        case DI_ROLE_TOOL:
            DI_TRY(di_encode_need_content(m, i));
            is_tool = 1;
            if (is_output_first) {
                SPECIAL(DI_TOK_STR_OUTPUTS_BEGIN);
                is_output_first = 0;
            } else {
                TEXT("\n");
            }
            SPECIAL(DI_TOK_STR_OUTPUT_BEGIN);
            TEXT(m->content);
            SPECIAL(DI_TOK_STR_OUTPUT_END);
            break;
        }
    }
    if (is_tool) SPECIAL(DI_TOK_STR_OUTPUTS_END);
    if (o->add_generation_prompt && !is_tool) SPECIAL(DI_TOK_STR_ASSISTANT);
    return DI_OK;
}
