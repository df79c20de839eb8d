/* test_pycoder_generate.c - end to end on the shipped model (models/pycoder-moe, FP8): the
 * engine's greedy completions (prompt ids, batched together) equal the greedy continuations
 * PyTorch computed for the same prompts from the same FP8 files (fp32, dequantized) at training
 * time (models/pycoder-moe/demo_prompts.json, written by tools/train/verify_export.py). Greedy
 * argmax can flip on a near-tie between two fp32 implementations; over these prompts none does,
 * so the test demands the first 48 tokens of every prompt to match. */
#include <jansson.h>

#include "core/json_util.h"
#include "core/status.h"
#include "deepinfer.h"
#include "test_util.h"

#define N_NEW 48
#define MAX_PROMPTS 16

static void test_greedy_matches_pytorch(void) {
    json_t *ref = NULL;
    CHECK_OK(di_json_load_file(test_src_path("models/pycoder-moe/demo_prompts.json"), &ref));
    if (!ref) return;
    const json_t *prompts = json_object_get(ref, "prompts");
    size_t n = json_array_size(prompts);
    CHECK(n >= 3 && n <= MAX_PROMPTS);
    if (n > MAX_PROMPTS) n = MAX_PROMPTS;
    int32_t *ids[MAX_PROMPTS] = {0};
    di_request_input reqs[MAX_PROMPTS];
    for (size_t i = 0; i < n; i++) {
        const json_t *p = json_object_get(json_array_get(prompts, i), "prompt_ids");
        size_t m = json_array_size(p);
        ids[i] = malloc(m * sizeof(int32_t));
        for (size_t j = 0; j < m; j++) ids[i][j] = (int32_t)json_integer_value(json_array_get(p, j));
        di_request_input_init(&reqs[i]);
        reqs[i].prompt_ids = ids[i];
        reqs[i].n_prompt_ids = m;
        reqs[i].sampling.temperature = 0.0;
        reqs[i].sampling.max_tokens = N_NEW;
        reqs[i].sampling.ignore_eos = 1;
    }
    di_engine_params ep;
    di_engine_params_init(&ep);
    ep.model_dir = test_src_path("models/pycoder-moe");
    ep.kv_blocks = 64;
    di_engine *e = NULL;
    CHECK_OK(di_engine_create(&ep, &e));
    di_request_output *out = NULL;
    if (e) CHECK_OK(di_generate(e, reqs, n, &out));
    for (size_t i = 0; out && i < n; i++) {
        const json_t *want = json_object_get(json_array_get(prompts, i), "greedy_ids");
        CHECK(json_array_size(want) >= N_NEW);
        CHECK_EQ_INT(out[i].n_choices, 1);
        const di_completion_output *c = &out[i].choices[0];
        CHECK_EQ_INT(c->n_tokens, N_NEW);
        size_t first_diff = c->n_tokens;
        for (size_t j = 0; j < c->n_tokens && j < json_array_size(want); j++)
            if (c->token_ids[j] != (int32_t)json_integer_value(json_array_get(want, j))) { first_diff = j; break; }
        CHECK_MSG(first_diff == N_NEW, "prompt %zu: first mismatch at new token %zu", i, first_diff);
    }
    if (out) di_generate_results_free(out, n);
    di_engine_free(e);
    for (size_t i = 0; i < n; i++) free(ids[i]);
    json_decref(ref);
}

TEST_MAIN(test_greedy_matches_pytorch)
