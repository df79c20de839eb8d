/* weights.c - checkpoint tensors -> backend weights for every layer of a DeepSeek model.
 *
 * Owner: model. Reads the Hub layout (one tensor per expert, FP8 `weight_scale_inv` siblings,
 * MTP layers after the main ones, V3.2 indexer tensors), checks each tensor's presence, shape
 * and dtype against the config, and uploads: gate+up fused into one [2I, D] matrix (gate rows
 * first), experts stacked per layer (n = E), kv_b_proj additionally split per head into the
 * absorption matrices W_UKᵀ (n = H, [r, dn]) and W_UV (n = H, [dv, r]). Every tensor of the
 * checkpoint must be consumed: a leftover tensor is reported as unexpected, by name. MTP layers
 * not asked for (load_mtp = 0) and the V3.2 indexer tensors (dense attention is used; exact
 * for contexts <= index_topk) are validated but not uploaded. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/hash.h"
#include "core/status.h"
#include "io/model_files.h"
#include "model/model_internal.h"

typedef struct loader {
    di_model *m;
    const di_weights *ws;
    const char *dir;
    di_strmap *used;   /* names consumed (tensors and their scales) */
} loader;

static di_status mark_used(loader *L, const char *name) {
    if (di_strmap_put(L->used, name, strlen(name), 1) != 0)
        return di_error(DI_ERR_NOMEM, "loading %s: out of memory", L->dir);
    return DI_OK;
}

static const di_tensor_info *find(loader *L, const char *name) { return di_weights_find(L->ws, name); }

/* A [rows, cols] matrix (rows = 0: a vector of cols values). FP8 only when allow_fp8. */
static di_status get_tensor(loader *L, const char *name, int rows, int cols, int allow_fp8,
                            di_host_matrix *out) {
    const di_tensor_info *t = find(L, name);
    char want[64], got[64];
    int64_t ws[2] = {rows, cols};
    int wnd = rows ? 2 : 1;
    di_tensor_shape_str(wnd, rows ? ws : ws + 1, want, sizeof want);
    if (!t)
        return di_error(DI_ERR_NOT_FOUND, "%s: missing tensor '%s' (expected shape %s)", L->dir, name, want);
    if (t->ndim != wnd || t->shape[0] != (rows ? rows : cols) || (rows && t->shape[1] != cols))
        return di_error(DI_ERR_FORMAT, "%s: tensor '%s' has shape %s, expected %s", t->file, name,
                        di_tensor_shape_str(t->ndim, t->shape, got, sizeof got), want);
    int ok = t->dtype == DI_DTYPE_F32 || t->dtype == DI_DTYPE_BF16 || t->dtype == DI_DTYPE_F16 ||
             (allow_fp8 && t->dtype == DI_DTYPE_F8_E4M3);
    if (!ok)
        return di_error(DI_ERR_FORMAT, "%s: tensor '%s' has dtype %s, expected F32, BF16 or F16%s",
                        t->file, name, di_dtype_name(t->dtype), allow_fp8 ? " or F8_E4M3" : "");
    DI_TRY(mark_used(L, name));
    memset(out, 0, sizeof *out);
    out->name = t->name;
    out->dtype = t->dtype;
    out->rows = rows ? rows : 1;
    out->cols = cols;
    out->data = t->data;
    if (t->dtype == DI_DTYPE_F8_E4M3) {
        const di_model_config *c = &L->m->cfg;
        int br = c->weight_block[0] > 0 ? c->weight_block[0] : 128;
        int bc = c->weight_block[1] > 0 ? c->weight_block[1] : 128;
        char sname[512];
        snprintf(sname, sizeof sname, "%s_scale_inv", name);
        const di_tensor_info *s = find(L, sname);
        int64_t ss[2] = {(rows + br - 1) / br, (cols + bc - 1) / bc};
        di_tensor_shape_str(2, ss, want, sizeof want);
        if (!s)
            return di_error(DI_ERR_NOT_FOUND, "%s: FP8 tensor '%s' has no '%s' (expected F32 %s)", L->dir,
                            name, sname, want);
        if (s->dtype != DI_DTYPE_F32 || s->ndim != 2 || s->shape[0] != ss[0] || s->shape[1] != ss[1])
            return di_error(DI_ERR_FORMAT, "%s: tensor '%s' is %s %s, expected F32 %s (%dx%d blocks of '%s')",
                            s->file, sname, di_dtype_name(s->dtype),
                            di_tensor_shape_str(s->ndim, s->shape, got, sizeof got), want, br, bc, name);
        DI_TRY(mark_used(L, sname));
        out->scale = s->data;
        out->block_rows = br;
        out->block_cols = bc;
    }
    return DI_OK;
}

static di_status upload(loader *L, int n, int n_parts, const di_host_matrix *parts,
                        di_weight_layout layout, di_weight *w) {
    di_backend *be = L->m->be;
    di_status s = be->weight_upload(be, n, n_parts, parts, layout, w);
    if (s != DI_OK) return di_error_context(s, "%s: ", L->dir);
    L->m->weight_bytes += w->bytes;
    return DI_OK;
}

static di_status load_one(loader *L, const char *name, int rows, int cols, int fp8, di_weight *w) {
    di_host_matrix hm;
    DI_TRY(get_tensor(L, name, rows, cols, fp8, &hm));
    return upload(L, 1, 1, &hm, DI_WEIGHT_PLAIN, w);
}

#define NAME(buf, ...) snprintf(buf, sizeof buf, __VA_ARGS__)

/* gate_proj + up_proj (+ down_proj) of an MLP with width I under `prefix`. */
static di_status load_mlp(loader *L, const char *prefix, int I, di_weight *gate_up, di_weight *down) {
    int D = L->m->cfg.hidden_size;
    char n1[256], n2[256];
    di_host_matrix parts[2];
    NAME(n1, "%s.gate_proj.weight", prefix);
    NAME(n2, "%s.up_proj.weight", prefix);
    DI_TRY(get_tensor(L, n1, I, D, 1, &parts[0]));
    DI_TRY(get_tensor(L, n2, I, D, 1, &parts[1]));
    DI_TRY(upload(L, 1, 2, parts, DI_WEIGHT_PLAIN, gate_up));
    NAME(n1, "%s.down_proj.weight", prefix);
    return load_one(L, n1, D, I, 1, down);
}

static di_status load_experts(loader *L, const char *prefix, di_layer *ly) {
    const di_model_config *c = &L->m->cfg;
    int E = c->n_routed_experts, D = c->hidden_size, I = c->moe_intermediate_size;
    di_host_matrix *parts = calloc((size_t)E * 2, sizeof *parts);
    if (!parts) return di_error(DI_ERR_NOMEM, "%s: out of memory", L->dir);
    char n1[256];
    di_status s = DI_OK;
    for (int e = 0; e < E && s == DI_OK; e++) {
        NAME(n1, "%s.experts.%d.gate_proj.weight", prefix, e);
        s = get_tensor(L, n1, I, D, 1, &parts[2 * e]);
        if (s != DI_OK) break;
        NAME(n1, "%s.experts.%d.up_proj.weight", prefix, e);
        s = get_tensor(L, n1, I, D, 1, &parts[2 * e + 1]);
    }
    if (s == DI_OK) s = upload(L, E, 2, parts, DI_WEIGHT_PLAIN, &ly->exp_gate_up);
    for (int e = 0; e < E && s == DI_OK; e++) {
        NAME(n1, "%s.experts.%d.down_proj.weight", prefix, e);
        s = get_tensor(L, n1, D, I, 1, &parts[e]);
    }
    if (s == DI_OK) s = upload(L, E, 1, parts, DI_WEIGHT_PLAIN, &ly->exp_down);
    free(parts);
    return s;
}

static di_status load_attention(loader *L, const char *p, di_layer *ly) {
    const di_model_config *c = &L->m->cfg;
    int D = c->hidden_size, H = c->num_attention_heads, dn = c->qk_nope_head_dim;
    int dr = c->qk_rope_head_dim, dv = c->v_head_dim, r = c->kv_lora_rank, qk = dn + dr;
    char n[256];
    if (c->q_lora_rank > 0) {
        NAME(n, "%s.self_attn.q_a_proj.weight", p);
        DI_TRY(load_one(L, n, c->q_lora_rank, D, 1, &ly->q_a));
        NAME(n, "%s.self_attn.q_a_layernorm.weight", p);
        DI_TRY(load_one(L, n, 0, c->q_lora_rank, 0, &ly->q_a_norm));
        NAME(n, "%s.self_attn.q_b_proj.weight", p);
        DI_TRY(load_one(L, n, H * qk, c->q_lora_rank, 1, &ly->q_b));
    } else {
        NAME(n, "%s.self_attn.q_proj.weight", p);
        DI_TRY(load_one(L, n, H * qk, D, 1, &ly->q));
    }
    NAME(n, "%s.self_attn.kv_a_proj_with_mqa.weight", p);
    DI_TRY(load_one(L, n, r + dr, D, 1, &ly->kv_a));
    NAME(n, "%s.self_attn.kv_a_layernorm.weight", p);
    DI_TRY(load_one(L, n, 0, r, 0, &ly->kv_a_norm));
    NAME(n, "%s.self_attn.o_proj.weight", p);
    DI_TRY(load_one(L, n, D, H * dv, 1, &ly->o));
    /* kv_b_proj: whole (naive path) and per head (absorbed path) */
    di_host_matrix kvb;
    NAME(n, "%s.self_attn.kv_b_proj.weight", p);
    DI_TRY(get_tensor(L, n, H * (dn + dv), r, 1, &kvb));
    DI_TRY(upload(L, 1, 1, &kvb, DI_WEIGHT_PLAIN, &ly->kv_b));
    di_host_matrix *heads = calloc((size_t)H, sizeof *heads);
    if (!heads) return di_error(DI_ERR_NOMEM, "%s: out of memory", L->dir);
    for (int h = 0; h < H; h++) {
        heads[h] = kvb;
        heads[h].row0 = h * (dn + dv);
        heads[h].rows = dn;
    }
    di_status s = upload(L, H, 1, heads, DI_WEIGHT_TRANSPOSED, &ly->w_uk_t);
    for (int h = 0; h < H && s == DI_OK; h++) {
        heads[h].row0 = h * (dn + dv) + dn;
        heads[h].rows = dv;
    }
    if (s == DI_OK) s = upload(L, H, 1, heads, DI_WEIGHT_PLAIN, &ly->w_uv);
    free(heads);
    if (s != DI_OK) return s;
    if (c->arch == DI_ARCH_DEEPSEEK_V32) {  /* indexer: validated, not used (dense attention) */
        di_host_matrix hm;
        int nh = c->index_n_heads, hd = c->index_head_dim;
        NAME(n, "%s.self_attn.indexer.wq_b.weight", p);
        DI_TRY(get_tensor(L, n, nh * hd, c->q_lora_rank, 1, &hm));
        NAME(n, "%s.self_attn.indexer.wk.weight", p);
        DI_TRY(get_tensor(L, n, hd, D, 1, &hm));
        NAME(n, "%s.self_attn.indexer.k_norm.weight", p);
        DI_TRY(get_tensor(L, n, 0, hd, 0, &hm));
        NAME(n, "%s.self_attn.indexer.k_norm.bias", p);
        DI_TRY(get_tensor(L, n, 0, hd, 0, &hm));
        NAME(n, "%s.self_attn.indexer.weights_proj.weight", p);
        DI_TRY(get_tensor(L, n, nh, D, 0, &hm));
    }
    return DI_OK;
}

static di_status load_layer(loader *L, int l, di_layer *ly) {
    const di_model_config *c = &L->m->cfg;
    int D = c->hidden_size;
    char p[64], n[256];
    NAME(p, "model.layers.%d", l);
    ly->index = l;
    ly->is_moe = di_config_layer_is_moe(c, l);
    NAME(n, "%s.input_layernorm.weight", p);
    DI_TRY(load_one(L, n, 0, D, 0, &ly->attn_norm));
    NAME(n, "%s.post_attention_layernorm.weight", p);
    DI_TRY(load_one(L, n, 0, D, 0, &ly->ffn_norm));
    DI_TRY(load_attention(L, p, ly));
    NAME(p, "model.layers.%d.mlp", l);
    if (!ly->is_moe) return load_mlp(L, p, c->intermediate_size, &ly->gate_up, &ly->down);
    NAME(n, "%s.gate.weight", p);
    DI_TRY(load_one(L, n, c->n_routed_experts, D, 0, &ly->router));
    if (c->topk_method == DI_TOPK_NOAUX_TC) {
        NAME(n, "%s.gate.e_score_correction_bias", p);
        DI_TRY(load_one(L, n, 0, c->n_routed_experts, 0, &ly->router_bias));
    }
    DI_TRY(load_experts(L, p, ly));
    if (c->n_shared_experts > 0) {
        NAME(n, "%s.shared_experts", p);
        DI_TRY(load_mlp(L, n, c->moe_intermediate_size * c->n_shared_experts, &ly->sh_gate_up, &ly->sh_down));
    }
    return DI_OK;
}

/* 1 if two tensors hold identical bytes (MTP embed/head duplicating the main ones). */
static int same_tensor(const di_tensor_info *a, const di_tensor_info *b) {
    return a && b && a->dtype == b->dtype && a->nbytes == b->nbytes &&
           (a->data == b->data || memcmp(a->data, b->data, a->nbytes) == 0);
}

static di_status load_mtp_extras(loader *L, int l, di_layer *ly) {
    const di_model_config *c = &L->m->cfg;
    int D = c->hidden_size, V = c->vocab_size;
    char n[256];
    NAME(n, "model.layers.%d.enorm.weight", l);
    DI_TRY(load_one(L, n, 0, D, 0, &ly->enorm));
    NAME(n, "model.layers.%d.hnorm.weight", l);
    DI_TRY(load_one(L, n, 0, D, 0, &ly->hnorm));
    NAME(n, "model.layers.%d.eh_proj.weight", l);
    DI_TRY(load_one(L, n, D, 2 * D, 1, &ly->eh_proj));
    NAME(n, "model.layers.%d.shared_head.norm.weight", l);
    DI_TRY(load_one(L, n, 0, D, 0, &ly->head_norm));
    /* embed_tokens / shared_head.head: the Hub files repeat the main tensors; share them when
     * byte-identical, else upload the layer's own (absent: use the main ones) */
    struct { const char *suffix, *main_name; di_weight *w; } own[2] = {
        {"embed_tokens.weight", "model.embed_tokens.weight", &ly->mtp_embed},
        {"shared_head.head.weight", L->m->lm_head_tied ? "model.embed_tokens.weight" : "lm_head.weight", &ly->mtp_head}};
    for (int i = 0; i < 2; i++) {
        NAME(n, "model.layers.%d.%s", l, own[i].suffix);
        const di_tensor_info *t = find(L, n);
        if (!t) continue;
        di_host_matrix hm;
        DI_TRY(get_tensor(L, n, V, D, 0, &hm));
        if (!same_tensor(t, find(L, own[i].main_name)))
            DI_TRY(upload(L, 1, 1, &hm, DI_WEIGHT_PLAIN, own[i].w));
    }
    return DI_OK;
}

/* Marks every tensor of skipped MTP layers after validating it parses as a layer tensor. */
static di_status skip_prefix(loader *L, const char *prefix) {
    size_t n = di_weights_count(L->ws), len = strlen(prefix);
    for (size_t i = 0; i < n; i++) {
        const di_tensor_info *t = di_weights_at(L->ws, i);
        if (strncmp(t->name, prefix, len) == 0) DI_TRY(mark_used(L, t->name));
    }
    return DI_OK;
}

static di_status check_unexpected(loader *L) {
    size_t n = di_weights_count(L->ws);
    int64_t v;
    for (size_t i = 0; i < n; i++) {
        const di_tensor_info *t = di_weights_at(L->ws, i);
        if (!di_strmap_get(L->used, t->name, strlen(t->name), &v))
            return di_error(DI_ERR_FORMAT, "%s: unexpected tensor '%s' (in %s) for a %s config with %d layers%s",
                            L->dir, t->name, t->file, L->m->cfg.model_type, L->m->cfg.num_hidden_layers,
                            L->m->cfg.num_nextn_predict_layers ? " + MTP" : "");
    }
    return DI_OK;
}

di_status di_model_load_weights(di_model *m, const di_weights *ws, const char *dir) {
    const di_model_config *c = &m->cfg;
    /* the io layer's exact-layout check first (names every missing / unexpected tensor);
     * the per-tensor checks below stay as a second line for what we actually read */
    DI_TRY(di_model_files_check(c, ws, m->n_mtp ? DI_MTP_REQUIRED : DI_MTP_OPTIONAL, dir));
    loader L = {m, ws, dir, di_strmap_create(di_weights_count(ws) + 16)};
    if (!L.used) return di_error(DI_ERR_NOMEM, "%s: out of memory", dir);
    int D = c->hidden_size, V = c->vocab_size;
    di_status s = load_one(&L, "model.embed_tokens.weight", V, D, 0, &m->embed);
    if (s == DI_OK) s = load_one(&L, "model.norm.weight", 0, D, 0, &m->final_norm);
    m->lm_head_tied = c->tie_word_embeddings;
    if (s == DI_OK && !m->lm_head_tied) s = load_one(&L, "lm_head.weight", V, D, 0, &m->lm_head);
    if (s == DI_OK && m->lm_head_tied && find(&L, "lm_head.weight")) s = mark_used(&L, "lm_head.weight");
    for (int l = 0; l < m->n_layers + m->n_mtp && s == DI_OK; l++) {
        s = load_layer(&L, l, &m->layers[l]);
        if (s == DI_OK && l >= m->n_layers) s = load_mtp_extras(&L, l, &m->layers[l]);
    }
    for (int l = m->n_layers + m->n_mtp; l < m->n_layers + c->num_nextn_predict_layers && s == DI_OK; l++) {
        char p[64];
        snprintf(p, sizeof p, "model.layers.%d.", l);
        s = skip_prefix(&L, p);
    }
    if (s == DI_OK) s = check_unexpected(&L);
    di_strmap_free(L.used);
    return s;
}

static void free_layer(di_backend *be, di_layer *ly) {
    di_weight *all[] = {&ly->attn_norm, &ly->ffn_norm, &ly->q_a, &ly->q_a_norm, &ly->q_b, &ly->q,
                        &ly->kv_a, &ly->kv_a_norm, &ly->kv_b, &ly->w_uk_t, &ly->w_uv, &ly->o,
                        &ly->gate_up, &ly->down, &ly->router, &ly->router_bias, &ly->exp_gate_up,
                        &ly->exp_down, &ly->sh_gate_up, &ly->sh_down, &ly->enorm, &ly->hnorm,
                        &ly->eh_proj, &ly->head_norm, &ly->mtp_embed, &ly->mtp_head};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) be->weight_free(be, all[i]);
}

void di_model_free_weights(di_model *m) {
    if (!m->be) return;
    if (m->layers)
        for (int l = 0; l < m->n_layers + m->n_mtp; l++) free_layer(m->be, &m->layers[l]);
    m->be->weight_free(m->be, &m->embed);
    m->be->weight_free(m->be, &m->final_norm);
    m->be->weight_free(m->be, &m->lm_head);
}
