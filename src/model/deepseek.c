/* deepseek.c - the DeepSeek forward pass (V2 / V3 / V3.2-dense), written once against the
 * backend op table. Reads like docs/deepseek-v3-arch.md §0-§5 and §7:
 *
 *   h = E[tokens]
 *   for each layer:  h += MLA(rmsnorm_in(h));  h += FFN(rmsnorm_post(h))
 *   logits = lm_head(rmsnorm_final(h))
 *
 * MLA: decode sequences (the first n_decode_seqs of the batch) take the weight-absorbed path
 * over the latent cache; prefill chunks take the naive path (context decompressed through
 * kv_b_proj). Both read the context — including this step's tokens — back from the paged cache
 * after kv_write, so chunked prefill and prefix-cache hits need nothing special.
 *
 * DeepSeek-V3.2 adds the lightning indexer (top-k sparse attention) in front of MLA; when it
 * selects (a context longer than index_topk), every token of the step takes the absorbed path
 * over its selected positions.
 *
 * Precision: the residual stream h is f32 on every backend; o_proj and a dense MLP's down_proj
 * accumulate straight into it (DI_MM_OUT_F32 | DI_MM_ACCUMULATE), the MoE output is added in
 * fp32, and the router reads the post-attention norm's output unrounded in f32 (m->xr on a
 * bf16 backend), as HF computes DeepseekV3TopkRouter. On the CPU (f32 activations) this is the
 * plain fp32 forward pass.
 *
 * Owner: model. Invariant: the batch was validated by model.c; this file allocates nothing. */
#include <string.h>

#include "core/status.h"
#include "model/model_internal.h"

static size_t act_bytes(const di_model *m, size_t n) { return n * di_backend_act_size(m->be); }
static void *act_at(const di_model *m, void *base, size_t elems) {
    return (char *)base + act_bytes(m, elems);
}

/* Uploads the step's metadata once; fills the attention batch descriptor. */
void di_deepseek_upload_batch(di_model *m, const di_batch *b, di_attn_batch *ab) {
    di_backend *be = m->be;
    int T = b->n_tokens, S = b->n_seqs, mb = m->max_blocks_per_seq;
    be->upload(be, m->d_ids, b->token_ids, (size_t)T * sizeof(int32_t));
    be->upload(be, m->d_pos, b->positions, (size_t)T * sizeof(int32_t));
    be->upload(be, m->d_slots, b->slot_mapping, (size_t)T * sizeof(int32_t));
    be->upload(be, m->d_seq_start, b->seq_start, (size_t)(S + 1) * sizeof(int32_t));
    be->upload(be, m->d_ctx_len, b->seq_ctx_len, (size_t)S * sizeof(int32_t));
    /* re-stride the block table to ours, copying only the blocks each context uses */
    int max_q = 0, max_ctx = 0;
    for (int i = 0; i < S; i++) {
        int used = (b->seq_ctx_len[i] + DI_KV_BLOCK_SIZE - 1) / DI_KV_BLOCK_SIZE;
        memcpy(m->h_block_table + (size_t)i * mb, b->block_table + (size_t)i * b->max_blocks,
               (size_t)used * sizeof(int32_t));
        int q = b->seq_start[i + 1] - b->seq_start[i];
        max_q = q > max_q ? q : max_q;
        max_ctx = b->seq_ctx_len[i] > max_ctx ? b->seq_ctx_len[i] : max_ctx;
    }
    be->upload(be, m->d_block_table, m->h_block_table, (size_t)S * mb * sizeof(int32_t));
    *ab = (di_attn_batch){.positions = m->d_pos, .slot_mapping = m->d_slots, .seq_start = m->d_seq_start,
                          .seq_ctx_len = m->d_ctx_len, .block_table = m->d_block_table, .n_tokens = T,
                          .n_seqs = S, .max_blocks = mb, .max_q_len = max_q, .max_ctx_len = max_ctx};
}

/* DeepSeek-V3.2 lightning indexer (§8, transformers 5.17 semantics): writes this step's index
 * keys k = rope(LayerNorm(W_k x)) to the layer's index cache, and when some context exceeds
 * index_topk selects each token's top-k positions and returns the sparse attention batch.
 * With every context <= index_topk, every position is selected: dense attention is exact. */
static di_attn_batch indexer(di_model *m, const di_layer *ly, int l, const di_attn_batch *ab) {
    di_backend *be = m->be;
    const di_model_config *c = &m->cfg;
    const di_indexer_dims *d = &m->idx;
    int T = ab->n_tokens, nh = d->n_heads, hd = d->head_dim;
    void *cache = act_at(m, m->kv_idx, (size_t)l * m->kv_idx_layer_stride);
    be->matmul(be, m->kidx, hd, m->x, c->hidden_size, &ly->idx_wk, T, 0);
    be->layernorm(be, m->kidx, hd, m->kidx, hd, &ly->idx_kn_w, &ly->idx_kn_b, 1e-6f, T, hd);
    be->rope(be, m->kidx, hd, 1, hd, ab->positions, T, &m->rope_idx);
    be->kv_write(be, cache, m->kidx, hd, ab->slot_mapping, T, hd);
    di_attn_batch sparse = *ab;
    if (ab->max_ctx_len <= d->topk) return sparse;
    be->matmul(be, m->qidx, nh * hd, m->cq, c->q_lora_rank, &ly->idx_wq_b, T, 0);
    be->rope(be, m->qidx, nh * hd, nh, hd, ab->positions, T, &m->rope_idx);
    be->matmul(be, m->widx, nh, m->x, c->hidden_size, &ly->idx_wproj, T, DI_MM_OUT_F32);
    be->indexer_topk(be, m->sel_pos, m->sel_count, m->qidx, m->widx, cache, ab, 0, ab->n_seqs, d,
                     m->idx_scratch, m->idx_scratch_bytes);
    sparse.sel_pos = m->sel_pos;
    sparse.sel_count = m->sel_count;
    sparse.sel_stride = d->topk;
    return sparse;
}

/* queries: q = W_qb · rmsnorm_qa(W_qa x)  or  q = W_q x        [T, H, dn + dr] */
static void queries(di_model *m, const di_layer *ly, int T) {
    di_backend *be = m->be;
    const di_model_config *c = &m->cfg;
    int H = m->mla.n_heads, qk = m->mla.nope_dim + m->mla.rope_dim;
    if (c->q_lora_rank > 0) {
        be->matmul(be, m->cq, c->q_lora_rank, m->x, c->hidden_size, &ly->q_a, T, 0);
        be->rmsnorm(be, m->cq, c->q_lora_rank, m->cq, c->q_lora_rank, &ly->q_a_norm,
                    (float)c->rms_norm_eps, T, c->q_lora_rank);
        be->matmul(be, m->q, H * qk, m->cq, c->q_lora_rank, &ly->q_b, T, 0);
    } else {
        be->matmul(be, m->q, H * qk, m->x, c->hidden_size, &ly->q, T, 0);
    }
}

/* h += MLA(x); x is the normed input; o_proj accumulates into the f32 residual stream h. */
static void attention(di_model *m, const di_layer *ly, int l, void *cache, const di_attn_batch *dense,
                      int n_decode_seqs, int n_decode_tokens) {
    di_backend *be = m->be;
    const di_model_config *c = &m->cfg;
    const di_mla_dims *d = &m->mla;
    const di_attn_batch *ab = dense;
    int T = ab->n_tokens, H = d->n_heads, dn = d->nope_dim, dr = d->rope_dim, r = d->kv_rank;
    int qk = dn + dr, W = r + dr;
    /* latent: [c | k_pe] = W_kva x; c = rmsnorm_kva(c)               [T, r + dr]
     * (on the backend's side lane where it has one: independent of the queries below; the
     * norm inside rope_kv_write where the backend has that) */
    /* a decode-only step, not V3.2 (whose indexer comes between the rope and the attention):
     * its rope may run beside the query path */
    const int rope_beside = n_decode_tokens > 0 && n_decode_tokens == T && !m->v32;
    int side = be->side_begin && be->side_begin(be, T);
    /* with side_resume, the queries are issued first on the main lane (the side lane forked
     * above, so the latent still overlaps them): on CUDA this capture order measured batch 1
     * +0.3% (backend.h side_resume) */
    int q_first = side && be->side_resume;
    if (q_first) {
        be->side_end(be);
        queries(m, ly, T);
        be->side_resume(be);
    }
    be->matmul(be, m->kva, W, m->x, c->hidden_size, &ly->kv_a, T, 0);
    if (!be->rope_kv_write) be->rmsnorm(be, m->kva, W, m->kva, W, &ly->kv_a_norm, (float)c->rms_norm_eps, T, r);
    /* split (rope_beside, at most rope_split_max_t tokens, with the side lane and the fused op):
     * the latent's norm, k_pe's RoPE and the cache write follow the latent GEMV on the side
     * lane, and only q's RoPE waits for the query projection on the main lane; the lanes join
     * before the attention reads the cache. Else the whole fused op after both (see below). */
    int split = side && rope_beside && T <= m->rope_split_max_t && be->rope_kv_write;
    if (split)
        be->rope_kv_write(be, NULL, 0, 0, qk, m->kva, W, r, cache, ab->slot_mapping, W, ab->positions, T, &m->rope,
                          &ly->kv_a_norm, (float)c->rms_norm_eps);
    if (side) be->side_end(be);
    if (!q_first) queries(m, ly, T);
    int side_rope = 0;
    if (split) {
        be->rope_kv_write(be, act_at(m, m->q, dn), H * qk, H, qk, NULL, 0, 0, NULL, ab->slot_mapping, W,
                          ab->positions, T, &m->rope, NULL, (float)c->rms_norm_eps);
        side_rope = 1; /* the side lane is joined after the W_UK absorption below */
    } else {
        if (side) be->side_join(be);
        /* RoPE on every head's q_pe and on the shared k_pe, then [c | k_pe] into the cache (one
         * fused op with c's norm where the backend has it); when rope_beside, on the side lane
         * beside the W_UK absorption, which reads only q_nope. */
        side_rope = rope_beside && be->side_begin && be->side_begin(be, T);
        if (be->rope_kv_write) {
            be->rope_kv_write(be, act_at(m, m->q, dn), H * qk, H, qk, m->kva, W, r, cache, ab->slot_mapping, W,
                              ab->positions, T, &m->rope, &ly->kv_a_norm, (float)c->rms_norm_eps);
        } else {
            be->rope(be, act_at(m, m->q, dn), H * qk, H, qk, ab->positions, T, &m->rope);
            be->rope(be, act_at(m, m->kva, r), W, 1, W, ab->positions, T, &m->rope);
            be->kv_write(be, cache, m->kva, W, ab->slot_mapping, T, W);
        }
        if (side_rope) be->side_end(be);
    }
    /* V3.2: the lightning indexer picks the positions each token attends to */
    di_attn_batch sparse;
    if (m->v32) {
        sparse = indexer(m, ly, l, dense);
        ab = &sparse;
        /* with a selection (some context beyond index_topk) every token, prefill ones too, takes
         * the absorbed path: it reads its <= index_topk selected latent rows in place, where the
         * naive path would decompress the whole context to use a few of its rows. On a
         * batch-invariant backend (m->v32_absorbed) it does so in every batch, so a token's
         * path, and its bits, never depend on the other sequences' lengths; the CUDA backend
         * keeps the naive path for batches of short contexts (a cheaper prefill; its rows are
         * not batch-invariant anyway) */
        if (ab->sel_pos || m->v32_absorbed) {
            n_decode_seqs = ab->n_seqs;
            n_decode_tokens = T;
        }
    }
    /* decode: q̃ = W_UKᵀ q_nope; ō = attn over latents; o = W_UV ō */
    if (n_decode_tokens > 0) {
        be->bmm(be, m->qt, H * r, r, m->q, H * qk, qk, &ly->w_uk_t, n_decode_tokens);
        if (side_rope) be->side_join(be);
        if (be->mla_decode_uv) {
            be->mla_decode_uv(be, m->o, H * d->v_dim, d->v_dim, m->olat, m->qt, act_at(m, m->q, dn), H * qk, qk,
                              cache, ab, 0, n_decode_seqs, d, &ly->w_uv, n_decode_tokens);
        } else {
            be->mla_decode(be, m->olat, m->qt, act_at(m, m->q, dn), H * qk, qk, cache, ab, 0, n_decode_seqs, d);
            be->bmm(be, m->o, H * d->v_dim, d->v_dim, m->olat, H * r, r, &ly->w_uv, n_decode_tokens);
        }
    }
    /* prefill chunks: naive attention over the decompressed context */
    if (n_decode_seqs < ab->n_seqs)
        be->mla_prefill(be, m->o, m->q, H * qk, cache, &ly->kv_b, ab, n_decode_seqs, ab->n_seqs, d,
                        m->prefill_scratch, m->prefill_scratch_bytes);
    be->matmul(be, m->h, c->hidden_size, m->o, H * d->v_dim, &ly->o, T, DI_MM_OUT_F32 | DI_MM_ACCUMULATE);
}

/* A SwiGLU MLP of intermediate size I on x (the dense FFN, or the shared experts) accumulated
 * into out: out += down(silu(gate x) ⊙ up x) (flags: DI_MM_ACCUMULATE, plus DI_MM_OUT_F32 when
 * out is the fp32 residual stream). */
static void swiglu(di_model *m, const di_weight *gate_up, const di_weight *down, int I, int T, void *out,
                   unsigned flags) {
    di_backend *be = m->be;
    int D = m->cfg.hidden_size;
    if (!(be->matmul_silu && be->matmul_silu(be, m->ffn_act, m->x, D, gate_up, I, T))) {
        be->matmul(be, m->ffn_gu, 2 * I, m->x, D, gate_up, T, 0);
        be->silu_mul(be, m->ffn_act, m->ffn_gu, T, I);
    }
    be->matmul(be, out, D, m->ffn_act, I, down, T, flags);
}

/* The delta a layer leaves for the next one's add_rmsnorm when its routed experts' combine was
 * deferred (backend.h moe_experts_defer): add_rmsnorm_experts computes it there. */
static const char moe_deferred;
#define DELTA_DEFERRED ((const void *)&moe_deferred)

/* h += FFN(x): dense SwiGLU MLP (down_proj accumulates into h; returns NULL), or routed
 * experts (+ shared experts) in ffn_out, which the caller adds into h (returns ffn_out: the
 * next layer's add_rmsnorm takes it as its delta, saving a pass over h). may_defer (a next
 * layer follows): with the shared experts on the side lane, the routed experts' combine may be
 * left to that layer's norm (returns DELTA_DEFERRED). */
static const void *ffn(di_model *m, const di_layer *ly, int T, int may_defer) {
    di_backend *be = m->be;
    const di_model_config *c = &m->cfg;
    if (!ly->is_moe) {
        swiglu(m, &ly->gate_up, &ly->down, c->intermediate_size, T, m->h, DI_MM_OUT_F32 | DI_MM_ACCUMULATE);
        return NULL;
    }
    int Is = c->moe_intermediate_size * c->n_shared_experts;
    /* shared experts on the backend's side lane where it has one, overlapping the routing and
     * the routed experts, accumulated straight into h in fp32 */
    int side = c->n_shared_experts > 0 && be->side_begin && be->side_begin(be, T);
    if (side) {
        swiglu(m, &ly->sh_gate_up, &ly->sh_down, Is, T, m->h, DI_MM_OUT_F32 | DI_MM_ACCUMULATE);
        be->side_end(be);
    }
    const float *router_in = m->xr ? m->xr : (const float *)m->x; /* f32 normed rows */
    be->moe_route(be, m->topk_idx, m->topk_w, router_in, &ly->router,
                  ly->router_bias.n ? &ly->router_bias : NULL, &m->route, T, m->route_scratch);
    if (side) {
        int deferred = may_defer && be->moe_experts_defer && be->add_rmsnorm_experts &&
                       be->moe_experts_defer(be, m->x, m->topk_idx, m->topk_w, m->route.top_k, &ly->exp_gate_up,
                                             &ly->exp_down, T, m->moe_scratch, m->moe_scratch_bytes);
        if (!deferred)
            be->moe_experts(be, m->ffn_out, m->x, m->topk_idx, m->topk_w, m->route.top_k, &ly->exp_gate_up,
                            &ly->exp_down, T, m->moe_scratch, m->moe_scratch_bytes);
        be->side_join(be);
        return deferred ? DELTA_DEFERRED : m->ffn_out;
    }
    /* routed + shared experts in one fused op where the backend has one (small decode steps on
     * CUDA), else the routed experts, then the shared experts accumulated onto them */
    int fused = c->n_shared_experts > 0 && be->moe_experts_shared &&
                be->moe_experts_shared(be, m->ffn_out, m->x, m->topk_idx, m->topk_w, m->route.top_k,
                                       &ly->exp_gate_up, &ly->exp_down, &ly->sh_gate_up, &ly->sh_down, T,
                                       m->moe_scratch, m->moe_scratch_bytes);
    if (!fused) {
        be->moe_experts(be, m->ffn_out, m->x, m->topk_idx, m->topk_w, m->route.top_k, &ly->exp_gate_up,
                        &ly->exp_down, T, m->moe_scratch, m->moe_scratch_bytes);
        if (c->n_shared_experts > 0) swiglu(m, &ly->sh_gate_up, &ly->sh_down, Is, T, m->ffn_out, DI_MM_ACCUMULATE);
    }
    return m->ffn_out;
}

/* One decoder layer on the residual stream m->h, after h += delta (the previous layer's FFN
 * output, DELTA_DEFERRED, or NULL); returns the FFN output still to be added into h (or NULL;
 * DELTA_DEFERRED only when may_defer, i.e. another decoder_layer follows). */
static const void *decoder_layer(di_model *m, int l, const di_attn_batch *ab, int n_decode_seqs,
                                 int n_decode_tokens, const void *delta, int may_defer) {
    di_backend *be = m->be;
    const di_layer *ly = &m->layers[l];
    float eps = (float)m->cfg.rms_norm_eps;
    int T = ab->n_tokens, D = m->cfg.hidden_size;
    void *cache = act_at(m, m->kv, (size_t)l * m->kv_layer_stride);
    if (delta == DELTA_DEFERRED)
        be->add_rmsnorm_experts(be, m->h, m->moe_scratch, m->topk_w, m->route.top_k, m->x, NULL, &ly->attn_norm,
                                eps, T, D);
    else
        be->add_rmsnorm(be, m->h, delta, m->x, NULL, &ly->attn_norm, eps, T, D);
    attention(m, ly, l, cache, ab, n_decode_seqs, n_decode_tokens);
    be->add_rmsnorm(be, m->h, NULL, m->x, ly->is_moe ? m->xr : NULL, &ly->ffn_norm, eps, T, D);
    return ffn(m, ly, T, may_defer);
}

/* The last layer's pending FFN output into h; with final_norm, also x = final_norm(h) of every
 * token (the add inside the norm). */
static void flush_delta(di_model *m, const void *delta, int T, const di_weight *final_norm) {
    if (final_norm)
        m->be->add_rmsnorm(m->be, m->h, delta, m->x, NULL, final_norm, (float)m->cfg.rms_norm_eps, T,
                           m->cfg.hidden_size);
    else if (delta)
        m->be->add(m->be, m->h, delta, (size_t)T * m->cfg.hidden_size);
}

/* Logits of the requested rows: their residual rows gathered, normed with `norm` (final or
 * MTP head norm) and projected, in chunks so the device buffer stays [logits_chunk, vocab]. */
static di_status emit_logits(di_model *m, const di_batch *b, const di_weight *norm, const di_weight *head,
                             float *logits) {
    di_backend *be = m->be;
    int D = m->cfg.hidden_size, V = m->cfg.vocab_size;
    for (int r0 = 0; r0 < b->n_logits; r0 += m->logits_chunk) {
        int n = b->n_logits - r0 < m->logits_chunk ? b->n_logits - r0 : m->logits_chunk;
        be->upload(be, m->d_rows, b->logits_rows + r0, (size_t)n * sizeof(int32_t));
        be->gather_rows(be, m->xg, m->h, m->d_rows, n, D);
        be->add_rmsnorm(be, m->xg, NULL, m->x, NULL, norm, (float)m->cfg.rms_norm_eps, n, D);
        be->matmul(be, m->logits, V, m->x, D, head, n, DI_MM_OUT_F32);
        DI_TRY(be->download(be, logits + (size_t)r0 * V, m->logits, (size_t)n * V * sizeof(float)));
    }
    return DI_OK;
}

/* hidden = norm(h) of every token, f32 (x itself on f32-act backends, else its f32 twin xr) */
static di_status download_hidden(di_model *m, float *dst, const di_weight *norm, int T) {
    di_backend *be = m->be;
    int D = m->cfg.hidden_size;
    be->add_rmsnorm(be, m->h, NULL, m->x, m->xr, norm, (float)m->cfg.rms_norm_eps, T, D);
    const void *src = m->xr ? (const void *)m->xr : m->x;
    return be->download(be, dst, src, (size_t)T * D * sizeof(float));
}

static int decode_tokens(const di_batch *b) { return b->seq_start[b->n_decode_seqs]; }

/* h = the main model's residual stream after every layer, for the uploaded batch (its token
 * ids at ids, device); with final_norm, also x = final_norm(h) of every token. */
void di_deepseek_layers(di_model *m, const int32_t *ids, const di_attn_batch *ab, int n_decode_seqs,
                        int n_decode_tokens, const di_weight *final_norm) {
    m->be->embed(m->be, m->h, &m->embed, ids, ab->n_tokens);
    const void *delta = NULL;
    for (int l = 0; l < m->n_layers; l++)
        delta = decoder_layer(m, l, ab, n_decode_seqs, n_decode_tokens, delta, l + 1 < m->n_layers);
    flush_delta(m, delta, ab->n_tokens, final_norm);
}

di_status di_deepseek_forward(di_model *m, const di_batch *b, float *logits, float *hidden) {
    di_backend *be = m->be;
    di_attn_batch ab;
    di_deepseek_upload_batch(m, b, &ab);
    int T = b->n_tokens;
    di_deepseek_layers(m, m->d_ids, &ab, b->n_decode_seqs, decode_tokens(b), NULL);
    const di_weight *head = m->lm_head_tied ? &m->embed : &m->lm_head;
    if (hidden) DI_TRY(download_hidden(m, hidden, &m->final_norm, T));
    if (logits) DI_TRY(emit_logits(m, b, &m->final_norm, head, logits));
    return be->sync(be);
}

/* MTP (§7): u = eh_proj([enorm(embed(t_{i+1})); hnorm(h_i)]), v = layer(u),
 * logits = head(shared_head.norm(v)). */
di_status di_deepseek_mtp_forward(di_model *m, int k, const di_batch *b, const float *hidden_in,
                                  float *logits, float *hidden_out) {
    di_backend *be = m->be;
    int l = m->n_layers + k, T = b->n_tokens, D = m->cfg.hidden_size;
    const di_layer *ly = &m->layers[l];
    float eps = (float)m->cfg.rms_norm_eps;
    if (be->caps.act_dtype != DI_DTYPE_F32)
        return di_error(DI_ERR_UNSUPPORTED, "MTP with host hidden states needs an fp32-activation backend");
    di_attn_batch ab;
    di_deepseek_upload_batch(m, b, &ab);
    /* act is f32 here, so the f32 residual buffers are act buffers too */
    be->embed(be, (float *)m->x, ly->mtp_embed.n ? &ly->mtp_embed : &m->embed, m->d_ids, T);
    be->rmsnorm(be, m->cat2, 2 * D, m->x, D, &ly->enorm, eps, T, D);
    be->upload(be, m->h, hidden_in, (size_t)T * D * sizeof(float));
    be->rmsnorm(be, act_at(m, m->cat2, D), 2 * D, m->h, D, &ly->hnorm, eps, T, D);
    be->matmul(be, m->h, D, m->cat2, 2 * D, &ly->eh_proj, T, DI_MM_OUT_F32);
    flush_delta(m, decoder_layer(m, l, &ab, b->n_decode_seqs, decode_tokens(b), NULL, 0), T, NULL);
    const di_weight *head = ly->mtp_head.n ? &ly->mtp_head : m->lm_head_tied ? &m->embed : &m->lm_head;
    if (hidden_out) DI_TRY(download_hidden(m, hidden_out, &ly->head_norm, T));
    if (logits) DI_TRY(emit_logits(m, b, &ly->head_norm, head, logits));
    return be->sync(be);
}
