/* main.c - the `deepinfer` command-line tool: dispatches to one subcommand per file
 * (src/cli/cmd_<name>.c defines `int di_cmd_<name>(int argc, char **argv)`, returning the
 * process exit code). Commands are declared weak so that a module not yet built reports
 * "not available" instead of breaking the link. */
#include <stdio.h>
#include <string.h>

#include "deepinfer.h"

typedef int (*cmd_fn)(int argc, char **argv);

#define DECL(name) int di_cmd_##name(int argc, char **argv) __attribute__((weak));
DECL(generate)
DECL(logits)
DECL(perplexity)
DECL(mkmodel)
DECL(tokenize)
DECL(detokenize)
DECL(render)
#undef DECL

typedef struct {
    const char *name;
    cmd_fn fn;
    const char *help;
} command;

static void usage(const command *cmds, size_t n) {
    fprintf(stderr, "usage: deepinfer <command> [options]   (deepinfer <command> --help for details)\n\ncommands:\n");
    for (size_t i = 0; i < n; i++)
        fprintf(stderr, "  %-11s %s%s\n", cmds[i].name, cmds[i].help, cmds[i].fn ? "" : " (not built)");
}

int main(int argc, char **argv) {
    const command cmds[] = {
        {"generate", di_cmd_generate, "generate text for prompts or a JSONL file (offline batch)"},
        {"logits", di_cmd_logits, "write the logits of a token sequence (reference hook)"},
        {"perplexity", di_cmd_perplexity, "perplexity of a model on a text file"},
        {"mkmodel", di_cmd_mkmodel, "write a deterministic random checkpoint from a preset or config"},
        {"tokenize", di_cmd_tokenize, "text on stdin -> token ids"},
        {"detokenize", di_cmd_detokenize, "token ids on stdin -> text"},
        {"render", di_cmd_render, "render chat conversations with the model's chat format"},
    };
    const size_t n = sizeof cmds / sizeof cmds[0];
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(cmds, n);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("deepinfer 0.1.0\n");
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (strcmp(argv[1], cmds[i].name) != 0) continue;
        if (!cmds[i].fn) {
            fprintf(stderr, "deepinfer: command '%s' is not available in this build\n", argv[1]);
            return 2;
        }
        return cmds[i].fn(argc - 1, argv + 1);
    }
    fprintf(stderr, "deepinfer: unknown command '%s'\n", argv[1]);
    usage(cmds, n);
    return 2;
}
