/* exec_model.c - the executor over the real model (model/model.h): di_model_forward into a
 * host logits buffer sized [max_seqs, vocab] at load, di_model_forward_sample_rows for steps the
 * engine samples inside the model (on CUDA: on the device, decode steps from CUDA graphs; see
 * executor.h), di_model_copy_blocks for copy-on-write. EOS ids come from config.json
 * (eos_token_id, an int or a list). device_sampling: on for CUDA; DEEPINFER_DEVICE_SAMPLING=0/1
 * overrides (read once here). Asynchronous steps (launch / collect, model.h) unless
 * DEEPINFER_ASYNC_STEPS=0. With device sampling, the decode graphs of every batch size up to
 * max_seqs are captured at create (di_model_warmup_decode), so no request's first steps pay
 * for them; DEEPINFER_GRAPH_WARMUP=0 leaves them to the first step of each size. */
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/status.h"
#include "core/timer.h"
#include "engine/executor.h"

typedef struct model_exec {
    di_model *m;
    float *logits;   /* [max_seqs, vocab] host */
} model_exec;

static di_status m_forward(void *ctx, const di_batch *b, const float **logits) {
    model_exec *x = ctx;
    DI_TRY(di_model_forward(x->m, b, x->logits));
    *logits = x->logits;
    return DI_OK;
}

static di_status m_forward_sample(void *ctx, const di_batch *b, const di_sample_row *rows, int32_t *tokens,
                                  int32_t *status) {
    return di_model_forward_sample_rows(((model_exec *)ctx)->m, b, rows, tokens, status);
}

static di_status m_launch(void *ctx, const di_batch *b, const di_sample_row *rows, const int32_t *chain) {
    return di_model_sample_launch(((model_exec *)ctx)->m, b, rows, chain);
}

static di_status m_collect(void *ctx, int32_t *tokens, int32_t *status) {
    return di_model_sample_collect(((model_exec *)ctx)->m, tokens, status);
}

static di_status m_copy(void *ctx, const int32_t *src, const int32_t *dst, int n) {
    return di_model_copy_blocks(((model_exec *)ctx)->m, src, dst, n);
}

static void m_destroy(void *ctx) {
    model_exec *x = ctx;
    if (!x) return;
    di_model_free(x->m);
    free(x->logits);
    free(x);
}

struct di_model *di_executor_model_of(const di_executor *ex) { return ((const model_exec *)ex->ctx)->m; }

di_status di_executor_model_create(const char *dir, const di_model_options *opts, di_executor *out) {
    memset(out, 0, sizeof *out);
    model_exec *x = calloc(1, sizeof *x);
    if (!x) return di_error(DI_ERR_NOMEM, "out of memory");
    di_status s = di_model_load(dir, opts, &x->m);
    if (s != DI_OK) {
        free(x);
        return s;
    }
    const di_model_config *c = di_model_config_of(x->m);
    int max_seqs = opts->max_seqs > 0 ? opts->max_seqs : 256;
    x->logits = malloc((size_t)max_seqs * (size_t)c->vocab_size * sizeof *x->logits);
    if (!x->logits) {
        m_destroy(x);
        return di_error(DI_ERR_NOMEM, "out of memory for %d x %d logits", max_seqs, c->vocab_size);
    }
    out->ctx = x;
    out->vocab_size = c->vocab_size;
    out->n_kv_blocks = di_model_kv_blocks(x->m);
    out->max_model_len = opts->max_context > 0 ? opts->max_context : c->max_position_embeddings;
    for (int i = 0; i < c->n_eos && i < DI_EXECUTOR_MAX_EOS; i++) out->eos_ids[out->n_eos++] = c->eos_token_ids[i];
    out->forward = m_forward;
    out->forward_sample = m_forward_sample;
    const char *env = getenv("DEEPINFER_DEVICE_SAMPLING");
    out->device_sampling = env && *env ? env[0] != '0' : opts->device == DI_DEVICE_CUDA;
    /* the CPU backend's rows are batch-invariant (cpu_matmul.c); the CUDA backend's are not (its
     * kernels and split counts follow the batch size), so exact recompute would buy nothing */
    out->exact_recompute = opts->device == DI_DEVICE_CPU;
    const char *as = getenv("DEEPINFER_ASYNC_STEPS");
    if (!(as && as[0] == '0')) {
        out->launch_sample = m_launch;
        out->collect_sample = m_collect;
    }
    out->copy_blocks = m_copy;
    out->destroy = m_destroy;
    /* decode graphs of every batch-size bucket the engine can run, captured now rather than in
     * the first steps of each batch size (DEEPINFER_GRAPH_WARMUP=0: lazily, as before) */
    const char *wu = getenv("DEEPINFER_GRAPH_WARMUP");
    if (out->device_sampling && !(wu && wu[0] == '0')) {
        double t0 = di_now_s();
        int n = 0;
        s = di_model_warmup_decode(x->m, max_seqs, &n);
        if (s != DI_OK) {
            di_executor_destroy(out);
            return s;
        }
        if (n > 0) DI_LOG_I("decode graphs of %d batch sizes captured in %.2f s", n, di_now_s() - t0);
    }
    return DI_OK;
}
