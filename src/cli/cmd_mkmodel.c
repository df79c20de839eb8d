/* cmd_mkmodel.c - `deepinfer mkmodel`: write a deterministic random checkpoint (config.json,
 * safetensors in the Hub layout, tokenizer) from a named preset or a config.json. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "core/timer.h"
#include "io/config.h"
#include "io/mkmodel.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: deepinfer mkmodel (--preset NAME | --config FILE) --out DIR [options]\n"
            "\n"
            "Writes a deterministic random checkpoint: config.json, model.safetensors (or shards +\n"
            "model.safetensors.index.json) in the Hugging Face Hub layout, tokenizer.json and\n"
            "tokenizer_config.json. The same preset/config, seed and dtype give the same bytes on\n"
            "any machine and with any number of threads.\n"
            "\n"
            "options:\n"
            "  --preset NAME     a built-in configuration (listed below)\n"
            "  --config FILE     a config.json (deepseek_v2 / deepseek_v3 / deepseek_v32)\n"
            "  --out DIR         output directory (created if missing)\n"
            "  --seed N          RNG seed (default 0)\n"
            "  --dtype T         bf16 | f32 | fp8 (FP8 128x128 block-quantized projections, rest bf16);\n"
            "                    default: fp8 for fp8 presets / configs with quantization_config, else bf16\n"
            "  --mtp             also write one MTP layer (num_nextn_predict_layers = 1)\n"
            "  --shard-mb N      shards of at most N MiB (default: one file, or 4 GiB shards if larger)\n"
            "  --tokenizer DIR   copy tokenizer.json + tokenizer_config.json from DIR instead of writing\n"
            "                    the built-in byte-level tokenizer (e.g. the real DeepSeek-V3 one)\n"
            "  --threads N       generator threads (default: DEEPINFER_THREADS or all cores)\n"
            "\n"
            "presets:\n");
    const char *name;
    for (size_t i = 0; (name = di_mkmodel_preset_name(i)) != NULL; i++)
        fprintf(f, "  %-16s %s\n", name, di_mkmodel_preset_help(name));
}

static int parse_u64(const char *s, unsigned long long *out) {
    char *end;
    errno = 0;
    if (!s || !*s || *s == '-') return 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return 0;
    *out = v;
    return 1;
}

int di_cmd_mkmodel(int argc, char **argv) {
    const char *preset = NULL, *config = NULL, *out = NULL, *dtype = NULL, *tok = NULL;
    unsigned long long seed = 0, shard_mb = 0, threads = 0;
    int mtp = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        if (!strcmp(a, "--mtp")) { mtp = 1; continue; }
        if (!v) { fprintf(stderr, "deepinfer mkmodel: option '%s' needs a value (or is unknown)\n", a); return 2; }
        if (!strcmp(a, "--preset")) preset = v;
        else if (!strcmp(a, "--config")) config = v;
        else if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--dtype")) dtype = v;
        else if (!strcmp(a, "--tokenizer")) tok = v;
        else if (!strcmp(a, "--seed")) { if (!parse_u64(v, &seed)) { fprintf(stderr, "deepinfer mkmodel: --seed: expected a non-negative integer, got '%s'\n", v); return 2; } }
        else if (!strcmp(a, "--shard-mb")) { if (!parse_u64(v, &shard_mb) || shard_mb > (1ull << 30)) { fprintf(stderr, "deepinfer mkmodel: --shard-mb: expected a size in MiB, got '%s'\n", v); return 2; } }
        else if (!strcmp(a, "--threads")) { if (!parse_u64(v, &threads) || threads > 4096) { fprintf(stderr, "deepinfer mkmodel: --threads: expected a thread count, got '%s'\n", v); return 2; } }
        else { fprintf(stderr, "deepinfer mkmodel: unknown option '%s' (see --help)\n", a); return 2; }
        i++;
    }
    if (!!preset == !!config || !out) {
        fprintf(stderr, "deepinfer mkmodel: give exactly one of --preset or --config, and --out (see --help)\n");
        return 2;
    }
    di_model_config cfg;
    di_mk_dtype dt = DI_MK_BF16;
    di_status s = preset ? di_mkmodel_preset(preset, &cfg, &dt) : di_config_load(config, &cfg);
    if (s != DI_OK) {
        fprintf(stderr, "deepinfer mkmodel: %s\n", di_last_error());
        return 1;
    }
    if (config && cfg.fp8) dt = DI_MK_FP8;
    if (dtype) {
        if (!strcmp(dtype, "bf16")) dt = DI_MK_BF16;
        else if (!strcmp(dtype, "f32")) dt = DI_MK_F32;
        else if (!strcmp(dtype, "fp8")) dt = DI_MK_FP8;
        else { fprintf(stderr, "deepinfer mkmodel: --dtype: expected bf16, f32 or fp8, got '%s'\n", dtype); return 2; }
    }
    di_mkmodel_opts o = {(uint64_t)seed, dt, mtp, (size_t)shard_mb << 20, tok, (int)threads};
    double t0 = di_now_s();
    s = di_mkmodel_write(&cfg, &o, out);
    if (s != DI_OK) {
        fprintf(stderr, "deepinfer mkmodel: %s\n", di_last_error());
        return 1;
    }
    fprintf(stderr, "deepinfer mkmodel: wrote %s (%s, %s, seed %llu%s) in %.2f s\n", out, preset ? preset : config,
            dt == DI_MK_FP8 ? "fp8" : dt == DI_MK_F32 ? "f32" : "bf16", seed, mtp ? ", MTP" : "", di_now_s() - t0);
    return 0;
}
