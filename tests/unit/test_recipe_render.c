/* test_recipe_render.c - the chat encoders against jinja2: 300 generated conversations
 * (tools/recipe/make_render_fixtures.py, committed xz-compressed under tests/data/recipe/render/ and
 * read through `xz -dc`) rendered by transformers' apply_chat_template with the real DeepSeek-V3
 * template and the R1 / V3.1 templates must equal our V3 / R1 / V3.1 encoders byte for byte;
 * the `deepinfer render` CLI must print the reference lines byte for byte. Also: prompt
 * segmentation invariants, template-error cases, continue_final_message. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "recipe/encode.h"
#include "recipe/proto.h"
#include "test_util.h"
#include "cli_test_util.h"
#include "recipe_test_util.h"

/* Segment invariants: text is the concatenation, specials are known tokens, texts not adjacent. */
static int segments_ok(const di_prompt *p) {
    size_t off = 0;
    for (size_t i = 0; i < p->n_segs; i++) {
        const di_seg *s = &p->segs[i];
        if (s->off != off) return 0;
        off += s->len;
        if (s->kind == DI_SEG_TEXT && (s->len == 0 || (i && p->segs[i - 1].kind == DI_SEG_TEXT))) return 0;
        if (s->kind == DI_SEG_SPECIAL && (s->len < 3 || p->text[s->off] != '<' || p->text[s->off + s->len - 1] != '>'))
            return 0;
    }
    return off == p->len && strlen(p->text) == p->len;
}

static void check_format(const char *fmt_name, const char *expected_file) {
    size_t n_conv, n_exp;
    char *d1, *d2;
    char **conv = recipe_fixture_lines("conversations.jsonl", &n_conv, &d1);
    char **exp = recipe_fixture_lines(expected_file, &n_exp, &d2);
    CHECK(conv && exp);
    if (!conv || !exp) return;
    CHECK_EQ_INT(n_conv, n_exp);
    CHECK(n_conv >= 200);
    di_chat_format fmt = (di_chat_format)di_chat_format_parse(fmt_name);
    size_t same = 0, segs_ok = 0, n_reasoning_checked = 0;
    di_prompt pr;
    di_prompt_init(&pr);
    for (size_t i = 0; i < n_conv && i < n_exp; i++) {
        json_t *req = json_loads(conv[i], 0, NULL), *ref = json_loads(exp[i], 0, NULL);
        di_conv *c = NULL;
        di_api_error err;
        di_status s = di_chat_request_parse(req, DI_CONVERT_RENDER_LINE, &c, &err);
        if (s == DI_OK) {
            di_encode_opts o = {.format = fmt, .add_generation_prompt = c->opt.add_generation_prompt,
                                .thinking = c->opt.thinking};
            s = di_chat_encode(c, &o, &pr);
        }
        const json_t *want = json_object_get(ref, "prompt");
        if (!want) {  /* jinja raised: we must fail too */
            CHECK_MSG(s != DI_OK, "%s line %zu: jinja raised but we rendered", fmt_name, i + 1);
            same += s != DI_OK;
        } else if (s != DI_OK) {
            CHECK_MSG(0, "%s line %zu: %s", fmt_name, i + 1, di_last_error());
        } else {
            int eq = pr.len == json_string_length(want) && !memcmp(pr.text, json_string_value(want), pr.len);
            CHECK_MSG(eq, "%s line %zu differs:\n  got  %s\n  want %s", fmt_name, i + 1, pr.text,
                      json_string_value(want));
            same += eq;
            segs_ok += segments_ok(&pr);
            if (c->opt.add_generation_prompt && c->msgs[c->n_msgs - 1].role == DI_ROLE_USER) {
                CHECK_EQ_INT(di_prompt_ends_in_reasoning(&pr), di_chat_format_starts_in_reasoning(fmt, c->opt.thinking));
                n_reasoning_checked++;
            }
        }
        di_conv_free(c);
        json_decref(req);
        json_decref(ref);
    }
    CHECK_EQ_INT(same, n_conv);
    CHECK_EQ_INT(segs_ok, n_conv);
    CHECK(n_reasoning_checked > 50);
    fprintf(stderr, "  %s: %zu/%zu conversations identical to jinja2\n", fmt_name, same, n_conv);
    di_prompt_free(&pr);
    free(conv);
    free(exp);
    free(d1);
    free(d2);
}

static void test_v3(void) { check_format("v3", "expected_v3.jsonl"); }
static void test_r1(void) { check_format("r1", "expected_r1.jsonl"); }
static void test_v31(void) { check_format("v3.1", "expected_v31.jsonl"); }

/* The CLI prints the reference lines byte for byte. */
static void check_cli(const char *fmt, const char *expected_file) {
    const char *bin = getenv("DI_BIN");
    if (!bin) bin = "build/bin/deepinfer";
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "xz -dc '%s/conversations.jsonl.xz' | '%s' render --tokenizer '%s' --jsonl --format %s",
             test_src_path("tests/data/recipe/render"), bin, test_src_path("tests/data/recipe/deepseek-v3-config"), fmt);
    size_t gl = 0, wl = 0;
    char *got = test_command_output(cmd, &gl), *want = recipe_fixture(expected_file, &wl);
    CHECK_MSG(got && want && gl == wl && !memcmp(got, want, gl), "CLI output for --format %s differs", fmt);
    free(got);
    free(want);
}

static void test_cli(void) {
    check_cli("v3", "expected_v3.jsonl");
    check_cli("r1", "expected_r1.jsonl");
    check_cli("v3.1", "expected_v31.jsonl");
    /* bad lines: an error line in place, exit code 1 */
    const char *bin = getenv("DI_BIN");
    if (!bin) bin = "build/bin/deepinfer";
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "printf '%%s\\n' '{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}' '{\"messages\": 5}' "
             "'{not json' '{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", "
             "\"content\": \"Hel\"}], \"continue_final_message\": true}' | '%s' render --tokenizer '%s' --jsonl 2>/dev/null", bin,
             test_src_path("tests/data/recipe/deepseek-v3-config"));
    FILE *f = popen(cmd, "r");
    CHECK(f != NULL);
    if (!f) return;
    char line[1024];
    int n = 0;
    const char *want[4] = {"{\"prompt\": \"<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c><\xef\xbd\x9cUser\xef\xbd\x9c>hi\"}\n",
                          "{\"error\":{\"line\":2", "{\"error\":{\"line\":3",
                          "{\"prompt\": \"" DI_TOK_STR_BOS DI_TOK_STR_USER "hi" DI_TOK_STR_ASSISTANT "Hel\"}\n"};
    while (fgets(line, sizeof line, f)) {
        if (n < 4) CHECK_MSG(!strncmp(line, want[n], strlen(want[n])), "line %d: %s", n + 1, line);
        n++;
    }
    CHECK_EQ_INT(n, 4);
    int rc = pclose(f);
    CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 1);
    snprintf(cmd, sizeof cmd, "'%s' render --help > /dev/null", bin);
    CHECK_EQ_INT(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "'%s' render --jsonl < /dev/null 2>/dev/null", bin);
    CHECK(system(cmd) != 0);
    snprintf(cmd, sizeof cmd, "'%s' render --jsonl --tokenizer /nonexistent < /dev/null 2>/dev/null", bin);
    CHECK(system(cmd) != 0);
}

static void test_errors_and_options(void) {
    di_prompt p;
    di_prompt_init(&p);
    /* null system content is a template error (str + None) */
    di_conv *c = recipe_conv_of("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}");
    CHECK(c != NULL);
    if (!c) return;
    free(c->msgs[0].content);
    c->msgs[0].content = NULL;
    di_encode_opts o = {.format = DI_CHAT_FORMAT_V3, .add_generation_prompt = 1, .thinking = DI_THINKING_DEFAULT};
    for (int f = 0; f < 3; f++) {
        o.format = (di_chat_format)f;
        CHECK(di_chat_encode(c, &o, &p) == DI_ERR_INVALID_ARG);
        CHECK(strstr(di_last_error(), "messages[0]") != NULL);
    }
    di_conv_free(c);

    /* continue_final_message: the last assistant text is left open */
    c = recipe_conv_of("{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, "
                "{\"role\": \"assistant\", \"content\": \"<think>a</think>Hel\"}]}");
    CHECK(c != NULL);
    if (!c) return;
    o.add_generation_prompt = 0;
    o.continue_final_message = 1;
    o.format = DI_CHAT_FORMAT_V3;
    CHECK_OK(di_chat_encode(c, &o, &p));
    CHECK_EQ_STR(p.text, DI_TOK_STR_BOS DI_TOK_STR_USER "Hi" DI_TOK_STR_ASSISTANT "<think>a</think>Hel");
    o.format = DI_CHAT_FORMAT_R1;
    CHECK_OK(di_chat_encode(c, &o, &p));
    CHECK_EQ_STR(p.text, DI_TOK_STR_BOS DI_TOK_STR_USER "Hi" DI_TOK_STR_ASSISTANT "Hel");
    o.format = DI_CHAT_FORMAT_V31;
    CHECK_OK(di_chat_encode(c, &o, &p));
    CHECK_EQ_STR(p.text, DI_TOK_STR_BOS DI_TOK_STR_USER "Hi" DI_TOK_STR_ASSISTANT "</think>Hel");
    o.add_generation_prompt = 1;
    CHECK(di_chat_encode(c, &o, &p) == DI_ERR_INVALID_ARG);
    di_conv_free(c);

    /* starts-in-reasoning per format */
    CHECK(di_chat_format_starts_in_reasoning(DI_CHAT_FORMAT_R1, DI_THINKING_OFF));
    CHECK(!di_chat_format_starts_in_reasoning(DI_CHAT_FORMAT_V31, DI_THINKING_DEFAULT));
    CHECK(di_chat_format_starts_in_reasoning(DI_CHAT_FORMAT_V31, DI_THINKING_ON));
    CHECK(!di_chat_format_starts_in_reasoning(DI_CHAT_FORMAT_V3, DI_THINKING_ON));
    CHECK_EQ_INT(di_chat_format_parse("v31"), DI_CHAT_FORMAT_V31);
    CHECK_EQ_INT(di_chat_format_parse("v4"), -1);
    di_prompt_free(&p);
}

/* V3.1 tool description (model-card layout). Expected text transcribed from ms-swift's
 * deepseek_v3_1 agent-template test (tests/test_align/test_template/test_agent.py), which
 * encodes the same conversation independently of us. */
static void test_v31_tools_prompt(void) {
    di_conv *c = recipe_conv_of(
        "{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"convert_temperature\", \"description\": "
        "\"Convert temperature from one unit to another\", \"parameters\": {\"type\": \"object\", \"properties\": "
        "{\"temperature\": {\"type\": \"number\", \"description\": \"The temperature value\"}, \"from_unit\": "
        "{\"type\": \"string\", \"description\": \"The unit to convert from\"}, \"to_unit\": {\"type\": \"string\", "
        "\"description\": \"The unit to convert to\"}}, \"required\": [\"temperature\", \"from_unit\", \"to_unit\"]}}}, "
        "{\"type\": \"function\", \"function\": {\"name\": \"get_current_date\", \"description\": \"Get the current "
        "date\", \"parameters\": {}}}], \"messages\": [{\"role\": \"user\", \"content\": \"Hi, I need to convert a "
        "temperature from Celsius to Fahrenheit. The temperature is 30 degrees Celsius.\"}, {\"role\": \"assistant\", "
        "\"content\": null, \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"convert_temperature\", "
        "\"arguments\": \"{\\\"temperature\\\": 30, \\\"from_unit\\\": \\\"Celsius\\\", \\\"to_unit\\\": "
        "\\\"Fahrenheit\\\"}\"}}, {\"type\": \"function\", \"function\": {\"name\": \"convert_temperature\", "
        "\"arguments\": \"{\\\"temperature\\\": 30, \\\"from_unit\\\": \\\"Celsius\\\", \\\"to_unit\\\": "
        "\\\"Fahrenheit\\\"}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": \"a\", \"content\": "
        "\"{\\\"converted_temperature\\\": 86}\"}, {\"role\": \"tool\", \"tool_call_id\": \"b\", \"content\": "
        "\"{\\\"converted_temperature\\\": 86}\"}, {\"role\": \"assistant\", \"content\": \"The converted temperature "
        "from 30 degrees Celsius to Fahrenheit is 86 degrees Fahrenheit.\"}]}");
    CHECK(c != NULL);
    if (!c) return;
    const char *want =
        DI_TOK_STR_BOS "\n\n## Tools\nYou have access to the following tools:\n\n### convert_temperature\n"
        "Description: Convert temperature from one unit to another\n\nParameters: {\"type\": \"object\", "
        "\"properties\": {\"temperature\": {\"type\": \"number\", \"description\": \"The temperature value\"}, "
        "\"from_unit\": {\"type\": \"string\", \"description\": \"The unit to convert from\"}, \"to_unit\": {\"type\": "
        "\"string\", \"description\": \"The unit to convert to\"}}, \"required\": [\"temperature\", \"from_unit\", "
        "\"to_unit\"]}\n\n### get_current_date\nDescription: Get the current date\n\nParameters: {}\n\n"
        "IMPORTANT: ALWAYS adhere to this exact format for tool use:\n" DI_TOK_STR_CALLS_BEGIN DI_TOK_STR_CALL_BEGIN
        "tool_call_name" DI_TOK_STR_SEP "tool_call_arguments" DI_TOK_STR_CALL_END "{additional_tool_calls}"
        DI_TOK_STR_CALLS_END "\n\nWhere:\n- `tool_call_name` must be an exact match to one of the available tools\n"
        "- `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters Schema\n"
        "- For multiple tool calls, chain them directly without separators or spaces" DI_TOK_STR_USER
        "Hi, I need to convert a temperature from Celsius to Fahrenheit. The temperature is 30 degrees Celsius."
        DI_TOK_STR_ASSISTANT "</think>" DI_TOK_STR_CALLS_BEGIN DI_TOK_STR_CALL_BEGIN "convert_temperature" DI_TOK_STR_SEP
        "{\"temperature\": 30, \"from_unit\": \"Celsius\", \"to_unit\": \"Fahrenheit\"}" DI_TOK_STR_CALL_END
        DI_TOK_STR_CALL_BEGIN "convert_temperature" DI_TOK_STR_SEP
        "{\"temperature\": 30, \"from_unit\": \"Celsius\", \"to_unit\": \"Fahrenheit\"}" DI_TOK_STR_CALL_END
        DI_TOK_STR_CALLS_END DI_TOK_STR_EOS DI_TOK_STR_OUTPUT_BEGIN "{\"converted_temperature\": 86}" DI_TOK_STR_OUTPUT_END
        DI_TOK_STR_OUTPUT_BEGIN "{\"converted_temperature\": 86}" DI_TOK_STR_OUTPUT_END
        "The converted temperature from 30 degrees Celsius to Fahrenheit is 86 degrees Fahrenheit." DI_TOK_STR_EOS;
    di_prompt p;
    di_prompt_init(&p);
    di_encode_opts o = {.format = DI_CHAT_FORMAT_V31, .tools_prompt = 1};
    CHECK_OK(di_chat_encode(c, &o, &p));
    CHECK_EQ_STR(p.text, want);
    CHECK(segments_ok(&p));
    /* the format block's control tokens are control segments; tool text is plain text */
    size_t n_special = 0;
    for (size_t i = 0; i < p.n_segs; i++) n_special += p.segs[i].kind == DI_SEG_SPECIAL;
    CHECK_EQ_INT(n_special, 5 + 1 + 2 + 2 * 4 + 2 + 4 + 1);
    /* without the option, or with V3/R1, no tool text */
    o.tools_prompt = 0;
    CHECK_OK(di_chat_encode(c, &o, &p));
    CHECK(strstr(p.text, "## Tools") == NULL);
    o.tools_prompt = 1;
    o.format = DI_CHAT_FORMAT_V3;
    CHECK_OK(di_chat_encode(c, &o, &p));
    CHECK(strstr(p.text, "## Tools") == NULL);
    di_prompt_free(&p);
    di_conv_free(c);
}

TEST_MAIN(test_v3, test_r1, test_v31, test_cli, test_errors_and_options, test_v31_tools_prompt)
