/* model.c - loading a model onto a backend (config, weights, the paged latent KV pool, the
 * activation workspace), batch validation, and the public entry points of model.h.
 *
 * Owner: model. Invariants: everything a step touches is allocated here at load, sized by the
 * options (max_batch_tokens, max_seqs, max_context, kv_blocks); di_model_forward validates
 * the whole batch on the host before any op runs, so a malformed batch is an error naming
 * the field, never an out-of-bounds access. */
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/mmap_file.h"
#include "core/status.h"
#include "model/model_internal.h"

enum { DEFAULT_MAX_TOKENS = 2048, DEFAULT_MAX_SEQS = 256, DEFAULT_KV_MIB = 256 };

static size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

/* ---------------------------------------------------------------- setup ---- */

static void setup_params(di_model *m) {
    const di_model_config *c = &m->cfg;
    m->mla = (di_mla_dims){c->num_attention_heads, c->qk_nope_head_dim, c->qk_rope_head_dim,
                           c->v_head_dim, c->kv_lora_rank, (float)di_config_softmax_scale(c)};
    di_route_method method = c->topk_method == DI_TOPK_NOAUX_TC ? DI_ROUTE_NOAUX_TC
                             : c->topk_method == DI_TOPK_GREEDY ? DI_ROUTE_GREEDY
                                                                : DI_ROUTE_GROUP_LIMITED_GREEDY;
    m->route = (di_route_params){method, c->n_routed_experts, c->num_experts_per_tok,
                                 c->n_group > 0 ? c->n_group : 1, c->topk_group, c->norm_topk_prob,
                                 (float)c->routed_scaling_factor};
    m->kv_width = di_config_kv_width(c);
    m->v32 = c->arch == DI_ARCH_DEEPSEEK_V32;
    /* measured on the H200 (v2lite-8l, 3 rounds): batch 1 +1.4%, batch 16 -0.4%: one token only */
    const char *rs = getenv("DEEPINFER_ROPE_SPLIT");
    m->rope_split_max_t = rs && rs[0] >= '0' && rs[0] <= '9' ? atoi(rs) : 1;
    if (m->v32)
        m->idx = (di_indexer_dims){c->index_n_heads, c->index_head_dim, c->index_topk,
                                   (float)(1.0 / sqrt((double)c->index_head_dim)),
                                   (float)(1.0 / sqrt((double)c->index_n_heads))};
}

static di_status alloc_buf(di_model *m, void **p, size_t bytes) {
    bytes = bytes ? bytes : 64;
    DI_TRY(m->be->alloc(m->be, bytes, p));
    m->workspace_bytes += bytes;
    return DI_OK;
}

static di_status setup_rope(di_model *m) {
    int half = m->cfg.qk_rope_head_dim / 2;
    double inv[4096], mscale = 1.0;
    if (half > 512) return di_error(DI_ERR_UNSUPPORTED, "qk_rope_head_dim %d: at most 1024 is supported", m->cfg.qk_rope_head_dim);
    di_config_rope_inv_freq(&m->cfg, inv, &mscale);
    float f[4096];
    for (int i = 0; i < half; i++) f[i] = (float)inv[i];
    DI_TRY(alloc_buf(m, (void **)&m->inv_freq, (size_t)half * sizeof(float)));
    m->be->upload(m->be, m->inv_freq, f, (size_t)half * sizeof(float));
    m->rope = (di_rope_params){m->cfg.qk_rope_head_dim, m->cfg.rope.interleave, (float)mscale, m->inv_freq};
    m->rope_idx = m->rope;
    m->rope_idx.interleave = 0;  /* the V3.2 indexer rotates NeoX halves of its first dr dims */
    return DI_OK;
}

static di_status setup_kv(di_model *m) {
    const di_model_options *o = &m->opts;
    size_t idx_w = m->v32 ? (size_t)m->cfg.index_head_dim : 0;
    size_t per_block = (size_t)(m->n_layers + m->n_mtp) * DI_KV_BLOCK_SIZE * (m->kv_width + idx_w) *
                       di_backend_act_size(m->be);
    size_t blocks = (size_t)o->kv_blocks;
    if (blocks == 0) {
        size_t mem = o->kv_memory_bytes ? o->kv_memory_bytes : (size_t)DEFAULT_KV_MIB << 20;
        blocks = mem / per_block;
        size_t cap = (size_t)m->max_seqs * m->max_blocks_per_seq;
        if (blocks > cap) blocks = cap;
        if (blocks == 0) blocks = 1;
    }
    if (blocks > (size_t)INT32_MAX / DI_KV_BLOCK_SIZE)
        return di_error(DI_ERR_INVALID_ARG, "kv_blocks %zu: too many (slots must fit in int32)", blocks);
    m->kv_blocks = (int)blocks;
    m->kv_layer_stride = blocks * DI_KV_BLOCK_SIZE * (size_t)m->kv_width;
    size_t layers = (size_t)(m->n_layers + m->n_mtp), a = di_backend_act_size(m->be);
    size_t kv_bytes = layers * m->kv_layer_stride * a;
    DI_TRY(alloc_buf(m, &m->kv, kv_bytes));
    m->be->memset(m->be, m->kv, 0, kv_bytes);
    if (m->v32) {
        m->kv_idx_layer_stride = blocks * DI_KV_BLOCK_SIZE * idx_w;
        DI_TRY(alloc_buf(m, &m->kv_idx, layers * m->kv_idx_layer_stride * a));
        m->be->memset(m->be, m->kv_idx, 0, layers * m->kv_idx_layer_stride * a);
    }
    return DI_OK;
}

static di_status setup_workspace(di_model *m) {
    const di_model_config *c = &m->cfg;
    di_backend *be = m->be;
    size_t T = (size_t)m->max_tokens, S = (size_t)m->max_seqs, D = (size_t)c->hidden_size;
    size_t H = (size_t)c->num_attention_heads, r = (size_t)c->kv_lora_rank;
    size_t qk = (size_t)di_config_qk_head_dim(c), a = di_backend_act_size(be);
    size_t I = (size_t)c->moe_intermediate_size * (size_t)(c->n_shared_experts);
    if (c->first_k_dense_replace > 0 && (size_t)c->intermediate_size > I) I = (size_t)c->intermediate_size;
    size_t k = (size_t)c->num_experts_per_tok, E = (size_t)c->n_routed_experts;
    m->logits_chunk = m->max_tokens < 256 ? m->max_tokens : 256;
    size_t i32 = sizeof(int32_t), mbs = (size_t)m->max_blocks_per_seq;
    DI_TRY(alloc_buf(m, (void **)&m->d_ids, T * i32));
    DI_TRY(alloc_buf(m, (void **)&m->d_pos, T * i32));
    DI_TRY(alloc_buf(m, (void **)&m->d_slots, T * i32));
    DI_TRY(alloc_buf(m, (void **)&m->d_rows, T * i32));
    DI_TRY(alloc_buf(m, (void **)&m->d_seq_start, (S + 1) * i32));
    DI_TRY(alloc_buf(m, (void **)&m->d_ctx_len, S * i32));
    DI_TRY(alloc_buf(m, (void **)&m->d_block_table, S * mbs * i32));
    if (!(m->h_block_table = calloc(S * mbs, i32))) return di_error(DI_ERR_NOMEM, "out of memory (block table)");
    DI_TRY(alloc_buf(m, (void **)&m->h, T * D * sizeof(float)));
    if (be->caps.act_dtype != DI_DTYPE_F32) DI_TRY(alloc_buf(m, (void **)&m->xr, T * D * sizeof(float)));
    DI_TRY(alloc_buf(m, &m->x, T * D * a));
    DI_TRY(alloc_buf(m, &m->ffn_out, T * D * a));
    DI_TRY(alloc_buf(m, &m->cq, T * (size_t)c->q_lora_rank * a));
    DI_TRY(alloc_buf(m, &m->q, T * H * qk * a));
    DI_TRY(alloc_buf(m, &m->kva, T * (size_t)m->kv_width * a));
    DI_TRY(alloc_buf(m, &m->qt, T * H * r * a));
    DI_TRY(alloc_buf(m, &m->olat, T * H * r * a));
    DI_TRY(alloc_buf(m, &m->o, T * H * (size_t)c->v_head_dim * a));
    DI_TRY(alloc_buf(m, &m->ffn_gu, T * 2 * I * a));
    DI_TRY(alloc_buf(m, &m->ffn_act, T * I * a));
    DI_TRY(alloc_buf(m, &m->cat2, m->n_mtp ? T * 2 * D * a : 0));
    DI_TRY(alloc_buf(m, (void **)&m->xg, (size_t)m->logits_chunk * D * sizeof(float)));
    DI_TRY(alloc_buf(m, (void **)&m->logits, (size_t)m->logits_chunk * (size_t)c->vocab_size * sizeof(float)));
    DI_TRY(alloc_buf(m, (void **)&m->topk_idx, T * k * i32));
    DI_TRY(alloc_buf(m, (void **)&m->topk_w, T * k * sizeof(float)));
    DI_TRY(alloc_buf(m, (void **)&m->route_scratch, T * 2 * E * sizeof(float)));
    m->prefill_scratch_bytes = be->mla_prefill_scratch_bytes(be, &m->mla, m->max_tokens);
    DI_TRY(alloc_buf(m, &m->prefill_scratch, m->prefill_scratch_bytes));
    m->moe_scratch_bytes = be->moe_scratch_bytes(be, m->max_tokens, (int)k, c->hidden_size,
                                                 c->moe_intermediate_size, (int)E);
    DI_TRY(alloc_buf(m, &m->moe_scratch, m->moe_scratch_bytes));
    if (m->v32) {
        size_t nh = (size_t)c->index_n_heads, hd = (size_t)c->index_head_dim, K = (size_t)c->index_topk;
        DI_TRY(alloc_buf(m, &m->qidx, T * nh * hd * a));
        DI_TRY(alloc_buf(m, &m->kidx, T * hd * a));
        DI_TRY(alloc_buf(m, (void **)&m->widx, T * nh * sizeof(float)));
        DI_TRY(alloc_buf(m, (void **)&m->sel_pos, T * K * i32));
        DI_TRY(alloc_buf(m, (void **)&m->sel_count, T * i32));
        m->idx_scratch_bytes = be->indexer_scratch_bytes(be, m->max_tokens, m->max_blocks_per_seq * DI_KV_BLOCK_SIZE);
        DI_TRY(alloc_buf(m, &m->idx_scratch, m->idx_scratch_bytes));
    }
    return di_model_step_setup(m);
}

static di_status check_options(const di_model_options *o, const char *dir) {
    if (o->n_threads < 0 || o->max_batch_tokens < 0 || o->max_seqs < 0 || o->kv_blocks < 0 || o->max_context < 0)
        return di_error(DI_ERR_INVALID_ARG, "loading %s: negative model option", dir);
    if (o->max_batch_tokens > (1 << 24) || o->max_seqs > (1 << 20) || o->max_context > (1 << 30))
        return di_error(DI_ERR_INVALID_ARG, "loading %s: model option out of range", dir);
    return DI_OK;
}

static di_status load(di_model *m, const char *dir) {
    char *cfg_path = di_path_join(dir, "config.json");
    if (!cfg_path) return di_error(DI_ERR_NOMEM, "out of memory");
    di_status s = di_config_load(cfg_path, &m->cfg);
    free(cfg_path);
    DI_TRY(s);
    const di_model_config *c = &m->cfg;
    if (c->n_routed_experts > DI_MAX_EXPERTS)
        return di_error(DI_ERR_UNSUPPORTED, "%s: n_routed_experts %d exceeds the supported %d", dir,
                        c->n_routed_experts, DI_MAX_EXPERTS);
    m->n_layers = c->num_hidden_layers;
    m->n_mtp = m->opts.load_mtp ? c->num_nextn_predict_layers : 0;
    m->max_tokens = m->opts.max_batch_tokens ? m->opts.max_batch_tokens : DEFAULT_MAX_TOKENS;
    m->max_seqs = m->opts.max_seqs ? m->opts.max_seqs : DEFAULT_MAX_SEQS;
    int ctx = m->opts.max_context;
    if (!ctx) ctx = c->max_position_embeddings > 4096 ? c->max_position_embeddings : 4096;
    m->max_blocks_per_seq = (int)ceil_div((size_t)ctx, DI_KV_BLOCK_SIZE);
    setup_params(m);
    di_backend_options bo = {m->opts.device, m->opts.n_threads, 0, m->opts.precision};
    DI_TRY(di_backend_create(&bo, &m->be));
    if (m->v32 && (!m->be->layernorm || !m->be->indexer_topk || !m->be->indexer_scratch_bytes))
        return di_error(DI_ERR_UNSUPPORTED, "%s: DeepSeek-V3.2 sparse attention (the indexer) is not implemented on "
                        "the %s backend yet; use --device cpu", dir, m->be->name);
    if (m->be->check_dims) {
        char *where = di_path_join(dir, "config.json");
        if (!where) return di_error(DI_ERR_NOMEM, "out of memory");
        s = m->be->check_dims(m->be, where, &m->mla, m->v32 ? &m->idx : NULL);
        free(where);
        DI_TRY(s);
    }
    m->v32_absorbed = m->v32 && m->be->device == DI_DEVICE_CPU; /* deepseek.c attention */
    if (!(m->layers = calloc((size_t)(m->n_layers + m->n_mtp), sizeof *m->layers)))
        return di_error(DI_ERR_NOMEM, "out of memory");
    di_weights *ws = NULL;
    DI_TRY(di_weights_open(dir, &ws));
    s = di_model_load_weights(m, ws, dir);
    di_weights_free(ws);  /* the backend holds its own copies */
    DI_TRY(s);
    DI_TRY(setup_rope(m));
    DI_TRY(setup_kv(m));
    return setup_workspace(m);
}

di_status di_model_load(const char *dir, const di_model_options *opts, di_model **out) {
    *out = NULL;
    di_model_options def = {0};
    if (!opts) opts = &def;
    DI_TRY(check_options(opts, dir));
    di_model *m = calloc(1, sizeof *m);
    if (!m) return di_error(DI_ERR_NOMEM, "out of memory");
    m->opts = *opts;
    di_status s = load(m, dir);
    if (s != DI_OK) {
        di_model_free(m);
        return s;
    }
    *out = m;
    return DI_OK;
}

void di_model_free(di_model *m) {
    if (!m) return;
    di_backend *be = m->be;
    if (be) {
        di_model_step_free(m);
        di_model_free_weights(m);
        void *bufs[] = {m->inv_freq, m->kv, m->d_ids, m->d_pos, m->d_slots, m->d_rows, m->d_seq_start,
                        m->d_ctx_len, m->d_block_table, m->h, m->xr, m->x, m->ffn_out, m->cq,
                        m->q, m->kva, m->qt, m->olat, m->o, m->ffn_gu, m->ffn_act, m->cat2, m->xg,
                        m->logits, m->topk_idx, m->topk_w, m->route_scratch, m->prefill_scratch,
                        m->moe_scratch, m->kv_idx, m->qidx, m->kidx, m->widx, m->sel_pos, m->sel_count,
                        m->idx_scratch};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(be, bufs[i]);
        di_backend_free(be);
    }
    free(m->h_block_table);
    free(m->layers);
    free(m);
}

const di_model_config *di_model_config_of(const di_model *m) { return &m->cfg; }
int di_model_kv_blocks(const di_model *m) { return m->kv_blocks; }
int di_model_mtp_layers(const di_model *m) { return m->n_mtp; }
di_backend *di_model_backend(di_model *m) { return m->be; }

/* ---------------------------------------------------------------- batch validation ---- */

static di_status bad(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static di_status bad(const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return di_error(DI_ERR_INVALID_ARG, "di_batch: %s", msg);
}

di_status di_model_validate_batch(const di_model *m, const di_batch *b) {
    int T = b->n_tokens, S = b->n_seqs;
    if (T < 1 || T > m->max_tokens) return bad("n_tokens %d outside [1, %d] (max_batch_tokens)", T, m->max_tokens);
    if (S < 1 || S > m->max_seqs) return bad("n_seqs %d outside [1, %d] (max_seqs)", S, m->max_seqs);
    if (b->n_decode_seqs < 0 || b->n_decode_seqs > S) return bad("n_decode_seqs %d outside [0, %d]", b->n_decode_seqs, S);
    if (!b->token_ids || !b->positions || !b->slot_mapping || !b->seq_start || !b->seq_ctx_len || !b->block_table)
        return bad("a metadata array is NULL");
    if (b->max_blocks < 1) return bad("max_blocks %d < 1", b->max_blocks);
    if (b->n_logits < 0 || b->n_logits > T) return bad("n_logits %d outside [0, %d]", b->n_logits, T);
    if (b->n_logits && !b->logits_rows) return bad("logits_rows is NULL");
    if (b->seq_start[0] != 0 || b->seq_start[S] != T)
        return bad("seq_start must run from 0 to n_tokens (%d); got %d .. %d", T, b->seq_start[0], b->seq_start[S]);
    for (int i = 0; i < S; i++) {
        int t0 = b->seq_start[i], t1 = b->seq_start[i + 1], q = t1 - t0, ctx = b->seq_ctx_len[i];
        if (q < 1) return bad("sequence %d has %d tokens (seq_start not increasing)", i, q);
        if (ctx < q) return bad("seq_ctx_len[%d] = %d is less than its %d tokens", i, ctx, q);
        if (ctx > m->max_blocks_per_seq * DI_KV_BLOCK_SIZE)
            return bad("seq_ctx_len[%d] = %d exceeds the model's max_context %d", i, ctx,
                       m->max_blocks_per_seq * DI_KV_BLOCK_SIZE);
        int used = (int)ceil_div((size_t)ctx, DI_KV_BLOCK_SIZE);
        if (used > b->max_blocks) return bad("sequence %d needs %d blocks but max_blocks is %d", i, used, b->max_blocks);
        const int32_t *bt = b->block_table + (size_t)i * b->max_blocks;
        for (int j = 0; j < used; j++)
            if (bt[j] < 0 || bt[j] >= m->kv_blocks)
                return bad("block_table[%d][%d] = %d outside [0, %d)", i, j, bt[j], m->kv_blocks);
        for (int t = t0; t < t1; t++) {
            int pos = ctx - q + (t - t0);
            if (b->token_ids[t] < 0 || b->token_ids[t] >= m->cfg.vocab_size)
                return bad("token_ids[%d] = %d outside [0, %d)", t, b->token_ids[t], m->cfg.vocab_size);
            if (b->positions[t] != pos)
                return bad("positions[%d] = %d, expected %d (sequence %d: context %d, %d new tokens)", t,
                           b->positions[t], pos, i, ctx, q);
            int slot = bt[pos / DI_KV_BLOCK_SIZE] * DI_KV_BLOCK_SIZE + pos % DI_KV_BLOCK_SIZE;
            if (b->slot_mapping[t] != slot)
                return bad("slot_mapping[%d] = %d, but position %d of sequence %d is slot %d by its block table",
                           t, b->slot_mapping[t], pos, i, slot);
        }
    }
    for (int j = 0; j < b->n_logits; j++)
        if (b->logits_rows[j] < 0 || b->logits_rows[j] >= T)
            return bad("logits_rows[%d] = %d outside [0, %d)", j, b->logits_rows[j], T);
    return DI_OK;
}

di_status di_model_forward_ex(di_model *m, const di_batch *batch, float *logits, float *hidden) {
    if (!m || !batch) return di_error(DI_ERR_INVALID_ARG, "di_model_forward: NULL argument");
    DI_TRY(di_model_validate_batch(m, batch));
    if (batch->n_logits && !logits) return di_error(DI_ERR_INVALID_ARG, "di_model_forward: logits output is NULL");
    return di_deepseek_forward(m, batch, logits, hidden);
}

di_status di_model_forward(di_model *m, const di_batch *batch, float *logits) {
    return di_model_forward_ex(m, batch, logits, NULL);
}

di_status di_model_mtp_forward(di_model *m, int k, const di_batch *batch, const float *hidden_in,
                               float *logits, float *hidden_out) {
    if (!m || !batch || !hidden_in) return di_error(DI_ERR_INVALID_ARG, "di_model_mtp_forward: NULL argument");
    if (k < 0 || k >= m->n_mtp)
        return di_error(DI_ERR_INVALID_ARG, "di_model_mtp_forward: MTP layer %d not loaded (%d loaded; set load_mtp)",
                        k, m->n_mtp);
    DI_TRY(di_model_validate_batch(m, batch));
    if (batch->n_logits && !logits) return di_error(DI_ERR_INVALID_ARG, "di_model_mtp_forward: logits output is NULL");
    return di_deepseek_mtp_forward(m, k, batch, hidden_in, logits, hidden_out);
}

di_status di_model_copy_blocks(di_model *m, const int32_t *src, const int32_t *dst, int n) {
    if (n < 0 || (n > 0 && (!src || !dst))) return di_error(DI_ERR_INVALID_ARG, "di_model_copy_blocks: bad arguments");
    for (int i = 0; i < n; i++)
        if (src[i] < 0 || src[i] >= m->kv_blocks || dst[i] < 0 || dst[i] >= m->kv_blocks)
            return di_error(DI_ERR_INVALID_ARG, "di_model_copy_blocks: pair %d (%d -> %d) outside [0, %d)", i,
                            src[i], dst[i], m->kv_blocks);
    m->be->kv_copy_blocks(m->be, m->kv, m->kv_layer_stride, m->n_layers + m->n_mtp, m->kv_width, src, dst, n);
    if (m->v32)  /* the index-key cache is paged alike */
        m->be->kv_copy_blocks(m->be, m->kv_idx, m->kv_idx_layer_stride, m->n_layers + m->n_mtp,
                              m->cfg.index_head_dim, src, dst, n);
    return m->be->sync(m->be);
}
