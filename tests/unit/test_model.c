/* test_model.c - the DeepSeek forward pass end to end on mkmodel tiny checkpoints:
 *  - prefill (naive MLA) and decode (weight-absorbed MLA over the latent cache) both match a
 *    direct double-precision implementation (model_ref.h) for every preset, and each other;
 *  - chunked prefill (3 chunks) equals one-shot prefill; shuffled block tables and copied
 *    blocks change nothing; a mixed batch (speculative q_len > 1 decode + prefill chunk)
 *    equals the sequences run alone;
 *  - the MTP head matches a direct computation of DeepSeek-V3 §7;
 *  - malformed batches and checkpoints with missing / unexpected tensors are refused with
 *    messages naming the field or tensor. */
#include <stdio.h>
#include <sys/stat.h>

#include "core/mmap_file.h"
#include "core/status.h"
#include "io/mkmodel.h"
#include "model/model.h"
#include "model_ref.h"
#include "test_util.h"


/* Writes preset `name` (with `mtp` MTP layers; "tiny-v32" = tiny-v3 as deepseek_v32 with a
 * lightning indexer keeping 24 positions) under the build dir; returns its path. */
static const char *make_model(const char *name, int mtp) {
    static char path[8][1024];
    static int n = 0;
    const char *root = getenv("DI_BUILD_DIR");
    char *p = path[n++ & 7];
    snprintf(p, 1024, "%s/test_model_data", root ? root : "/tmp");
    mkdir(p, 0755);
    snprintf(p, 1024, "%s/test_model_data/%s%s", root ? root : "/tmp", name, mtp ? "-mtp" : "");
    di_model_config c;
    di_mk_dtype dt;
    int v32 = !strcmp(name, "tiny-v32");
    CHECK_OK(di_mkmodel_preset(v32 ? "tiny-v3" : name, &c, &dt));
    if (v32) {
        c.arch = DI_ARCH_DEEPSEEK_V32;
        snprintf(c.model_type, sizeof c.model_type, "deepseek_v32");
        c.index_n_heads = 8;
        c.index_head_dim = 32;
        c.index_topk = 24;
        CHECK_OK(di_config_validate(&c, name));
    }
    di_mkmodel_opts o = {0};
    o.seed = 7;
    o.dtype = dt;
    o.mtp = mtp;
    CHECK_OK(di_mkmodel_write(&c, &o, p));
    return p;
}

static int32_t *make_ids(int n, int vocab, uint64_t seed) {
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    for (int i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((seed >> 33) % (uint64_t)vocab);
    }
    return ids;
}

static double rel_d(const float *a, const double *ref, size_t n) {
    double md = 0, mr = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs(a[i] - ref[i]);
        if (!(d <= md)) md = d;
        mr = fmax(mr, fabs(ref[i]));
    }
    return md / mr;
}
static double rel_f(const float *a, const float *ref, size_t n) {
    double md = 0, mr = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - ref[i]);
        if (!(d <= md)) md = d;
        mr = fmax(mr, fabs(ref[i]));
    }
    return md / mr;
}

/* One sequence's tokens [p0, p0 + n) of ids at positions p0.., with block table bt. */
static di_status run_chunk(di_model *m, const int32_t *ids, int p0, int n, const int32_t *bt, int nb,
                           int decode, float *logits) {
    int32_t *pos = malloc((size_t)n * 4), *slot = malloc((size_t)n * 4), *rows = malloc((size_t)n * 4);
    for (int i = 0; i < n; i++) {
        pos[i] = p0 + i;
        slot[i] = bt[(p0 + i) / 64] * 64 + (p0 + i) % 64;
        rows[i] = i;
    }
    int32_t ss[2] = {0, n}, ctx = p0 + n;
    di_batch b = {n, ids + p0, pos, slot, 1, decode, ss, &ctx, bt, nb, n, rows};
    di_status s = di_model_forward(m, &b, logits);
    free(pos); free(slot); free(rows);
    return s;
}

static di_model *load(const char *dir, int max_tokens, int kv_blocks, int mtp) {
    di_model_options o = {0};
    o.n_threads = 2;
    o.max_batch_tokens = max_tokens;
    o.max_seqs = 4;
    o.kv_blocks = kv_blocks;
    o.max_context = 512;
    o.load_mtp = mtp;
    di_model *m = NULL;
    CHECK_OK(di_model_load(dir, &o, &m));
    return m;
}

/* prefill == reference, decode == prefill, for one preset. */
static void check_preset(const char *preset, int N) {
    const char *dir = make_model(preset, 0);
    di_model *m = load(dir, N, 8, 0);
    if (!m) return;
    int V = di_model_config_of(m)->vocab_size;
    int32_t *ids = make_ids(N, V, 11), bt[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    float *pre = malloc((size_t)N * V * 4), *dec = malloc((size_t)N * V * 4);
    CHECK_OK(run_chunk(m, ids, 0, N, bt, 8, 0, pre));
    for (int i = 0; i < N; i++) CHECK_OK(run_chunk(m, ids, i, 1, bt, 8, 1, dec + (size_t)i * V));
    ref_model r;
    CHECK(ref_open(&r, dir) == 0);
    double *ref = malloc((size_t)N * V * 8);
    ref_forward(&r, ids, N, ref, NULL);
    double e_pre = rel_d(pre, ref, (size_t)N * V), e_dec = rel_f(dec, pre, (size_t)N * V);
    fprintf(stderr, "   %s N=%d: prefill vs reference %.2e, decode vs prefill %.2e\n", preset, N, e_pre, e_dec);
    CHECK_MSG(e_pre < 1e-5, "%s: prefill vs double reference %g", preset, e_pre);
    CHECK_MSG(e_dec < 1e-5, "%s: decode (absorbed) vs prefill (naive) %g", preset, e_dec);
    ref_close(&r);
    free(ids); free(pre); free(dec); free(ref);
    di_model_free(m);
}

static void test_presets(void) {
    check_preset("tiny-v3", 130);   /* crosses two block boundaries, positions > original_max (64) */
    check_preset("tiny-v3-nolora", 40);
    check_preset("tiny-v3-fp8", 40);
    check_preset("tiny-v3-neox", 40);
    check_preset("tiny-v2-lite", 70);
    check_preset("tiny-v2-grouped", 40);
    g_ref_min_index_gap = 1e300;
    check_preset("tiny-v32", 70);   /* DSA: dense up to index_topk (24), sparse after */
    fprintf(stderr, "   tiny-v32: smallest top-k score gap %.2e\n", g_ref_min_index_gap);
    CHECK_MSG(g_ref_min_index_gap > 1e-4 && g_ref_min_index_gap < 1e300,
              "V3.2 case does not exercise a well-separated sparse selection (gap %g)", g_ref_min_index_gap);
}

/* Chunked prefill, shuffled blocks, copied blocks, and a mixed decode+prefill batch. */
static void test_paging(void) {
    const char *dir = make_model("tiny-v3", 0);
    int N = 130;
    di_model *m = load(dir, N, 12, 0);
    if (!m) return;
    int V = di_model_config_of(m)->vocab_size;
    int32_t *ids = make_ids(N, V, 5), id_bt[3] = {0, 1, 2}, sh_bt[3] = {9, 4, 7};
    size_t sz = (size_t)N * V;
    float *one = malloc(sz * 4), *chunked = malloc(sz * 4), *shuf = malloc(sz * 4), *tmp = malloc(sz * 4);
    CHECK_OK(run_chunk(m, ids, 0, N, id_bt, 3, 0, one));
    /* three chunks: 40, 60, 30 (each reads the earlier chunks' latents from the cache) */
    CHECK_OK(run_chunk(m, ids, 0, 40, sh_bt, 3, 0, chunked));
    CHECK_OK(run_chunk(m, ids, 40, 60, sh_bt, 3, 0, chunked + (size_t)40 * V));
    CHECK_OK(run_chunk(m, ids, 100, 30, sh_bt, 3, 0, chunked + (size_t)100 * V));
    double e = rel_f(chunked, one, sz);
    CHECK_MSG(e < 1e-6, "chunked prefill differs from one-shot by %g", e);
    /* shuffled block order, one shot: identical bits */
    CHECK_OK(run_chunk(m, ids, 0, N, sh_bt, 3, 0, shuf));
    CHECK_MSG(memcmp(shuf, one, sz * 4) == 0, "a shuffled block table changed the logits");
    /* copy blocks 9,4,7 -> 10,11,0 and decode the last token from the copies */
    int32_t src[3] = {9, 4, 7}, dst[3] = {10, 11, 0}, cp_bt[3] = {10, 11, 0};
    CHECK_OK(di_model_copy_blocks(m, src, dst, 3));
    CHECK_OK(run_chunk(m, ids, N - 1, 1, cp_bt, 3, 1, tmp));
    e = rel_f(tmp, one + (size_t)(N - 1) * V, (size_t)V);
    CHECK_MSG(e < 1e-5, "decode over copied blocks differs by %g", e);
    int32_t bad_src[1] = {12};
    CHECK(di_model_copy_blocks(m, bad_src, dst, 1) == DI_ERR_INVALID_ARG);

    /* mixed batch: seq A (blocks 0,1) decodes 3 tokens at 100..102 (speculative), seq B
     * (block 5) prefills a chunk at 30..39; both after a first batch that prefilled A[0,100),
     * B[0,30) together. Compare with the sequences' one-shot prefill. */
    int32_t *idsB = make_ids(40, V, 99);
    int32_t bt2[2 * 2] = {0, 1, 5, 0};
    int32_t tok1[130], pos1[130], slot1[130], rows1[1] = {0};
    for (int i = 0; i < 100; i++) { tok1[i] = ids[i]; pos1[i] = i; slot1[i] = (i / 64) * 64 + i % 64; }
    for (int i = 0; i < 30; i++) { tok1[100 + i] = idsB[i]; pos1[100 + i] = i; slot1[100 + i] = 5 * 64 + i; }
    int32_t ss1[3] = {0, 100, 130}, ctx1[2] = {100, 30};
    di_batch b1 = {130, tok1, pos1, slot1, 2, 0, ss1, ctx1, bt2, 2, 1, rows1};
    CHECK_OK(di_model_forward(m, &b1, tmp));
    int32_t tok2[13], pos2[13], slot2[13], rows2[13];
    for (int i = 0; i < 3; i++) { tok2[i] = ids[100 + i]; pos2[i] = 100 + i; slot2[i] = 64 + 36 + i; }
    for (int i = 0; i < 10; i++) { tok2[3 + i] = idsB[30 + i]; pos2[3 + i] = 30 + i; slot2[3 + i] = 5 * 64 + 30 + i; }
    for (int i = 0; i < 13; i++) rows2[i] = i;
    int32_t ss2[3] = {0, 3, 13}, ctx2[2] = {103, 40};
    di_batch b2 = {13, tok2, pos2, slot2, 2, 1, ss2, ctx2, bt2, 2, 13, rows2};
    float *mixed = malloc((size_t)13 * V * 4), *refB = malloc((size_t)40 * V * 4);
    CHECK_OK(di_model_forward(m, &b2, mixed));
    CHECK_OK(run_chunk(m, idsB, 0, 40, id_bt, 3, 0, refB));
    e = rel_f(mixed, one + (size_t)100 * V, (size_t)3 * V);
    CHECK_MSG(e < 1e-5, "mixed batch: speculative decode rows differ by %g", e);
    e = rel_f(mixed + (size_t)3 * V, refB + (size_t)30 * V, (size_t)10 * V);
    CHECK_MSG(e < 1e-5, "mixed batch: prefill-chunk rows differ by %g", e);
    free(idsB); free(mixed); free(refB);
    free(ids); free(one); free(chunked); free(shuf); free(tmp);
    di_model_free(m);
}

/* V3.2: decoding past index_topk from copied blocks (latent and index-key caches) equals
 * decoding from the originals. */
static void test_v32_copy_blocks(void) {
    const char *dir = make_model("tiny-v32", 0);
    di_model *m = load(dir, 100, 4, 0);
    if (!m) return;
    int V = di_model_config_of(m)->vocab_size, N = 100;
    int32_t *ids = make_ids(N + 1, V, 17), bt[2] = {0, 1}, cp[2] = {2, 3};
    float *a = malloc((size_t)V * 4), *b = malloc((size_t)V * 4), *pre = malloc((size_t)N * V * 4);
    CHECK_OK(run_chunk(m, ids, 0, N, bt, 2, 0, pre));
    CHECK_OK(di_model_copy_blocks(m, bt, cp, 2));
    CHECK_OK(run_chunk(m, ids, N, 1, bt, 2, 1, a));
    CHECK_OK(run_chunk(m, ids, N, 1, cp, 2, 1, b));
    CHECK_MSG(memcmp(a, b, (size_t)V * 4) == 0, "decode from copied V3.2 blocks differs");
    free(ids); free(a); free(b); free(pre);
    di_model_free(m);
}

static void test_mtp(void) {
    const char *dir = make_model("tiny-v3", 1);
    int N = 40;
    di_model *m = load(dir, N, 4, 1);
    if (!m) return;
    CHECK_EQ_INT(di_model_mtp_layers(m), 1);
    const di_model_config *c = di_model_config_of(m);
    int V = c->vocab_size, D = c->hidden_size;
    int32_t *ids = make_ids(N + 1, V, 3), bt[4] = {0, 1, 2, 3};
    float *logits = malloc((size_t)N * V * 4), *hid = malloc((size_t)N * D * 4), *mtp = malloc((size_t)N * V * 4);
    int32_t pos[64], slot[64], rows[64];
    for (int i = 0; i < N; i++) pos[i] = slot[i] = rows[i] = i;
    int32_t ss[2] = {0, N}, ctx = N;
    di_batch b = {N, ids, pos, slot, 1, 0, ss, &ctx, bt, 4, N, rows};
    CHECK_OK(di_model_forward_ex(m, &b, logits, hid));
    di_batch bm = b;
    bm.token_ids = ids + 1;  /* position i sees the next token t_{i+1} */
    CHECK_OK(di_model_mtp_forward(m, 0, &bm, hid, mtp, NULL));
    ref_model r;
    CHECK(ref_open(&r, dir) == 0);
    double *rl = malloc((size_t)N * V * 8), *rh = malloc((size_t)N * D * 8), *rm = malloc((size_t)N * V * 8);
    ref_forward(&r, ids, N, rl, rh);
    ref_mtp(&r, ids + 1, rh, N, rm);
    double e1 = rel_d(logits, rl, (size_t)N * V), e2 = rel_d(hid, rh, (size_t)N * D), e3 = rel_d(mtp, rm, (size_t)N * V);
    fprintf(stderr, "   mtp: main %.2e hidden %.2e mtp %.2e\n", e1, e2, e3);
    CHECK_MSG(e1 < 1e-5 && e2 < 1e-5, "main logits %g / hidden %g vs reference", e1, e2);
    CHECK_MSG(e3 < 1e-5, "MTP logits vs direct computation %g", e3);
    CHECK(di_model_mtp_forward(m, 1, &bm, hid, mtp, NULL) == DI_ERR_INVALID_ARG);
    ref_close(&r);
    free(ids); free(logits); free(hid); free(mtp); free(rl); free(rh); free(rm);
    di_model_free(m);
}

static void expect_bad(di_model *m, di_batch *b, const char *needle) {
    float out[4096];
    di_status s = di_model_forward(m, b, out);
    CHECK_MSG(s == DI_ERR_INVALID_ARG && strstr(di_last_error(), needle), "expected an error naming '%s', got %d: %s",
              needle, (int)s, di_last_error());
}

static void test_bad_batches(void) {
    const char *dir = make_model("tiny-v3", 0);
    di_model *m = load(dir, 8, 2, 0);
    if (!m) return;
    int32_t ids[3] = {1, 2, 3}, pos[3] = {0, 1, 2}, slot[3] = {64, 65, 66}, bt[1] = {1}, ss[2] = {0, 3}, ctx = 3, rows[1] = {2};
    di_batch ok = {3, ids, pos, slot, 1, 0, ss, &ctx, bt, 1, 1, rows};
    float out[512];
    CHECK_OK(di_model_forward(m, &ok, out));
    di_batch b = ok;
    int32_t big[3] = {1, 512, 3};
    b.token_ids = big;
    expect_bad(m, &b, "token_ids[1]");
    b = ok;
    int32_t wslot[3] = {64, 66, 65};
    b.slot_mapping = wslot;
    expect_bad(m, &b, "slot_mapping[1]");
    b = ok;
    int32_t wpos[3] = {0, 2, 2};
    b.positions = wpos;
    expect_bad(m, &b, "positions[1]");
    b = ok;
    int32_t wbt[1] = {2};
    b.block_table = wbt;
    expect_bad(m, &b, "block_table[0][0]");
    b = ok;
    b.n_tokens = 9;
    expect_bad(m, &b, "n_tokens");
    b = ok;
    b.n_decode_seqs = 2;
    expect_bad(m, &b, "n_decode_seqs");
    b = ok;
    int32_t wrows[1] = {3};
    b.logits_rows = wrows;
    expect_bad(m, &b, "logits_rows[0]");
    b = ok;
    int32_t wctx = 2;
    b.seq_ctx_len = &wctx;
    expect_bad(m, &b, "seq_ctx_len[0]");
    b = ok;
    int32_t wss[2] = {0, 2};
    b.seq_start = wss;
    expect_bad(m, &b, "seq_start");
    b = ok;
    int32_t longctx = 600;  /* the model was loaded with max_context 512 */
    b.seq_ctx_len = &longctx;
    expect_bad(m, &b, "max_context");
    b = ok;
    b.max_blocks = 0;
    expect_bad(m, &b, "max_blocks");
    /* the decode-graph warm-up is a no-op without graphs (CPU): nothing captured, and the
     * model computes the same logits afterwards */
    int n_cap = -1;
    float again[512];
    CHECK_OK(di_model_warmup_decode(m, 8, &n_cap));
    CHECK_EQ_INT(n_cap, 0);
    CHECK(di_model_warmup_decode(NULL, 8, &n_cap) == DI_ERR_INVALID_ARG);
    CHECK_OK(di_model_forward(m, &ok, again));
    CHECK(memcmp(out, again, sizeof(float) * (size_t)di_model_config_of(m)->vocab_size) == 0);
    di_model_free(m);
    /* option checks and the default KV pool size (256 MiB, capped by max_seqs * max_context) */
    di_model_options o = {0};
    o.max_seqs = -1;
    CHECK(di_model_load(dir, &o, &m) == DI_ERR_INVALID_ARG && m == NULL);
    o.max_seqs = 2;
    o.max_context = 300;
    CHECK_OK(di_model_load(dir, &o, &m));
    if (m) CHECK_EQ_INT(di_model_kv_blocks(m), 2 * 5);
    di_model_free(m);
}

/* Asynchronous steps (di_model_sample_launch / _collect): the misuse errors, and a chained
 * pair of decode steps giving the tokens of the same two steps run one by one (on the CPU the
 * launches run synchronously; the device path is tested by tests/ops/test_cuda_model.c). */
static void test_async_steps(void) {
    const char *dir = make_model("tiny-v3", 0);
    di_model *m = load(dir, 8, 4, 0);
    if (!m) return;
    int32_t ids[2] = {5, 9}, pos0[2] = {0, 0}, pos1[2] = {1, 1}, slot0[2] = {64, 128}, slot1[2] = {65, 129};
    int32_t bt[2] = {1, 2}, ss[3] = {0, 1, 2}, ctx0[2] = {1, 1}, ctx1[2] = {2, 2}, lrows[2] = {0, 1};
    di_batch s0 = {2, ids, pos0, slot0, 2, 2, ss, ctx0, bt, 1, 2, lrows};
    di_batch s1 = {2, NULL, pos1, slot1, 2, 2, ss, ctx1, bt, 1, 2, lrows};
    di_sample_row rows0[2] = {{0.9f, 1.0f, 0.0f, 0, 42, 1, 0}, {0.0f, 1.0f, 0.0f, 0, 0, 1, 0}};
    di_sample_row rows1[2] = {{0.9f, 1.0f, 0.0f, 0, 42, 2, 0}, {0.0f, 1.0f, 0.0f, 0, 0, 2, 0}};
    int32_t ref0[2], ref1[2], st[2], t0[2] = {-7, -7}, t1[2] = {-7, -7};
    CHECK_OK(di_model_forward_sample_rows(m, &s0, rows0, ref0, st));
    s1.token_ids = ref0;
    CHECK_OK(di_model_forward_sample_rows(m, &s1, rows1, ref1, st));
    /* misuse */
    CHECK(di_model_sample_collect(m, t0, st) == DI_ERR_INVALID_ARG);
    int32_t ident[2] = {0, 1}, swap[2] = {1, 0}, twice[2] = {1, 1}, far[2] = {0, 2};
    CHECK(di_model_sample_launch(m, &s1, rows1, ident) == DI_ERR_INVALID_ARG); /* chained: nothing before */
    CHECK_EQ_INT(di_model_sample_in_flight(m), 0);
    CHECK_OK(di_model_sample_launch(m, &s0, rows0, NULL));
    CHECK(di_model_sample_launch(m, &s0, rows0, NULL) == DI_ERR_INVALID_ARG); /* unchained with one in flight */
    CHECK(di_model_forward_sample_rows(m, &s0, rows0, t0, st) == DI_ERR_INVALID_ARG);
    di_batch pre = s1; /* a chained step must be a decode step: here one sequence of two tokens */
    int32_t ss_pre[2] = {0, 2}, ctx_pre[1] = {2};
    pre.n_seqs = 1, pre.n_decode_seqs = 0, pre.seq_start = ss_pre, pre.seq_ctx_len = ctx_pre, pre.n_logits = 1;
    int32_t pos_pre[2] = {0, 1}, slot_pre[2] = {64, 65}, lrow_pre[1] = {1};
    pre.positions = pos_pre, pre.slot_mapping = slot_pre, pre.logits_rows = lrow_pre, pre.token_ids = ids;
    CHECK(di_model_sample_launch(m, &pre, rows1, ident) == DI_ERR_INVALID_ARG);
    CHECK(di_model_sample_launch(m, &s1, rows1, twice) == DI_ERR_INVALID_ARG); /* a row twice */
    CHECK(di_model_sample_launch(m, &s1, rows1, far) == DI_ERR_INVALID_ARG);   /* no such row */
    int32_t junk[2] = {-1, 1 << 30}; /* ignored when chained (invalid ids would be refused otherwise) */
    s1.token_ids = junk;
    CHECK_OK(di_model_sample_launch(m, &s1, rows1, ident));
    CHECK_EQ_INT(di_model_sample_in_flight(m), 2);
    CHECK(di_model_sample_launch(m, &s1, rows1, ident) == DI_ERR_INVALID_ARG); /* a third */
    CHECK_OK(di_model_sample_collect(m, t0, st));
    CHECK_OK(di_model_sample_collect(m, t1, st));
    CHECK_EQ_INT(di_model_sample_in_flight(m), 0);
    CHECK(t0[0] == ref0[0] && t0[1] == ref0[1] && t1[0] == ref1[0] && t1[1] == ref1[1]);
    CHECK(st[0] == DI_SAMPLE_OK && st[1] == DI_SAMPLE_OK);
    /* a chain map that swaps the rows: the batch's row 0 is sequence 2 (slot 129, block 2)
     * fed by row 1 of the step before, and the other way round */
    di_batch sw = s1;
    int32_t slot_sw[2] = {129, 65}, bt_sw[2] = {2, 1};
    di_sample_row rows_sw[2] = {rows1[1], rows1[0]};
    sw.slot_mapping = slot_sw, sw.block_table = bt_sw;
    CHECK_OK(di_model_sample_launch(m, &s0, rows0, NULL));
    CHECK_OK(di_model_sample_launch(m, &sw, rows_sw, swap));
    CHECK_OK(di_model_sample_collect(m, t0, st));
    CHECK_OK(di_model_sample_collect(m, t1, st));
    CHECK(t0[0] == ref0[0] && t0[1] == ref0[1] && t1[0] == ref1[1] && t1[1] == ref1[0]);
    /* freed with a step in flight: no leak, no hang */
    CHECK_OK(di_model_sample_launch(m, &s0, rows0, NULL));
    di_model_free(m);
}

/* Copies a checkpoint with one tensor dropped or one extra tensor, and loads it. */
static void test_bad_checkpoints(void) {
    const char *dir = make_model("tiny-v3-nolora", 0);
    di_weights *w = NULL;
    CHECK_OK(di_weights_open(dir, &w));
    if (!w) return;
    const char *root = getenv("DI_BUILD_DIR");
    for (int variant = 0; variant < 3; variant++) {
        char out[1024], path[1100];
        snprintf(out, sizeof out, "%s/test_model_data/broken%d", root ? root : "/tmp", variant);
        mkdir(out, 0755);
        di_st_writer *wr = di_st_writer_create();
        const char *victim = "model.layers.1.mlp.experts.3.up_proj.weight";
        for (size_t i = 0; i < di_weights_count(w); i++) {
            const di_tensor_info *t = di_weights_at(w, i);
            if (variant == 0 && !strcmp(t->name, victim)) continue;
            int64_t shape[2] = {t->shape[0], t->ndim > 1 ? t->shape[1] : 0};
            if (variant == 2 && !strcmp(t->name, victim)) shape[0] -= 1;  /* wrong shape */
            CHECK_OK(di_st_writer_add(wr, t->name, t->dtype, t->ndim, shape, t->data,
                                      (size_t)shape[0] * (t->ndim > 1 ? (size_t)shape[1] : 1) * di_dtype_size(t->dtype)));
        }
        if (variant == 1) {
            float extra[4] = {0};
            int64_t sh[1] = {4};
            CHECK_OK(di_st_writer_add(wr, "model.layers.0.mlp.bogus.weight", DI_DTYPE_F32, 1, sh, extra, sizeof extra));
        }
        snprintf(path, sizeof path, "%s/model.safetensors", out);
        CHECK_OK(di_st_writer_write(wr, path));
        di_st_writer_free(wr);
        char *cfg = NULL, src[1100];
        size_t len = 0;
        snprintf(src, sizeof src, "%s/config.json", dir);
        CHECK_OK(di_read_file(src, &cfg, &len, 0));
        snprintf(path, sizeof path, "%s/config.json", out);
        CHECK_OK(di_write_file(path, cfg, len));
        free(cfg);
        di_model *m = NULL;
        di_model_options o = {0};
        o.kv_blocks = 1;
        di_status s = di_model_load(out, &o, &m);
        CHECK(s != DI_OK && m == NULL);
        const char *needle = variant == 1 ? "model.layers.0.mlp.bogus.weight" : victim;
        CHECK_MSG(strstr(di_last_error(), needle) != NULL, "variant %d: message does not name the tensor: %s", variant,
                  di_last_error());
    }
    di_weights_free(w);
    di_model *m = NULL;
    CHECK(di_model_load("/nonexistent/model", NULL, &m) != DI_OK && m == NULL);
}

TEST_MAIN(test_presets, test_paging, test_v32_copy_blocks, test_mtp, test_bad_batches, test_async_steps,
          test_bad_checkpoints)
