/* test_golden.c - parity with Hugging Face transformers through the CLI.
 *
 * tests/data/golden/golden.json (made by tools/golden/make_golden.py with transformers 5.17,
 * fp32, eager attention) lists cases: a mkmodel preset + seed + dtype, an id sequence, and the
 * reference logits file. For each case this test regenerates the checkpoint with
 * `$DI_BIN mkmodel` into the build directory, checks its files' CRC32 against the ones
 * transformers loaded (same bytes, so the same weights), runs `$DI_BIN logits --mode prefill`
 * and `--mode decode`, and requires max|logits - ref| / max|ref| <= the manifest's tolerance
 * (1e-4) for every case and mode. A missing `logits` command fails the test (it never skips). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json_util.h"
#include "core/mmap_file.h"
#include "core/status.h"
#include "test_util.h"
#include "cli_test_util.h"
#include "golden_util.h"

#define MAX_CKPT 32

/* The minimum coverage. */
static const char *const k_required[5] = {"tiny-v3", "tiny-v3-nolora", "tiny-v3-fp8", "tiny-v2-lite", "tiny-v2-grouped"};

static void test_golden(void) {
    const char *bin = getenv("DI_BIN"), *build = getenv("DI_BUILD_DIR");
    CHECK_MSG(bin && build, "DI_BIN and DI_BUILD_DIR must be set (run through ctest)");
    if (!bin || !build) return;
    json_t *man = NULL;
    CHECK_OK(di_json_load_file(test_src_path("tests/data/golden/golden.json"), &man));
    if (!man) return;
    double tol = json_number_value(json_object_get(man, "tolerance"));
    CHECK(tol > 0 && tol <= 1e-4);
    json_t *cases = json_object_get(man, "cases");
    CHECK(json_is_array(cases) && json_array_size(cases) >= 10);
    char made[MAX_CKPT][256];
    int n_made = 0, n_compared = 0, long_cases = 0, covered[5] = {0};
    char dir[4096], cmd[16384], path[4400];
    size_t ci;
    json_t *c;
    json_array_foreach(cases, ci, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        const char *preset = json_string_value(json_object_get(c, "preset"));
        const char *dtype = json_string_value(json_object_get(c, "dtype"));
        const char *logits = json_string_value(json_object_get(c, "logits"));
        long long seed = json_integer_value(json_object_get(c, "seed"));
        long long vocab = json_integer_value(json_object_get(c, "vocab_size"));
        json_t *ids = json_object_get(c, "ids");
        CHECK(name && preset && dtype && logits && json_is_array(ids) && vocab > 0);
        if (!(name && preset && dtype && logits && json_is_array(ids) && vocab > 0)) continue;
        /* the checkpoint, once per preset/seed/dtype */
        char key[256];
        snprintf(key, sizeof key, "%s_%lld_%s", preset, seed, dtype);
        snprintf(dir, sizeof dir, "%s/golden/%s", build, key);
        int have = 0;
        for (int i = 0; i < n_made; i++) have |= !strcmp(made[i], key);
        if (!have) {
            snprintf(cmd, sizeof cmd, "'%s' mkmodel --preset %s --seed %lld --dtype %s --out '%s' 2>&1", bin, preset, seed,
                     dtype, dir);
            int rc = test_run(cmd);
            CHECK_MSG(rc == 0, "%s: mkmodel failed (exit %d): %s", name, rc, cmd);
            if (rc != 0) continue;
            const char *f;
            json_t *crc;
            json_object_foreach(json_object_get(c, "checkpoint_crc32"), f, crc) {
                int ok;
                snprintf(path, sizeof path, "%s/%s", dir, f);
                uint32_t got = test_crc32_file(path, &ok);
                CHECK_MSG(ok && got == (uint32_t)json_integer_value(crc),
                          "%s: %s differs from the checkpoint transformers loaded (crc32 %08x, expected %08x): mkmodel "
                          "output changed; regenerate the golden data", name, path, got, (uint32_t)json_integer_value(crc));
            }
            if (n_made < MAX_CKPT) snprintf(made[n_made++], sizeof made[0], "%s", key);
        }
        /* reference */
        float *ref = NULL;
        const long n_ids = (long)json_array_size(ids);
        char refpath[1024];
        snprintf(refpath, sizeof refpath, "tests/data/golden/%s", logits);
        long n_ref = test_read_f32(test_src_path(refpath), &ref);
        if (n_ids >= 300) long_cases++;
        for (int p = 0; p < 5; p++) covered[p] |= !strcmp(preset, k_required[p]);
        CHECK_MSG(n_ref == n_ids * vocab, "%s: reference has %ld floats, expected %ld x %lld", name, n_ref, n_ids, vocab);
        if (n_ref != n_ids * vocab) { free(ref); continue; }
        double maxref = 0;
        for (long i = 0; i < n_ref; i++) maxref = fmax(maxref, fabs(ref[i]));
        /* ids "a,b,c" */
        char *idstr = test_ids_csv(ids);
        const char *modes[2] = {"prefill", "decode"};
        for (int m = 0; m < 2; m++) {
            char out[4200];
            snprintf(out, sizeof out, "%s/golden/%s.%s.bin", build, name, modes[m]);
            remove(out);
            snprintf(cmd, sizeof cmd, "'%s' logits --model '%s' --ids %s --mode %s --out '%s' 2>&1", bin, dir, idstr, modes[m], out);
            int rc = test_run(cmd);
            CHECK_MSG(rc == 0, "%s: `deepinfer logits --mode %s` failed with exit code %d (is the logits command built?)",
                      name, modes[m], rc);
            if (rc != 0) continue;
            float *got = NULL;
            long n_got = test_read_f32(out, &got);
            CHECK_MSG(n_got == n_ref, "%s/%s: %ld floats written, expected %ld", name, modes[m], n_got, n_ref);
            if (n_got == n_ref) {
                double maxd = 0;
                long at = 0, n_nan = 0;
                for (long i = 0; i < n_ref; i++) {
                    double d = fabs((double)got[i] - (double)ref[i]);
                    if (isnan(d)) { if (!n_nan++) at = i; continue; } /* a NaN never passes */
                    if (d > maxd && !n_nan) { maxd = d; at = i; }
                }
                CHECK_MSG(n_nan == 0, "%s/%s: %ld NaN logits (first at flat index %ld)", name, modes[m], n_nan, at);
                double rel = n_nan ? NAN : maxd / maxref;
                fprintf(stderr, "  %-18s %-7s n=%-4ld max|d|/max|ref| = %.3g%s\n", name, modes[m], n_ids, rel,
                        rel <= tol ? "" : "  FAIL");
                CHECK_MSG(rel <= tol, "%s/%s: max|d|/max|ref| = %.3g > %.1g (worst at token %ld, vocab id %ld: got %g, "
                          "transformers %g)", name, modes[m], rel, tol, at / (long)vocab, at % (long)vocab,
                          got[at], ref[at]);
                n_compared++;
            }
            free(got);
        }
        free(idstr);
        free(ref);
    }
    CHECK_EQ_INT(n_compared, 2 * (int)json_array_size(cases));
    for (int p = 0; p < 5; p++) CHECK_MSG(covered[p], "no golden case for preset %s", k_required[p]);
    CHECK_MSG(long_cases >= 3, "only %d cases of >= 300 tokens", long_cases);
    json_decref(man);
}

TEST_MAIN(test_golden)
