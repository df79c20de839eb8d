/* model_files.c - the Hub tensor layout of a config (di_model_tensor_specs) and the
 * checkpoint-vs-config check (di_model_files_check). See model_files.h. */
#include "io/model_files.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/hash.h"
#include "core/status.h"

typedef struct spec_list {
    di_tensor_spec *v;
    size_t n, cap;
    int oom;
    int layer, mtp;       /* current layer context */
} spec_list;

static void add(spec_list *l, di_tensor_role role, int64_t d0, int64_t d1, int optional, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

static void add(spec_list *l, di_tensor_role role, int64_t d0, int64_t d1, int optional, const char *fmt, ...) {
    if (l->oom) return;
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 512;
        di_tensor_spec *nv = realloc(l->v, nc * sizeof *nv);
        if (!nv) { l->oom = 1; return; }
        l->v = nv;
        l->cap = nc;
    }
    di_tensor_spec *s = &l->v[l->n++];
    memset(s, 0, sizeof *s);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->name, sizeof s->name, fmt, ap);
    va_end(ap);
    s->role = role;
    s->ndim = d1 > 0 ? 2 : 1;
    s->shape[0] = d0;
    s->shape[1] = d1 > 0 ? d1 : 0;
    s->layer = l->layer;
    s->mtp = l->mtp;
    s->optional = optional;
}

#define P "model.layers.%d."

static void add_mlp(spec_list *l, int L, const char *part, int64_t width, int64_t D) {
    add(l, DI_TROLE_LINEAR, width, D, 0, P "mlp.%sgate_proj.weight", L, part);
    add(l, DI_TROLE_LINEAR, width, D, 0, P "mlp.%sup_proj.weight", L, part);
    add(l, DI_TROLE_LINEAR, D, width, 0, P "mlp.%sdown_proj.weight", L, part);
}

static void add_layer(spec_list *l, const di_model_config *c, int L) {
    const int64_t D = c->hidden_size, H = c->num_attention_heads, qk = di_config_qk_head_dim(c);
    add(l, DI_TROLE_NORM, D, 0, 0, P "input_layernorm.weight", L);
    if (c->q_lora_rank > 0) {
        add(l, DI_TROLE_LINEAR, c->q_lora_rank, D, 0, P "self_attn.q_a_proj.weight", L);
        add(l, DI_TROLE_NORM, c->q_lora_rank, 0, 0, P "self_attn.q_a_layernorm.weight", L);
        add(l, DI_TROLE_LINEAR, H * qk, c->q_lora_rank, 0, P "self_attn.q_b_proj.weight", L);
    } else {
        add(l, DI_TROLE_LINEAR, H * qk, D, 0, P "self_attn.q_proj.weight", L);
    }
    add(l, DI_TROLE_LINEAR, di_config_kv_width(c), D, 0, P "self_attn.kv_a_proj_with_mqa.weight", L);
    add(l, DI_TROLE_NORM, c->kv_lora_rank, 0, 0, P "self_attn.kv_a_layernorm.weight", L);
    add(l, DI_TROLE_LINEAR, H * (c->qk_nope_head_dim + c->v_head_dim), c->kv_lora_rank, 0, P "self_attn.kv_b_proj.weight", L);
    add(l, DI_TROLE_LINEAR, D, H * c->v_head_dim, 0, P "self_attn.o_proj.weight", L);
    if (c->arch == DI_ARCH_DEEPSEEK_V32) {
        const int64_t ih = c->index_n_heads, id = c->index_head_dim;
        add(l, DI_TROLE_LINEAR, ih * id, c->q_lora_rank, 0, P "self_attn.indexer.wq_b.weight", L);
        add(l, DI_TROLE_LINEAR, id, D, 0, P "self_attn.indexer.wk.weight", L);
        add(l, DI_TROLE_NORM, id, 0, 0, P "self_attn.indexer.k_norm.weight", L);
        add(l, DI_TROLE_NORM_BIAS, id, 0, 0, P "self_attn.indexer.k_norm.bias", L);
        add(l, DI_TROLE_LINEAR_KEEP, ih, D, 0, P "self_attn.indexer.weights_proj.weight", L);
    }
    add(l, DI_TROLE_NORM, D, 0, 0, P "post_attention_layernorm.weight", L);
    if (!di_config_layer_is_moe(c, L)) {
        add_mlp(l, L, "", c->intermediate_size, D);
        return;
    }
    add(l, DI_TROLE_ROUTER, c->n_routed_experts, D, 0, P "mlp.gate.weight", L);
    if (c->topk_method == DI_TOPK_NOAUX_TC)
        add(l, DI_TROLE_ROUTER_BIAS, c->n_routed_experts, 0, 0, P "mlp.gate.e_score_correction_bias", L);
    for (int e = 0; e < c->n_routed_experts; e++) {
        char part[32];
        snprintf(part, sizeof part, "experts.%d.", e);
        add_mlp(l, L, part, c->moe_intermediate_size, D);
    }
    if (c->n_shared_experts > 0) add_mlp(l, L, "shared_experts.", (int64_t)c->moe_intermediate_size * c->n_shared_experts, D);
}

di_status di_model_tensor_specs(const di_model_config *c, di_tensor_spec **out, size_t *n) {
    spec_list l = {0};
    const int64_t V = c->vocab_size, D = c->hidden_size;
    l.layer = -1;
    add(&l, DI_TROLE_EMBED, V, D, 0, "model.embed_tokens.weight");
    for (int L = 0; L < c->num_hidden_layers; L++) {
        l.layer = L;
        add_layer(&l, c, L);
    }
    l.layer = -1;
    add(&l, DI_TROLE_NORM, D, 0, 0, "model.norm.weight");
    add(&l, DI_TROLE_LM_HEAD, V, D, c->tie_word_embeddings, "lm_head.weight");
    l.mtp = 1;
    for (int L = c->num_hidden_layers; L < di_config_total_layers(c); L++) {
        l.layer = L;
        add(&l, DI_TROLE_EMBED, V, D, 1, P "embed_tokens.weight", L);
        add(&l, DI_TROLE_NORM, D, 0, 0, P "enorm.weight", L);
        add(&l, DI_TROLE_NORM, D, 0, 0, P "hnorm.weight", L);
        add(&l, DI_TROLE_LINEAR_KEEP, D, 2 * D, 0, P "eh_proj.weight", L);
        add_layer(&l, c, L);
        add(&l, DI_TROLE_NORM, D, 0, 0, P "shared_head.norm.weight", L);
        add(&l, DI_TROLE_LM_HEAD, V, D, 1, P "shared_head.head.weight", L);
    }
    if (l.oom) {
        free(l.v);
        return di_error(DI_ERR_NOMEM, "out of memory listing the tensors of the model");
    }
    *out = l.v;
    *n = l.n;
    return DI_OK;
}

char *di_scale_name(const char *weight_name, char *buf, size_t len) {
    size_t n = strlen(weight_name);
    if (n < 7 || strcmp(weight_name + n - 7, ".weight") != 0) return NULL;
    if (snprintf(buf, len, "%s_scale_inv", weight_name) >= (int)len) return NULL;
    return buf;
}

void di_scale_shape(const di_model_config *c, const int64_t shape[2], int64_t out[2]) {
    out[0] = (shape[0] + c->weight_block[0] - 1) / c->weight_block[0];
    out[1] = (shape[1] + c->weight_block[1] - 1) / c->weight_block[1];
}

/* ---- the check ---- */

#define MAX_LISTED 6

typedef struct name_list {
    char text[1024];
    int count;
} name_list;

static void note(name_list *nl, const char *name) {
    if (nl->count++ < MAX_LISTED) {
        size_t k = strlen(nl->text);
        snprintf(nl->text + k, sizeof nl->text - k, "%s'%s'", k ? ", " : "", name);
    }
}

static int float_dtype(di_dtype t) { return t == DI_DTYPE_F32 || t == DI_DTYPE_BF16 || t == DI_DTYPE_F16; }

static int shape_eq(const di_tensor_info *t, int ndim, const int64_t *shape) {
    if (t->ndim != ndim) return 0;
    for (int i = 0; i < ndim; i++)
        if (t->shape[i] != shape[i]) return 0;
    return 1;
}

/* Checks one present tensor against its spec (and its scale, if FP8). */
static di_status check_one(const di_model_config *c, const di_weights *w, const di_tensor_spec *s, const di_tensor_info *t) {
    char want[96], got[96];
    if (!shape_eq(t, s->ndim, s->shape))
        return di_error(DI_ERR_FORMAT, "%s: tensor '%s' has shape %s, expected %s", t->file, s->name,
                        di_tensor_shape_str(t->ndim, t->shape, got, sizeof got),
                        di_tensor_shape_str(s->ndim, s->shape, want, sizeof want));
    if (t->dtype == DI_DTYPE_F8_E4M3 && di_tensor_role_quantizable(s->role)) {
        if (!c->fp8)
            return di_error(DI_ERR_FORMAT, "%s: tensor '%s' is F8_E4M3 but config.json has no fp8 quantization_config",
                            t->file, s->name);
        char sn[DI_TENSOR_NAME_MAX + 16];
        int64_t ss[2];
        di_scale_name(s->name, sn, sizeof sn);
        di_scale_shape(c, s->shape, ss);
        const di_tensor_info *sc = di_weights_find(w, sn);
        if (!sc)
            return di_error(DI_ERR_NOT_FOUND, "%s: FP8 tensor '%s' has no block scale '%s' (expected F32 %s)", t->file,
                            s->name, sn, di_tensor_shape_str(2, ss, want, sizeof want));
        if (sc->dtype != DI_DTYPE_F32 || !shape_eq(sc, 2, ss))
            return di_error(DI_ERR_FORMAT, "%s: tensor '%s' is %s %s, expected F32 %s (%dx%d blocks of '%s')", sc->file, sn,
                            di_dtype_name(sc->dtype), di_tensor_shape_str(sc->ndim, sc->shape, got, sizeof got),
                            di_tensor_shape_str(2, ss, want, sizeof want), c->weight_block[0], c->weight_block[1], s->name);
        return DI_OK;
    }
    if (!float_dtype(t->dtype))
        return di_error(DI_ERR_FORMAT, "%s: tensor '%s' has dtype %s, expected F32, BF16 or F16%s", t->file, s->name,
                        di_dtype_name(t->dtype), di_tensor_role_quantizable(s->role) && c->fp8 ? " (or F8_E4M3 with a scale)" : "");
    return DI_OK;
}

/* 1 if `name` is "<w>.weight_scale_inv" for a present F8 weight w with a quantizable spec. */
static int is_valid_scale(const di_weights *w, const di_strmap *specs, const di_tensor_spec *v, const char *name) {
    size_t n = strlen(name);
    const char *suf = "_scale_inv";
    if (n <= 10 || strcmp(name + n - 10, suf) != 0) return 0;
    int64_t i;
    if (!di_strmap_get(specs, name, n - 10, &i) || !di_tensor_role_quantizable(v[i].role)) return 0;
    const di_tensor_info *base = di_weights_find(w, v[i].name);
    return base && base->dtype == DI_DTYPE_F8_E4M3;
}

di_status di_model_files_check(const di_model_config *c, const di_weights *w, di_mtp_mode mtp, const char *where) {
    di_tensor_spec *v = NULL;
    size_t n = 0;
    DI_TRY(di_model_tensor_specs(c, &v, &n));
    di_strmap *specs = di_strmap_create(n);
    di_status s = DI_OK;
    if (!specs) { s = di_error(DI_ERR_NOMEM, "out of memory"); goto done; }
    for (size_t i = 0; i < n; i++)
        if (di_strmap_put(specs, v[i].name, strlen(v[i].name), (int64_t)i) != 0) { s = di_error(DI_ERR_NOMEM, "out of memory"); goto done; }
    /* present tensors: known and well-formed? */
    name_list unexpected = {{0}, 0};
    for (size_t k = 0; k < di_weights_count(w); k++) {
        const di_tensor_info *t = di_weights_at(w, k);
        int64_t i;
        if (di_strmap_get(specs, t->name, strlen(t->name), &i)) {
            if ((s = check_one(c, w, &v[i], t)) != DI_OK) goto done;
        } else if (!is_valid_scale(w, specs, v, t->name)) {
            note(&unexpected, t->name);
        }
    }
    name_list missing = {{0}, 0};
    for (size_t i = 0; i < n; i++) {
        if (v[i].optional || (v[i].mtp && mtp == DI_MTP_OPTIONAL)) continue;
        if (!di_weights_find(w, v[i].name)) note(&missing, v[i].name);
    }
    if (missing.count) {
        s = di_error(DI_ERR_NOT_FOUND, "%s: %d tensor%s missing for this %s config (%d layers%s): %s%s", where, missing.count,
                     missing.count > 1 ? "s" : "", c->model_type, c->num_hidden_layers,
                     mtp == DI_MTP_REQUIRED ? " + MTP" : "", missing.text, missing.count > MAX_LISTED ? ", ..." : "");
        goto done;
    }
    if (unexpected.count) {
        s = di_error(DI_ERR_FORMAT, "%s: %d unexpected tensor%s for this %s config (%d layers, %d MTP): %s%s", where,
                     unexpected.count, unexpected.count > 1 ? "s" : "", c->model_type, c->num_hidden_layers,
                     c->num_nextn_predict_layers, unexpected.text, unexpected.count > MAX_LISTED ? ", ..." : "");
        goto done;
    }
done:
    di_strmap_free(specs);
    free(v);
    return s;
}
