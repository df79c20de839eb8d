/* recipe_fuzz_parser.c - libFuzzer target for the streaming output parser and the stream
 * renderers. The input is read as a token stream: byte 0 picks the chat format and options;
 * then each step is a tag byte (a control token, or text of 1..16 bytes taken from the input).
 * The stream is parsed twice, token by token and with all text fed byte by byte through
 * di_outparse_feed_text; the final results must be identical (else __builtin_trap), and the
 * events are rendered by all three protocols' stream renderers. Build and run: docs/recipe.md. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "recipe/outparse.h"
#include "recipe/proto.h"

static const int32_t CONTROL[] = {128798, 128799, 128806, 128807, 128808, 128809, 128814, 1, 128805};

static di_outparse *run(const di_outparse_config *cfg, const uint8_t *d, size_t n, int bytewise, di_proto proto) {
    di_outparse *p = di_outparse_create(cfg);
    if (!p) return NULL;
    di_render_meta m = {.id = "fuzz", .model = "m", .created = 1, .prompt_tokens = 3};
    di_stream *st = di_stream_create(proto, &m, 1, 0);
    json_t *out = json_array();
    di_stream_begin(st, out);
    size_t i = 1;
    while (i < n) {
        uint8_t tag = d[i++];
        if (tag < 2 * (sizeof CONTROL / sizeof CONTROL[0])) {
            di_outparse_feed(p, CONTROL[tag >> 1], "", 0);
        } else {
            size_t len = 1 + (tag & 15);
            if (len > n - i) len = n - i;
            if (!bytewise) {
                di_outparse_feed(p, 5000, (const char *)d + i, len);
            } else {
                for (size_t k = 0; k < len; k++) di_outparse_feed_text(p, (const char *)d + i + k, 1);
            }
            i += len;
        }
        size_t ne;
        const di_out_event *ev = di_outparse_events(p, &ne);
        di_stream_events(st, ev, ne, out);
    }
    di_outparse_finish(p, (d[0] & 8) ? DI_FINISH_LENGTH : DI_FINISH_STOP, NULL);
    size_t ne;
    const di_out_event *ev = di_outparse_events(p, &ne);
    di_stream_events(st, ev, ne, out);
    di_stream_end(st, di_outparse_result(p), out);
    char *sse = NULL;
    di_sse_format(out, &sse, NULL);
    free(sse);
    json_decref(out);
    di_stream_free(st);
    return p;
}

static int same(const di_out_result *a, const di_out_result *b) {
    if (a->reasoning_len != b->reasoning_len || memcmp(a->reasoning, b->reasoning, a->reasoning_len)) return 0;
    if (a->content_len != b->content_len || memcmp(a->content, b->content, a->content_len)) return 0;
    if (a->n_calls != b->n_calls || a->finish != b->finish) return 0;
    for (size_t i = 0; i < a->n_calls; i++)
        if (strcmp(a->calls[i].arguments, b->calls[i].arguments) || strcmp(a->calls[i].name, b->calls[i].name) ||
            a->calls[i].valid != b->calls[i].valid)
            return 0;
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    di_outparse_config cfg;
    di_outparse_config_default(&cfg, (di_chat_format)(data[0] % 3));
    if (data[0] & 4) {
        cfg.id_think = 128798;
        cfg.id_think_end = 128799;
    }
    cfg.starts_in_reasoning = (data[0] >> 4) & 1;
    di_proto proto = (di_proto)((data[0] >> 5) % 3);
    di_outparse *a = run(&cfg, data, size, 0, proto);
    di_outparse *b = run(&cfg, data, size, 1, proto);
    if (a && b && !same(di_outparse_result(a), di_outparse_result(b))) __builtin_trap();
    di_outparse_free(a);
    di_outparse_free(b);
    return 0;
}
