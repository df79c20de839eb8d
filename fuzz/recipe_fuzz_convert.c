/* recipe_fuzz_convert.c - libFuzzer target for the protocol converters and chat encoders.
 * Input: byte 0 selects the protocol (Chat Completions / Responses / Anthropic Messages) and
 * flags; the rest is parsed as the request JSON. Accepted requests are encoded with every chat
 * format; rejected ones must produce an error body. Crashes, leaks, UB and malformed error
 * objects are the failures looked for. Build and run: see docs/recipe.md ("Fuzzing"). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "recipe/encode.h"
#include "recipe/proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    di_proto proto = (di_proto)(data[0] % 3);
    unsigned flags = (data[0] >> 2) & 1 ? DI_CONVERT_RENDER_LINE : 0;
    json_t *req = json_loadb((const char *)data + 1, size - 1, JSON_DECODE_ANY, NULL);
    if (!req) return 0;
    di_conv *c = NULL;
    di_api_error e;
    if (di_request_parse(proto, req, flags, &c, &e) == DI_OK) {
        di_prompt p;
        di_prompt_init(&p);
        for (int f = 0; f < 3; f++) {
            di_encode_opts o = {.format = (di_chat_format)f,
                                .add_generation_prompt = c->opt.add_generation_prompt,
                                .thinking = c->opt.thinking,
                                .continue_final_message = c->opt.continue_final_message,
                                .tools_prompt = 1};
            if (di_chat_encode(c, &o, &p) == DI_OK && strlen(p.text) != p.len) __builtin_trap();
        }
        di_prompt_free(&p);
        di_conv_free(c);
    } else {
        if (e.message[0] == '\0') __builtin_trap();
        json_t *body = di_api_error_json(&e, proto);
        if (!body) __builtin_trap();
        json_decref(body);
    }
    json_decref(req);
    return 0;
}
