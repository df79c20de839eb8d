/* test_pycoder_golden.c - the shipped trained model (models/pycoder-moe, FP8 with MTP) against
 * Hugging Face transformers through the CLI.
 *
 * tests/data/golden_pycoder/golden_pycoder.json (tools/golden/make_pycoder_golden.py:
 * transformers 5.17, fp32, eager attention, on the dequantized FP8 weights) lists id sequences
 * of 1 to 300 tokens and the logits rows it kept. For every case `$DI_BIN logits --mode prefill`
 * and `--mode decode` (paged cache, absorbed attention) must agree with the reference within
 * the manifest's tolerance (1e-4, max|d| / max|ref| over the kept rows), with every argmax
 * equal (the reference's smallest top-2 gap is recorded in the manifest and is far above this
 * tolerance). The model files must be the ones transformers read (CRC32). */
#include "pycoder_golden.h"

static void test_pycoder_golden(void) {
    const char *build = getenv("DI_BUILD_DIR");
    CHECK_MSG(getenv("DI_BIN") && build, "DI_BIN and DI_BUILD_DIR must be set (run through ctest)");
    if (!getenv("DI_BIN") || !build) return;
    json_t *man = pg_manifest();
    if (!man) return;
    const double tol = json_number_value(json_object_get(man, "tolerance"));
    CHECK(tol > 0 && tol <= 1e-4);
    json_t *cases = json_object_get(man, "cases");
    CHECK(json_array_size(cases) >= 4);
    int n_cmp = 0, longest = 0, shortest = 1 << 30;
    size_t ci;
    json_t *c;
    json_array_foreach(cases, ci, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        int n_ids = (int)json_array_size(json_object_get(c, "ids"));
        if (n_ids > longest) longest = n_ids;
        if (n_ids < shortest) shortest = n_ids;
        float *ref = pg_reference(man, c);
        if (!ref) continue;
        const char *modes[2] = {"prefill", "decode"};
        for (int m = 0; m < 2; m++) {
            char out[4400];
            snprintf(out, sizeof out, "%s/pycoder_golden.%s.%s.bin", build, name, modes[m]);
            pg_stats st;
            if (pg_compare(man, c, ref, modes[m], "", out, &st, NULL) != 0) continue;
            fprintf(stderr, "  %-20s %-7s n=%-4d rows %-3d max|d|/max|ref| %.3g  ||d||/||ref|| %.3g  argmax %d/%d%s\n",
                    name, modes[m], n_ids, st.rows, st.rel_max, st.rel_l2, st.argmax_same, st.rows,
                    st.rel_max <= tol ? "" : "  FAIL");
            CHECK_MSG(st.rel_max <= tol, "%s/%s: max|d|/max|ref| = %.3g > %.1g (token %ld, id %ld: got %g, transformers %g)",
                      name, modes[m], st.rel_max, tol, st.worst_row, st.worst_id, (double)st.worst_got,
                      (double)st.worst_ref);
            CHECK_MSG(st.argmax_same == st.rows, "%s/%s: %d of %d argmaxes differ from transformers", name, modes[m],
                      st.rows - st.argmax_same, st.rows);
            n_cmp++;
            remove(out);
        }
        free(ref);
    }
    CHECK_EQ_INT(n_cmp, 2 * (int)json_array_size(cases));
    CHECK_MSG(shortest == 1 && longest >= 300, "cases span %d..%d tokens; expected 1 and >= 300", shortest, longest);
    json_decref(man);
}

TEST_MAIN(test_pycoder_golden)
