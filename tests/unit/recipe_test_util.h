/* recipe_test_util.h - helpers shared by the chat-format tests (test_recipe_render.c,
 * test_recipe_ids.c): the xz-compressed jinja2 reference fixtures of tests/data/recipe/render
 * (whole, or split into lines) and `deepinfer render`-style conversations (Chat Completions
 * request lines) parsed into a di_conv. Include after test_util.h. */
#ifndef DI_RECIPE_TEST_UTIL_H
#define DI_RECIPE_TEST_UTIL_H
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_test_util.h"
#include "recipe/proto.h"

/* A committed xz fixture of tests/data/recipe/render, decompressed (caller frees), or NULL. */
static inline char *recipe_fixture(const char *name, size_t *len) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "xz -dc '%s/%s.xz'", test_src_path("tests/data/recipe/render"), name);
    char *s = test_command_output(cmd, len);
    if (!s) fprintf(stderr, "cannot read fixture %s (%s)\n", name, cmd);
    return s;
}

/* A fixture split into its *n lines (pointers into *data; caller frees both), or NULL. */
static inline char **recipe_fixture_lines(const char *name, size_t *n, char **data) {
    *n = 0;
    if (!(*data = recipe_fixture(name, NULL))) return NULL;
    size_t cap = 512;
    char **lines = malloc(cap * sizeof *lines);
    for (char *p = *data; p && *p;) {
        char *nl = strchr(p, '\n');
        if (nl) *nl = '\0';
        if (*n == cap) lines = realloc(lines, (cap *= 2) * sizeof *lines);
        lines[(*n)++] = p;
        p = nl ? nl + 1 : NULL;
    }
    return lines;
}

/* A render line (Chat Completions request JSON) as a conv, or NULL (the error printed). */
static inline di_conv *recipe_conv_of(const char *line) {
    json_t *req = json_loads(line, 0, NULL);
    di_conv *c = NULL;
    di_api_error e;
    if (di_chat_request_parse(req, DI_CONVERT_RENDER_LINE, &c, &e) != DI_OK) fprintf(stderr, "%s\n", e.message);
    json_decref(req);
    return c;
}
#endif
