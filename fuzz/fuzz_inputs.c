/* fuzz_inputs.c - libFuzzer target for the parsers of what users hand the engine: a
 * safetensors file (header, dtypes, shapes, offsets), a config.json (the model config and its
 * validation, RoPE scaling included) and a request line of `deepinfer generate --input`
 * (OpenAI-shaped JSON, sampling fields, stops, logit bias). The first input byte picks the
 * parser, the rest is the file / JSON. Every input must give DI_OK or an error with a message;
 * nothing may crash, leak or read out of bounds (ASan + UBSan).
 *
 *   bash fuzz/build_inputs_fuzz.sh && build-fuzz/fuzz_inputs -max_total_time=60 fuzz/corpus/inputs
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/status.h"
#include "engine/request_json.h"
#include "io/config.h"
#include "io/safetensors.h"

static char g_path[64];

static void check_message(di_status s) {
    if (s != DI_OK && !di_last_error()[0]) {
        fprintf(stderr, "fuzz_inputs: error %d without a message\n", (int)s);
        abort();
    }
    di_error_clear();
}

static void fuzz_safetensors(const uint8_t *data, size_t size) {
    if (!g_path[0]) snprintf(g_path, sizeof g_path, "/tmp/fuzz_inputs_%d.safetensors", (int)getpid());
    FILE *f = fopen(g_path, "wb");
    if (!f) return;
    if (size && fwrite(data, 1, size, f) != size) {
        fclose(f);
        return;
    }
    fclose(f);
    di_weights *w = NULL;
    di_status s = di_weights_open(g_path, &w);
    check_message(s);
    if (s == DI_OK) {
        /* every tensor's bytes are inside the map: touch the first and last */
        volatile uint8_t sink = 0;
        for (size_t i = 0; i < di_weights_count(w); i++) {
            const di_tensor_info *t = di_weights_at(w, i);
            if (t->nbytes) sink ^= ((const uint8_t *)t->data)[0] ^ ((const uint8_t *)t->data)[t->nbytes - 1];
            (void)di_weights_find(w, t->name);
        }
        (void)sink;
        (void)di_weights_metadata(w, "format");
        di_weights_free(w);
    }
}

static void fuzz_config(const uint8_t *data, size_t size) {
    json_error_t je;
    json_t *root = json_loadb((const char *)data, size, 0, &je);
    if (!root) return;
    di_model_config c;
    di_status s = di_config_from_json(root, "fuzz config.json", &c);
    check_message(s);
    if (s == DI_OK) check_message(di_config_validate(&c, "fuzz config.json"));
    json_decref(root);
}

static void fuzz_request(const uint8_t *data, size_t size) {
    json_error_t je;
    json_t *obj = json_loadb((const char *)data, size, 0, &je);
    if (!obj) return;
    di_request_input def;
    di_request_input_init(&def);
    di_request_json r;
    di_status s = di_request_json_parse(obj, &def, "fuzz request", NULL, 0, &r);
    check_message(s);
    if (s == DI_OK) di_request_json_free(&r);
    json_decref(obj);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    switch (data[0] % 3) {
    case 0: fuzz_safetensors(data + 1, size - 1); break;
    case 1: fuzz_config(data + 1, size - 1); break;
    default: fuzz_request(data + 1, size - 1); break;
    }
    return 0;
}
