/* test_engine_stop.c - stop strings and output text: di_stop_find / di_stop_holdback on
 * hand-made cases, then the engine with a toy codec (token t -> 1..3 letters): the text is
 * the decoded tokens; a stop string spanning token boundaries ends generation with the text
 * cut before it (OpenAI semantics), token_ids up to the token that completed it, and
 * finish_reason stop; while streaming, the shown text is always a prefix of the final text
 * and never shows a possible stop-string start; min_tokens defers stop strings; text prompts
 * go through the codec. */
#include <stdint.h>
#include <stdlib.h>

#include "engine/stop.h"
#include "test_engine_fake.h"

static void test_find(void) {
    const char *stops[] = {"world", "or", "xyz"};
    size_t at = 0;
    /* "or" completes first at its end; both matches start... "world" at 6, "or" at 7 */
    CHECK_EQ_INT(di_stop_find("hello world", 11, 0, stops, 3, &at), 0);
    CHECK_EQ_INT(at, 6);
    CHECK_EQ_INT(di_stop_find("hello wor", 9, 0, stops, 3, &at), 1);
    CHECK_EQ_INT(at, 7);
    /* text before old_len was searched already: a match ending there is not reported */
    CHECK_EQ_INT(di_stop_find("or and then", 11, 2, stops, 3, &at), -1);
    /* a match spanning the old/new boundary is found */
    CHECK_EQ_INT(di_stop_find("abxy", 4, 3, stops + 2, 1, &at), -1);
    CHECK_EQ_INT(di_stop_find("abxyz", 5, 4, stops + 2, 1, &at), 0);
    CHECK_EQ_INT(at, 2);
    CHECK_EQ_INT(di_stop_find("", 0, 0, stops, 3, &at), -1);
    /* hold-back: longest suffix that is a proper prefix of a stop string */
    CHECK_EQ_INT(di_stop_holdback("hello wo", 8, stops, 3), 2);
    CHECK_EQ_INT(di_stop_holdback("hello w", 7, stops, 3), 1);
    CHECK_EQ_INT(di_stop_holdback("hello", 5, stops, 3), 1); /* "o" starts "or" */
    CHECK_EQ_INT(di_stop_holdback("hellq", 5, stops, 3), 0);
    CHECK_EQ_INT(di_stop_holdback("xy", 2, stops, 3), 2);
    const char *rep[] = {"aab"};
    CHECK_EQ_INT(di_stop_holdback("caaa", 4, rep, 1), 2);
    CHECK_EQ_INT(di_stop_holdback("a", 1, rep, 1), 1);
}

/* reference text of a token list (EOS gives no text) */
static size_t ref_text(const int32_t *t, int n, char *out) {
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        char s[4];
        tok_text(t[i], s);
        memcpy(out + len, s, strlen(s));
        len += strlen(s);
    }
    out[len] = 0;
    return len;
}

static void test_engine_text(void) {
    engine_setup s = {.blocks = 64, .budget = 256, .max_seqs = 8, .prefix = 1, .with_codec = 1};
    di_fake_model_config fc = fake_cfg(&s);
    di_engine *e = make_engine(&s);
    /* a text prompt goes through the codec */
    di_request_input r;
    di_request_input_init(&r);
    r.prompt = "the quick brown fox";
    CHECK(di_engine_add_request(e, &r, NULL) == DI_ERR_FORMAT); /* ' ' has no token */
    CHECK(strstr(di_last_error(), "'prompt'") != NULL);
    r.prompt = "thequickbrownfox";
    r.sampling.temperature = 0.8f;
    r.sampling.has_seed = 1;
    r.sampling.seed = 3;
    r.sampling.max_tokens = 40;
    r.sampling.ignore_eos = 1;
    int32_t *pids;
    size_t np;
    CHECK_OK(toy_encode(NULL, r.prompt, strlen(r.prompt), &pids, &np));
    ref_out ro;
    ref_generate(&fc, pids, (int)np, &r.sampling, 3, 0, 40, &ro);
    char full[512];
    size_t full_len = ref_text(ro.toks, ro.n, full);
    di_request_output *res = NULL;
    CHECK_OK(di_generate(e, &r, 1, &res));
    CHECK_EQ_INT(res[0].prompt_tokens, np);
    CHECK_EQ_STR(res[0].choices[0].text, full);
    CHECK_EQ_INT(res[0].choices[0].text_len, full_len);
    di_generate_results_free(res, 1);

    /* stop strings taken from the reference text, starting inside tokens and spanning several */
    int tested = 0;
    for (size_t off = 5; off + 6 < full_len && tested < 12; off += 7, tested++) {
        char stop[8];
        size_t sl = 3 + off % 4;
        memcpy(stop, full + off, sl);
        stop[sl] = 0;
        size_t first = (size_t)(strstr(full, stop) - full);
        /* tokens until the text reaches first + sl */
        int need = 0;
        size_t got = 0;
        while (got < first + sl) {
            char t[4];
            tok_text(ro.toks[need++], t);
            got += strlen(t);
        }
        const char *stops[2] = {"QQQ", stop};
        di_request_input rs = r;
        rs.sampling.stop = stops;
        rs.sampling.n_stop = 2;
        int64_t id;
        CHECK_OK(di_engine_add_request(e, &rs, &id));
        int prefix_ok = 1, no_stop_shown = 1;
        const di_request_output *fin = NULL;
        while (di_engine_has_unfinished(e) && !fin) {
            const di_request_output *const *outs;
            size_t n;
            CHECK_OK(di_engine_step(e, &outs, &n));
            for (size_t j = 0; j < n; j++) {
                const di_completion_output *c = &outs[j]->choices[0];
                prefix_ok &= c->text_len <= first && memcmp(c->text, full, c->text_len) == 0;
                char shown[512];
                memcpy(shown, c->text, c->text_len);
                shown[c->text_len] = 0;
                no_stop_shown &= strstr(shown, stop) == NULL;
                if (outs[j]->finished) fin = outs[j];
            }
        }
        CHECK(prefix_ok && no_stop_shown);
        CHECK(fin != NULL);
        if (!fin) break;
        const di_completion_output *c = &fin->choices[0];
        CHECK_EQ_INT(c->finish_reason, DI_FINISH_STOP);
        CHECK_EQ_INT(c->text_len, first);
        CHECK(strncmp(c->text, full, first) == 0 && c->text[first] == 0);
        CHECK_EQ_STR(c->stop_reason, stop);
        CHECK_EQ_INT(c->n_tokens, need);
        CHECK(memcmp(c->token_ids, ro.toks, (size_t)need * 4) == 0);
        CHECK_EQ_INT(c->stop_token, -1);
        /* drain the final report */
        const di_request_output *const *outs;
        size_t n;
        CHECK_OK(di_engine_step(e, &outs, &n));
    }
    CHECK(tested >= 3);

    /* min_tokens: stop strings are checked from the min_tokens-th token on, over text that
     * ends after what the first min_tokens - 1 tokens produced */
    char len9buf[512];
    size_t len9 = ref_text(ro.toks, 9, len9buf);
    char two[3] = {0};
    size_t expect_at = 0;
    for (size_t p0 = 0; p0 + 2 <= len9 && !two[0]; p0++) {
        memcpy(two, full + p0, 2);
        const char *later = strstr(full + len9 - 1, two);
        if (later) expect_at = (size_t)(later - full);
        else two[0] = 0;
    }
    CHECK(two[0] != 0);
    const char *st1[1] = {two};
    di_request_input rm = r;
    rm.sampling.stop = st1;
    rm.sampling.n_stop = 1;
    rm.sampling.min_tokens = 10;
    CHECK_OK(di_generate(e, &rm, 1, &res));
    CHECK_EQ_INT(res[0].choices[0].finish_reason, DI_FINISH_STOP);
    CHECK_EQ_INT(res[0].choices[0].text_len, expect_at);
    CHECK(res[0].choices[0].n_tokens >= 10);
    di_generate_results_free(res, 1);
    free(pids);

    /* EOS ends with reason stop, kept in token_ids, no text */
    di_request_input re = r;
    re.sampling.ignore_eos = 0;
    re.sampling.temperature = 0;
    re.sampling.max_tokens = 200;
    int found_eos = 0;
    for (int trial = 0; trial < 40 && !found_eos; trial++) {
        char prompt[8];
        for (int k = 0; k < 6; k++) prompt[k] = (char)('a' + (trial * 5 + k * 7) % 26);
        prompt[6] = 0;
        re.prompt = prompt;
        CHECK_OK(toy_encode(NULL, prompt, 6, &pids, &np));
        ref_generate(&fc, pids, (int)np, &re.sampling, 0, 0, 200, &ro);
        free(pids);
        if (ro.finish != DI_FINISH_STOP) continue;
        found_eos = 1;
        CHECK_OK(di_generate(e, &re, 1, &res));
        const di_completion_output *c = &res[0].choices[0];
        CHECK_EQ_INT(c->finish_reason, DI_FINISH_STOP);
        CHECK_EQ_INT(c->stop_token, FAKE_EOS);
        CHECK_EQ_INT(c->n_tokens, ro.n);
        CHECK_EQ_INT(c->token_ids[c->n_tokens - 1], FAKE_EOS);
        ref_text(ro.toks, ro.n, full);
        CHECK_EQ_STR(c->text, full);
        di_generate_results_free(res, 1);
    }
    CHECK(found_eos);
    di_engine_stats st;
    di_engine_get_stats(e, &st);
    CHECK_EQ_INT(st.kv_blocks_free, 64);
    di_engine_free(e);
}

TEST_MAIN(test_find, test_engine_text)
