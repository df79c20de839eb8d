/* model_internal.h - the private layout of a loaded model: backend weights per layer, the
 * paged latent KV pool and the activation workspace, shared by model.c (lifecycle, batch
 * validation), weights.c (checkpoint -> backend weights) and deepseek.c (the forward pass).
 *
 * Owner: model. Invariants: every buffer here is allocated at load (di_model_load) and freed
 * by di_model_free; a forward step allocates nothing. Layers [0, num_hidden_layers) are the
 * main model, the next n_mtp are the loaded MTP layers; each layer l owns KV pool layer l. */
#ifndef DI_MODEL_INTERNAL_H
#define DI_MODEL_INTERNAL_H
#include "backend/backend.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "model/model.h"

typedef struct di_layer {
    int index;                     /* layer number in the checkpoint */
    int is_moe;
    di_weight attn_norm, ffn_norm; /* input_layernorm, post_attention_layernorm [1, D] */
    /* MLA */
    di_weight q_a, q_a_norm, q_b;  /* q-LoRA: [q_rank, D], [1, q_rank], [H*(dn+dr), q_rank] */
    di_weight q;                   /* without q-LoRA: [H*(dn+dr), D] */
    di_weight kv_a, kv_a_norm;     /* [r+dr, D], [1, r] */
    di_weight kv_b;                /* [H*(dn+dv), r] (naive path) */
    di_weight w_uk_t;              /* n=H [r, dn]: q̃_h = W_UK_hᵀ q_h^nope (absorbed path) */
    di_weight w_uv;                /* n=H [dv, r]: o_h = W_UV_h ō_h */
    di_weight o;                   /* [D, H*dv] */
    /* FFN: dense */
    di_weight gate_up, down;       /* [2I, D] (gate rows first), [D, I] */
    /* FFN: MoE */
    di_weight router, router_bias; /* [E, D], [1, E] (noaux_tc only) */
    di_weight exp_gate_up, exp_down; /* n=E [2Im, D], n=E [D, Im] */
    di_weight sh_gate_up, sh_down; /* shared experts fused: [2Is, D], [D, Is] (Is = Im*n_shared) */
    /* V3.2 lightning indexer */
    di_weight idx_wq_b, idx_wk;    /* [nh*hd, q_rank], [hd, D] */
    di_weight idx_kn_w, idx_kn_b;  /* k_norm LayerNorm [1, hd] */
    di_weight idx_wproj;           /* weights_proj [nh, D] */
    /* MTP only */
    di_weight enorm, hnorm, eh_proj, head_norm; /* [1,D], [1,D], [D, 2D], [1,D] */
    di_weight mtp_embed, mtp_head; /* own copies when they differ from the main ones (else n=0) */
} di_layer;

struct di_model {
    di_model_config cfg;
    di_model_options opts;
    di_backend *be;
    int n_layers;                  /* main layers */
    int n_mtp;                     /* loaded MTP layers */
    di_layer *layers;              /* [n_layers + n_mtp] */
    di_weight embed, final_norm, lm_head; /* lm_head aliases embed when tied */
    int lm_head_tied;
    /* op parameters */
    di_mla_dims mla;
    di_route_params route;
    di_rope_params rope;           /* rope.inv_freq -> device buffer */
    di_rope_params rope_idx;       /* V3.2 indexer: same table, NeoX pairs */
    int v32;                       /* deepseek_v32: run the lightning indexer */
    int v32_absorbed;              /* V3.2 on a batch-invariant backend (the CPU): every token
                                    * takes the absorbed MLA path, whether or not the batch holds
                                    * a context beyond index_topk (deepseek.c attention) */
    int rope_split_max_t;          /* decode steps of at most this many tokens with a side lane: the
                                    * latent's norm + k_pe rope + cache write beside the query path,
                                    * right after the latent GEMV, and q's rope on the main lane
                                    * (DEEPINFER_ROPE_SPLIT=N, default 1; 0: never) */
    di_indexer_dims idx;
    float *inv_freq;
    /* KV pool: [n_layers + n_mtp][kv_blocks * 64][kv_width] act */
    void *kv;
    int kv_blocks, kv_width;
    size_t kv_layer_stride;        /* elements */
    void *kv_idx;                  /* V3.2 index keys: [layers][kv_blocks * 64][index_head_dim] */
    size_t kv_idx_layer_stride;    /* elements */
    /* limits */
    int max_tokens, max_seqs, max_blocks_per_seq, logits_chunk;
    /* device metadata (i32) */
    int32_t *d_ids, *d_pos, *d_slots, *d_seq_start, *d_ctx_len, *d_block_table, *d_rows;
    int32_t *h_block_table;        /* host staging [max_seqs * max_blocks_per_seq] (zeroed) */
    /* the residual stream, f32 on every backend (backend.h) */
    float *h;                      /* [T, D] */
    float *xr;                     /* f32 [T, D] normed rows for the router and hidden-state output
                                    * (add_rmsnorm's out_f32); NULL on f32-act backends, which
                                    * read x itself */
    float *xg;                     /* f32 [logits_chunk, D] gathered residual rows */
    /* device activations (act dtype) */
    void *x, *cq, *q, *kva, *qt, *olat, *o, *ffn_gu, *ffn_act, *ffn_out;
    void *cat2;                    /* [T, 2D] MTP concat */
    float *logits;                 /* device f32 [logits_chunk, vocab] */

    int32_t *topk_idx;
    float *topk_w, *route_scratch;
    void *prefill_scratch, *moe_scratch;
    size_t prefill_scratch_bytes, moe_scratch_bytes;
    /* V3.2 indexer workspace */
    void *qidx, *kidx;             /* act [T, nh*hd], [T, hd] */
    float *widx;                   /* f32 [T, nh] */
    int32_t *sel_pos, *sel_count;  /* i32 [T, index_topk], [T] */
    void *idx_scratch;
    size_t idx_scratch_bytes;
    size_t weight_bytes, workspace_bytes;
    /* device sampling and decode-step graphs (decode_step.c) */
    struct di_step_state *step;
};

/* weights.c: reads every tensor the config implies from `ws`, uploads them, and fails on
 * missing, mis-shaped, wrongly typed or unexpected tensors (naming them). */
di_status di_model_load_weights(di_model *m, const di_weights *ws, const char *dir);
void di_model_free_weights(di_model *m);

/* deepseek.c: the forward pass over an already validated batch. */
void di_deepseek_upload_batch(di_model *m, const di_batch *b, di_attn_batch *ab);
void di_deepseek_layers(di_model *m, const int32_t *ids, const di_attn_batch *ab, int n_decode_seqs,
                        int n_decode_tokens, const di_weight *final_norm);
di_status di_deepseek_forward(di_model *m, const di_batch *b, float *logits, float *hidden);
di_status di_deepseek_mtp_forward(di_model *m, int k, const di_batch *b, const float *hidden_in,
                                  float *logits, float *hidden_out);
/* model.c: the host-side batch checks of di_model_forward. */
di_status di_model_validate_batch(const di_model *m, const di_batch *b);

/* decode_step.c: backend workspace reservation, device sampling buffers, decode graphs;
 * set up at the end of load, freed before the backend. */
di_status di_model_step_setup(di_model *m);
void di_model_step_free(di_model *m);
/* decode_step.c: the backend sample op's semantics on the host (backend.h): rows j < n of
 * logits [n, V] (host) sampled by smp with rows[j]'s parameters into tokens, status (a
 * DI_SAMPLE_* code per row; NULL: a failed row's error is returned instead). */
struct di_sampler;
di_status di_step_sample_rows_host(struct di_sampler *smp, const float *logits, int n, int V,
                                   const di_sample_row *rows, int32_t *tokens, int32_t *status);
#endif
