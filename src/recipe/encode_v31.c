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
 *     the last turn was a user turn (after tool outputs the model continues directly).
 * With tools_prompt, the tool description of the V3.1 model card follows the system prompt:
 * "{system}\n\n## Tools\nYou have access to the following tools:\n\n### NAME\nDescription: ...
 * \n\nParameters: {json.dumps(parameters)}\n\n" per tool, then the IMPORTANT format block whose
 * control tokens are emitted as control tokens. Layout transcribed from two third-party
 * reproductions of the card that agree (ms-swift's deepseek_v3_1 agent-template test and a
 * write-up quoting the card); not checked against the card itself. */
#include "recipe/encode.h"

#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "recipe/json_py.h"

#define TEXT(s) DI_TRY(di_prompt_text(p, (s), strlen(s)))
#define SPECIAL(t) DI_TRY(di_prompt_special(p, (t)))

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

static di_status tools_prompt(const di_conv *c, di_prompt *p) {
    TEXT("\n\n## Tools\nYou have access to the following tools:\n\n");
    for (size_t i = 0; i < c->n_tools; i++) {
        const di_tool *t = &c->tools[i];
        TEXT("### ");
        TEXT(t->name);
        TEXT("\nDescription: ");
        TEXT(t->description ? t->description : "");
        TEXT("\n\nParameters: ");
        json_t *empty = t->parameters ? NULL : json_object();
        char *params = di_json_dumps_py(t->parameters ? t->parameters : empty);
        json_decref(empty);
        if (!params) return di_error(DI_ERR_NOMEM, "out of memory rendering tool '%s'", t->name);
        di_status s = di_prompt_text(p, params, strlen(params));
        free(params);
        DI_TRY(s);
        TEXT("\n\n");
    }
    TEXT("IMPORTANT: ALWAYS adhere to this exact format for tool use:\n");
    SPECIAL(DI_TOK_STR_CALLS_BEGIN);
    SPECIAL(DI_TOK_STR_CALL_BEGIN);
    TEXT("tool_call_name");
    SPECIAL(DI_TOK_STR_SEP);
    TEXT("tool_call_arguments");
    SPECIAL(DI_TOK_STR_CALL_END);
    TEXT("{additional_tool_calls}");
    SPECIAL(DI_TOK_STR_CALLS_END);
    TEXT("\n\nWhere:\n- `tool_call_name` must be an exact match to one of the available tools\n"
         "- `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters Schema\n"
         "- For multiple tool calls, chain them directly without separators or spaces");
    return DI_OK;
}

di_status di_encode_v31(const di_conv *c, const di_encode_opts *o, di_prompt *p) {
    const char *eos = o->eos_token ? o->eos_token : DI_TOK_STR_EOS;
    int thinking = o->thinking == DI_THINKING_ON;
    DI_TRY(di_encode_system_prefix(c, o, p));
    if (o->tools_prompt && c->n_tools) DI_TRY(tools_prompt(c, p));
    int is_tool = 0, is_last_user = 0;
    for (size_t i = 0; i < c->n_msgs; i++) {
        const di_message *m = &c->msgs[i];
        switch (m->role) {
        case DI_ROLE_SYSTEM:
            break;
        case DI_ROLE_USER:
            DI_TRY(di_encode_need_content(m, i));
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
                DI_TRY(di_encode_need_content(m, i));
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
            DI_TRY(di_encode_need_content(m, i));
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
