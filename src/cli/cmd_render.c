/* cmd_render.c - `deepinfer render`: render chat conversations with a DeepSeek chat format.
 *
 *   deepinfer render --tokenizer DIR --jsonl [--format v3|r1|v3.1] [--input FILE] [--ids] [--tools-prompt]
 *
 * Reads JSON lines {"messages": [...], "tools": [...], "add_generation_prompt": true,
 * "thinking": false} (Chat Completions message shape; every Chat Completions request field is
 * accepted) from stdin or FILE and prints one line {"prompt": "..."} per input line, the prompt
 * rendered as text with special tokens spelled as strings. bos/eos strings come from
 * DIR/tokenizer_config.json when present. --ids loads DIR's tokenizer and adds "ids": the prompt's
 * token ids (control tokens by id, all other text in the tokenizer's safe mode). A bad line prints {"error": {...}} in its place (so
 * output lines stay aligned with input lines), its message on stderr, and the exit code is 1. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json_util.h"
#include "core/mmap_file.h"
#include "core/status.h"
#include "recipe/encode.h"
#include "recipe/proto.h"
#include "tokenizer/tokenizer.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: deepinfer render --tokenizer DIR --jsonl [--format v3|r1|v3.1] [--input FILE] [--ids]\n"
            "                        [--tools-prompt]\n"
            "\n"
            "Renders each input line {\"messages\": [...], \"tools\": [...], \"add_generation_prompt\": bool,\n"
            "\"thinking\": bool} (OpenAI Chat Completions message shape) with a DeepSeek chat format and\n"
            "prints {\"prompt\": \"...\"} per line (special tokens as their strings).\n"
            "\n"
            "  --tokenizer DIR  tokenizer directory (bos/eos strings from its tokenizer_config.json)\n"
            "  --jsonl          input is JSON lines (the only input mode)\n"
            "  --format F       v3 (default: DeepSeek-V3 template), r1 (DeepSeek-R1), v3.1 (DeepSeek-V3.1)\n"
            "  --input FILE     read FILE instead of stdin\n"
            "  --ids            also print \"ids\": the prompt's token ids (loads DIR's tokenizer.json;\n"
            "                   user/tool text is encoded so that it can never become a control token)\n"
            "  --tools-prompt   v3.1: describe the line's tools in the system prompt as the DeepSeek-V3.1\n"
            "                   model card lays out (the template itself renders no tools)\n");
}

/* bos_token / eos_token of tokenizer_config.json: a string or {"content": "..."}. */
static char *token_field(json_t *cfg, const char *key) {
    json_t *v = json_object_get(cfg, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_is_string(v) ? strdup(json_string_value(v)) : NULL;
}

static int load_specials(const char *dir, char **bos, char **eos) {
    char *cfg_path = di_path_join(dir, "tokenizer_config.json");
    char *tok_path = di_path_join(dir, "tokenizer.json");
    int rc = 0;
    if (!cfg_path || !tok_path) {
        fprintf(stderr, "deepinfer render: out of memory\n");
        rc = 1;
    } else if (di_file_exists(cfg_path)) {
        json_t *cfg;
        if (di_json_load_file(cfg_path, &cfg) != DI_OK) {
            fprintf(stderr, "deepinfer render: %s\n", di_last_error());
            rc = 1;
        } else {
            *bos = token_field(cfg, "bos_token");
            *eos = token_field(cfg, "eos_token");
            json_decref(cfg);
        }
    } else if (!di_file_exists(tok_path)) {
        fprintf(stderr, "deepinfer render: %s: no tokenizer_config.json or tokenizer.json in this directory\n", dir);
        rc = 1;
    }
    free(cfg_path);
    free(tok_path);
    return rc;
}

static void print_error(size_t line_no, const char *msg, const di_api_error *api) {
    json_t *err = json_pack("{s:{s:I, s:s}}", "error", "line", (json_int_t)line_no, "message", msg);
    if (api && api->param[0]) json_object_set_new(json_object_get(err, "error"), "param", json_string(api->param));
    char *s = json_dumps(err, JSON_COMPACT);
    if (s) printf("%s\n", s);
    free(s);
    json_decref(err);
    fprintf(stderr, "deepinfer render: line %zu: %s\n", line_no, msg);
}

/* Renders one input line; returns 0 on success. */
static int render_line(const char *line, size_t len, size_t line_no, di_chat_format fmt, const char *bos,
                       const char *eos, const di_tokenizer *tok, int tools_prompt, di_prompt *prompt) {
    json_error_t je;
    json_t *req = json_loadb(line, len, JSON_REJECT_DUPLICATES, &je);
    if (!req) {
        char msg[300];
        snprintf(msg, sizeof msg, "invalid JSON at column %d: %s", je.column, je.text);
        print_error(line_no, msg, NULL);
        return 1;
    }
    di_conv *conv = NULL;
    di_api_error api;
    int rc = 0;
    if (di_chat_request_parse(req, DI_CONVERT_RENDER_LINE, &conv, &api) != DI_OK) {
        print_error(line_no, api.message, &api);
        rc = 1;
    } else {
        di_encode_opts o = {.format = fmt,
                            .add_generation_prompt = conv->opt.add_generation_prompt,
                            .thinking = conv->opt.thinking,
                            .continue_final_message = conv->opt.continue_final_message,
                            .bos_token = bos,
                            .eos_token = eos,
                            .tools_prompt = tools_prompt && conv->opt.tool_choice != DI_TOOL_CHOICE_NONE};
        di_ids ids = {0};
        if (di_chat_encode(conv, &o, prompt) != DI_OK || (tok && di_prompt_to_ids(prompt, tok, &ids, NULL) != DI_OK)) {
            print_error(line_no, di_last_error(), NULL);
            rc = 1;
        } else {
            json_t *s = json_stringn(prompt->text, prompt->len);
            char *enc = s ? json_dumps(s, JSON_ENCODE_ANY) : NULL;
            if (!enc) {
                print_error(line_no, "out of memory", NULL);
                rc = 1;
            } else if (!tok) {
                printf("{\"prompt\": %s}\n", enc);
            } else {
                printf("{\"prompt\": %s, \"ids\": [", enc);
                for (size_t i = 0; i < ids.n; i++) printf(i ? ", %d" : "%d", (int)ids.data[i]);
                printf("]}\n");
            }
            free(enc);
            json_decref(s);
        }
        di_ids_free(&ids);
    }
    di_conv_free(conv);
    json_decref(req);
    return rc;
}

int di_cmd_render(int argc, char **argv) {
    const char *tok_dir = NULL, *input = NULL, *format = "v3";
    int jsonl = 0, want_ids = 0, tools_prompt = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--jsonl")) {
            jsonl = 1;
        } else if (!strcmp(a, "--ids")) {
            want_ids = 1;
        } else if (!strcmp(a, "--tools-prompt")) {
            tools_prompt = 1;
        } else if ((!strcmp(a, "--tokenizer") || !strcmp(a, "--format") || !strcmp(a, "--input")) && i + 1 < argc) {
            const char *v = argv[++i];
            if (!strcmp(a, "--tokenizer")) tok_dir = v;
            else if (!strcmp(a, "--format")) format = v;
            else input = v;
        } else {
            fprintf(stderr, "deepinfer render: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!tok_dir || !jsonl) {
        fprintf(stderr, "deepinfer render: --tokenizer DIR and --jsonl are required\n");
        usage(stderr);
        return 2;
    }
    int fmt = di_chat_format_parse(format);
    if (fmt < 0) {
        fprintf(stderr, "deepinfer render: unknown --format '%s' (expected v3, r1 or v3.1)\n", format);
        return 2;
    }
    char *bos = NULL, *eos = NULL;
    if (load_specials(tok_dir, &bos, &eos)) return 1;
    di_tokenizer *tok = NULL;
    if (want_ids && di_tokenizer_load(tok_dir, &tok) != DI_OK) {
        fprintf(stderr, "deepinfer render: %s\n", di_last_error());
        free(bos);
        free(eos);
        return 1;
    }
    FILE *in = stdin;
    if (input && !(in = fopen(input, "rb"))) {
        fprintf(stderr, "deepinfer render: %s: %s\n", input, strerror(errno));
        di_tokenizer_free(tok);
        free(bos);
        free(eos);
        return 1;
    }
    di_prompt prompt;
    di_prompt_init(&prompt);
    char *line = NULL;
    size_t cap = 0, line_no = 0;
    ssize_t n;
    int failed = 0;
    while ((n = getline(&line, &cap, in)) >= 0) {
        line_no++;
        size_t len = (size_t)n;
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) len--;
        size_t k = 0;
        while (k < len && (line[k] == ' ' || line[k] == '\t')) k++;
        if (k == len) continue;  /* blank line */
        failed |= render_line(line, len, line_no, (di_chat_format)fmt, bos, eos, tok, tools_prompt, &prompt);
    }
    if (ferror(in)) {
        fprintf(stderr, "deepinfer render: read error: %s\n", strerror(errno));
        failed = 1;
    }
    if (in != stdin) fclose(in);
    free(line);
    di_prompt_free(&prompt);
    di_tokenizer_free(tok);
    free(bos);
    free(eos);
    fflush(stdout);
    return failed ? 1 : 0;
}
