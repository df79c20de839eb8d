/* ucprobe.c - helper for gen_unicode_tables.py (tool time only, never built by CMake).
 * Reports what PCRE2 and utf8proc (the libraries deepinfer links) think about code points, so
 * the generator can compare them with Hugging Face tokenizers (Oniguruma, Rust std tables).
 *   ucprobe version            -> "<pcre2 unicode version> <utf8proc unicode version>"
 *   ucprobe pcre PATTERN       -> code points (hex, one per line) that PATTERN matches alone
 *   ucprobe norm nfc|nfd|nfkc|nfkd < lines of hex code points -> normalized lines
 *   ucprobe lower              -> "cp lower" for every cp whose utf8proc_tolower differs
 *   ucprobe props              -> "cp ccc decomp_len" for cps with ccc>0 or a decomposition
 *   ucprobe pairs              -> "first second composite" canonical composition pairs */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

static int valid_cp(long c) { return c >= 0 && c < 0x110000 && !(c >= 0xd800 && c <= 0xdfff); }

static int cmd_pcre(const char *pat) {
    int err;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err, &eo, NULL);
    if (!re) { fprintf(stderr, "compile error %d at %zu\n", err, (size_t)eo); return 1; }
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    for (long c = 0; c < 0x110000; c++) {
        if (!valid_cp(c)) continue;
        utf8proc_uint8_t b[4];
        utf8proc_ssize_t l = utf8proc_encode_char((utf8proc_int32_t)c, b);
        int r = pcre2_match(re, b, (PCRE2_SIZE)l, 0, PCRE2_ANCHORED, md, NULL);
        if (r > 0 && pcre2_get_ovector_pointer(md)[1] == (PCRE2_SIZE)l) printf("%lX\n", c);
    }
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return 0;
}

static int cmd_norm(const char *form) {
    int opt = UTF8PROC_STABLE;
    if (!strcmp(form, "nfc")) opt |= UTF8PROC_COMPOSE;
    else if (!strcmp(form, "nfd")) opt |= UTF8PROC_DECOMPOSE;
    else if (!strcmp(form, "nfkc")) opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
    else if (!strcmp(form, "nfkd")) opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
    else return 2;
    char line[4096];
    while (fgets(line, sizeof line, stdin)) {
        utf8proc_uint8_t buf[4096];
        size_t n = 0;
        for (char *p = strtok(line, " \n"); p; p = strtok(NULL, " \n"))
            n += (size_t)utf8proc_encode_char((utf8proc_int32_t)strtol(p, NULL, 16), buf + n);
        utf8proc_uint8_t *out = NULL;
        utf8proc_ssize_t r = utf8proc_map(buf, (utf8proc_ssize_t)n, &out, (utf8proc_option_t)opt);
        if (r < 0) { printf("ERR\n"); continue; }
        const utf8proc_uint8_t *q = out;
        int first = 1;
        while (*q) {
            utf8proc_int32_t cp;
            q += utf8proc_iterate(q, -1, &cp);
            printf(first ? "%X" : " %X", (unsigned)cp);
            first = 0;
        }
        printf("\n");
        free(out);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    if (!strcmp(argv[1], "version")) {
        char v[64];
        pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, v);
        printf("%s %s\n", v, utf8proc_unicode_version());
        return 0;
    }
    if (!strcmp(argv[1], "pcre") && argc > 2) return cmd_pcre(argv[2]);
    if (!strcmp(argv[1], "norm") && argc > 2) return cmd_norm(argv[2]);
    if (!strcmp(argv[1], "lower")) {
        for (long c = 0; c < 0x110000; c++)
            if (valid_cp(c) && utf8proc_tolower((utf8proc_int32_t)c) != c)
                printf("%lX %X\n", c, (unsigned)utf8proc_tolower((utf8proc_int32_t)c));
        return 0;
    }
    if (!strcmp(argv[1], "props")) {
        for (long c = 0; c < 0x110000; c++) {
            if (!valid_cp(c)) continue;
            const utf8proc_property_t *p = utf8proc_get_property((utf8proc_int32_t)c);
            utf8proc_int32_t d[32];
            int last;
            utf8proc_ssize_t n = utf8proc_decompose_char((utf8proc_int32_t)c, d, 32, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, &last);
            int has_dec = !(n == 1 && d[0] == c);
            if (p->combining_class || has_dec || p->comb_index != UINT16_MAX)
                printf("%lX %d %d\n", c, p->combining_class, has_dec);
        }
        return 0;
    }
    if (!strcmp(argv[1], "pairs")) {
        for (long c = 0; c < 0x110000; c++) {
            if (!valid_cp(c)) continue;
            utf8proc_int32_t d[8];
            int last;
            utf8proc_ssize_t n = utf8proc_decompose_char((utf8proc_int32_t)c, d, 8, UTF8PROC_DECOMPOSE, &last);
            if (n != 2) continue;
            const utf8proc_property_t *p = utf8proc_get_property((utf8proc_int32_t)c);
            if (p->comp_exclusion) continue;
            /* only primary composites: decomposition is exactly 2 code points, not excluded */
            utf8proc_int32_t one[1];
            utf8proc_ssize_t n1 = utf8proc_decompose_char((utf8proc_int32_t)c, one, 1, 0, &last);
            (void)n1;
            printf("%X %X %lX\n", (unsigned)d[0], (unsigned)d[1], c);
        }
        return 0;
    }
    return 2;
}
