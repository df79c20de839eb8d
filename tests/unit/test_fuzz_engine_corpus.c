/* test_fuzz_engine_corpus.c - the engine fuzzer's corpus (fuzz/corpus/engine: seeds, and the
 * inputs that found bugs) replayed through its harness, compiled here without libFuzzer, so
 * every CI run checks what fuzz/fuzz_engine.c checks on each input: no crash or error without
 * a message, the engine finishes, and the control request and every reproducible fuzzed request
 * get bit for bit what they get alone (a failed check aborts the test). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../fuzz/fuzz_engine.c"

int main(void) {
    const char *src = getenv("DI_SOURCE_DIR"), *build = getenv("DI_BUILD_DIR");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/fuzz/corpus/engine", src ? src : ".");
    if (build) setenv("DI_FUZZ_DIR", build, 1);
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "test_fuzz_engine_corpus: cannot open %s\n", dir);
        return 1;
    }
    int n = 0;
    struct dirent *ent;
    while ((ent = readdir(d))) {
        if (ent->d_name[0] == '.') continue;
        char path[2048];
        snprintf(path, sizeof path, "%s/%s", dir, ent->d_name);
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        static uint8_t buf[1 << 16];
        size_t len = fread(buf, 1, sizeof buf, f);
        fclose(f);
        LLVMFuzzerTestOneInput(buf, len);
        n++;
    }
    closedir(d);
    di_engine_free(g_engine);
    di_engine_free(g_alone);
    fprintf(stderr, "%d corpus inputs replayed, 0 failures\n", n);
    return n > 0 ? 0 : 1;
}
