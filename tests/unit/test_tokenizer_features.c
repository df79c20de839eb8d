/* test_tokenizer_features.c - every supported tokenizer.json component against Hugging Face
 * `tokenizers`, on small tokenizers made by tools/tokenizer/gen_feature_cases.py
 * (tests/data/tokenizer_features: 112 variants x ~400 strings): ByteLevel with/without regex and
 * prefix space, Split with all behaviors / invert / String and Regex patterns (empty matches,
 * anchors, look-around, (?i), \p{..}, \h, {,n}, POSIX classes), Digits, all normalizers,
 * TemplateProcessing / Roberta / Bert / Sequence post-processors, added tokens with lstrip /
 * rstrip / single_word / normalized, BPE ignore_merges / unk / fuse_unk / byte_fallback /
 * continuing_subword_prefix / end_of_word_suffix / legacy merges, no decoder.
 * Checks encode (with and without special tokens), decode (with and without skipping special
 * tokens) and the streaming detokenizer. */
#include "test_util.h"
#include "tok_test_util.h"

static void test_features(void) {
    char *list = NULL;
    size_t len = 0;
    CHECK_OK(di_read_file(tt_build_path("tests/data/tokenizer_features/variants.txt"), &list, &len, 0));
    if (!list) return;
    int variants = 0, cases = 0, bad = 0;
    for (char *name = strtok(list, "\n"); name; name = strtok(NULL, "\n")) {
        char rel[512];
        snprintf(rel, sizeof rel, "tests/data/tokenizer_features/%s/tokenizer.json", name);
        di_tokenizer *t = NULL;
        if (di_tokenizer_load(tt_build_path(rel), &t) != DI_OK) {
            fprintf(stderr, "  %s: load failed: %s\n", name, di_last_error());
            bad++;
            continue;
        }
        variants++;
        snprintf(rel, sizeof rel, "tests/data/tokenizer_features/%s/cases.jsonl", name);
        json_t *lines = tt_read_jsonl(tt_build_path(rel));
        CHECK(lines != NULL);
        int vbad = 0;
        for (size_t i = 0; lines && i < json_array_size(lines); i++) {
            json_t *rec = json_array_get(lines, i);
            json_t *jt = json_object_get(rec, "text");
            const char *text = json_string_value(jt);
            size_t tl = json_string_length(jt);
            di_ids ids = {0}, ids2 = {0};
            cases++;
            int ok = di_tokenizer_encode(t, text, tl, DI_TOK_HF, &ids) == DI_OK && tt_ids_equal(&ids, json_object_get(rec, "ids"));
            ok = ok && di_tokenizer_encode(t, text, tl, DI_TOK_ADD_SPECIAL, &ids2) == DI_OK &&
                 tt_ids_equal(&ids2, json_object_get(rec, "ids_special"));
            for (int k = 0; k < 2 && ok; k++) {
                const di_ids *v = k ? &ids2 : &ids;
                json_t *want = json_object_get(rec, k ? "dec_skip" : "dec");
                unsigned flags = k ? DI_TOK_SKIP_SPECIAL : 0;
                char *out = NULL, *sbuf = NULL;
                size_t ol = 0, sl = 0, cap = 0;
                ok = di_tokenizer_decode(t, v->data, v->n, flags, &out, &ol) == DI_OK && ol == json_string_length(want) &&
                     !memcmp(out, json_string_value(want), ol);
                di_detok *d = di_detok_create(t, flags);
                for (size_t q = 0; q < v->n; q++) di_detok_push(d, v->data[q], &sbuf, &sl, &cap);
                di_detok_flush(d, &sbuf, &sl, &cap);
                di_detok_free(d);
                ok = ok && sl == ol && (!ol || !memcmp(sbuf, out, ol));
                free(out);
                free(sbuf);
            }
            if (!ok && vbad++ < 3) {
                fprintf(stderr, "  %s: mismatch on \"", name);
                tt_print_escaped(stderr, text, tl, 120);
                fprintf(stderr, "\"\n");
                tt_print_diff(stderr, &ids, json_object_get(rec, "ids"));
            }
            di_ids_free(&ids);
            di_ids_free(&ids2);
        }
        bad += vbad;
        json_decref(lines);
        di_tokenizer_free(t);
    }
    fprintf(stderr, "features: %d variants, %d cases, %d mismatches\n", variants, cases, bad);
    CHECK(variants >= 100);
    CHECK(cases >= 30000);
    CHECK_EQ_INT(bad, 0);
    free(list);
}

TEST_MAIN(test_features)
