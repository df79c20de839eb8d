/* encode_v31.c - the DeepSeek-V3.1 chat format (hybrid thinking): byte-identical to jinja2
 * rendering of V3.1's chat_template (tests/data/recipe/templates/deepseek-v3.1.jinja):
 *   - a turn after a user turn opens with <Assistant> then "</think>" (non-thinking) or, for a
 *     prefix-completion assistant turn in thinking mode, "<think>";
 *   - tool calls are <tool_calls_begin><call_begin>NAME<sep>ARGS<call_end>...<tool_calls_end>
 *     <eos> (no type, no json fence); content before the calls is rendered bare;
 *   - an assistant turn without tool calls renders the text after the FIRST "</think>" of its
 *     content, unless it follows tool outputs (then the content as is);
 *   - tool outputs are <tool_output_begin>...<tool_output_end> with no outputs begin/end;
 *   - the generation prompt <Assistant> + "</think>" / "<think>" (thinking) is added only when
 *     the last turn was a user turn (after tool outputs the model continues directly). */
#include "recipe/encode.h"

#include <string.h>

#include "core/status.h"

#define TEXT(s) DI_TRY(di_prompt_text(p, (s), strlen(s)))
#define SPECIAL(t) DI_TRY(di_prompt_special(p, (t)))

static di_status need_content(const di_message *m, size_t i) {
    if (!m->content)
        return di_error(DI_ERR_INVALID_ARG, "messages[%zu]: %s message content is null", i, di_role_name(m->role));
    return DI_OK;
}

/* Text after the first "</think>" (Python: s.split('</think>', 1)[1]), or s if none. */
static const char *after_first_think_end(const char *s) {
    const char *q = strstr(s, DI_TOK_STR_THINK_END);
    return q ? q + strlen(DI_TOK_STR_THINK_END) : s;
}

static di_status call(di_prompt *p, const di_tool_call *tc) {
    SPECIAL(DI_TOK_STR_CALL_BEGIN);
    TEXT(tc->name);
    SPECIAL(DI_TOK_STR_SEP);
    TEXT(tc->arguments);
    SPECIAL(DI_TOK_STR_CALL_END);
    return DI_OK;
}

di_status di_encode_v31(const di_conv *c, const di_encode_opts *o, di_prompt *p) {
    const char *eos = o->eos_token ? o->eos_token : DI_TOK_STR_EOS;
    int thinking = o->thinking == DI_THINKING_ON;
    DI_TRY(di_encode_system_prefix(c, o, p));
    int is_tool = 0, is_last_user = 0;
    for (size_t i = 0; i < c->n_msgs; i++) {
        const di_message *m = &c->msgs[i];
        switch (m->role) {
        case DI_ROLE_SYSTEM:
            break;
        case DI_ROLE_USER:
            DI_TRY(need_content(m, i));
            is_tool = 0;
            is_last_user = 1;
            SPECIAL(DI_TOK_STR_USER);
            TEXT(m->content);
            break;
        case DI_ROLE_ASSISTANT:
            if (m->has_tool_calls_field) {
                if (is_last_user) {
                    SPECIAL(DI_TOK_STR_ASSISTANT);
                    SPECIAL(DI_TOK_STR_THINK_END);
                }
                is_last_user = 0;
                is_tool = 0;
                for (size_t k = 0; k < m->n_tool_calls; k++) {
                    if (k == 0) {
                        if (m->content) TEXT(m->content);
                        SPECIAL(DI_TOK_STR_CALLS_BEGIN);
                    }
                    DI_TRY(call(p, &m->tool_calls[k]));
                }
                SPECIAL(DI_TOK_STR_CALLS_END);
                SPECIAL(eos);
            } else {
                if (is_last_user) {
                    SPECIAL(DI_TOK_STR_ASSISTANT);
                    SPECIAL(m->prefix && thinking ? DI_TOK_STR_THINK : DI_TOK_STR_THINK_END);
                }
                is_last_user = 0;
                DI_TRY(need_content(m, i));
                if (is_tool) {
                    TEXT(m->content);
                    is_tool = 0;
                } else {
                    TEXT(after_first_think_end(m->content));
                }
                SPECIAL(eos);
            }
            break;
        case DI_ROLE_TOOL:
            DI_TRY(need_content(m, i));
            is_last_user = 0;
            is_tool = 1;
            SPECIAL(DI_TOK_STR_OUTPUT_BEGIN);
            TEXT(m->content);
            SPECIAL(DI_TOK_STR_OUTPUT_END);
            break;
        }
    }
    if (o->add_generation_prompt && is_last_user && !is_tool) {
        SPECIAL(DI_TOK_STR_ASSISTANT);
        SPECIAL(thinking ? DI_TOK_STR_THINK : DI_TOK_STR_THINK_END);
    }
    return DI_OK;
}
