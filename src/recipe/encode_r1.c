/* encode_r1.c - the DeepSeek-R1 chat format: byte-identical to jinja2 rendering of R1's
 * tokenizer_config.json chat_template (tests/data/recipe/templates/deepseek-r1.jinja). It is the
 * V3 format with these differences, all reproduced:
 *   - the generation prompt is <Assistant><think>"\n" (the model always starts by reasoning);
 *   - an assistant turn without a tool_calls field renders only the text after the LAST
 *     "</think>" of its content (earlier reasoning is dropped), unless it follows tool outputs;
 *   - an assistant turn with a tool_calls field (even empty) renders its calls and always closes
 *     with <tool_calls_end><eos>; its content is rendered (after <Assistant>) only if it comes
 *     before the conversation's first tool call; later calls start with "\n";
 *   - tool outputs after the first are not preceded by "\n". */
#include "recipe/encode.h"

#include <string.h>

#include "core/status.h"

#define TEXT(s) DI_TRY(di_prompt_text(p, (s), strlen(s)))
#define SPECIAL(t) DI_TRY(di_prompt_special(p, (t)))

/* Text after the last occurrence of "</think>" (Python: s.split('</think>')[-1]). */
static const char *after_last_think_end(const char *s) {
    const char *r = s, *q;
    while ((q = strstr(r, DI_TOK_STR_THINK_END)) != NULL) r = q + strlen(DI_TOK_STR_THINK_END);
    return r;
}

di_status di_encode_r1(const di_conv *c, const di_encode_opts *o, di_prompt *p) {
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
            if (m->has_tool_calls_field) {
                is_tool = 0;
                for (size_t k = 0; k < m->n_tool_calls; k++) {
                    if (!is_first) {
                        SPECIAL(DI_TOK_STR_ASSISTANT);
                        if (m->content) TEXT(m->content);
                        SPECIAL(DI_TOK_STR_CALLS_BEGIN);
                        is_first = 1;
                    } else {
                        TEXT("\n");
                    }
                    SPECIAL(DI_TOK_STR_CALL_BEGIN);
                    DI_TRY(di_encode_fenced_call(p, &m->tool_calls[k]));
                    SPECIAL(DI_TOK_STR_CALL_END);
                }
                SPECIAL(DI_TOK_STR_CALLS_END);
                SPECIAL(eos);
            } else {
                DI_TRY(di_encode_need_content(m, i));
                if (is_tool) {
                    SPECIAL(DI_TOK_STR_OUTPUTS_END);
                    TEXT(m->content);
                    is_tool = 0;
                } else {
                    SPECIAL(DI_TOK_STR_ASSISTANT);
                    TEXT(after_last_think_end(m->content));
                }
                SPECIAL(eos);
            }
            break;
        case DI_ROLE_TOOL:
            DI_TRY(di_encode_need_content(m, i));
            is_tool = 1;
            if (is_output_first) {
                SPECIAL(DI_TOK_STR_OUTPUTS_BEGIN);
                is_output_first = 0;
            }
            SPECIAL(DI_TOK_STR_OUTPUT_BEGIN);
            TEXT(m->content);
            SPECIAL(DI_TOK_STR_OUTPUT_END);
            break;
        }
    }
    if (is_tool) SPECIAL(DI_TOK_STR_OUTPUTS_END);
    if (o->add_generation_prompt && !is_tool) {
        SPECIAL(DI_TOK_STR_ASSISTANT);
        SPECIAL(DI_TOK_STR_THINK);
        TEXT("\n");
    }
    return DI_OK;
}
