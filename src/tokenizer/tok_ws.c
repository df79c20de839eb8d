/* tok_ws.c - per-call workspaces: PCRE2 match data, piece lists, BPE scratch and the word cache.
 *
 * A di_tokenizer is shared read-only by all threads; each encode call claims a workspace from a
 * fixed array of slots with one atomic exchange (no lock) and gives it back when done, so the
 * word cache stays warm across calls. When every slot is busy a temporary workspace is made
 * and freed on release. Slots are created lazily and freed with the tokenizer. */
#include <stdlib.h>

#include "tokenizer/tok_internal.h"

static di_tok_ws *ws_create(void) {
    di_tok_ws *ws = calloc(1, sizeof *ws);
    if (!ws) return NULL;
    if (di_tok_match_init(&ws->match) != DI_OK) { free(ws); return NULL; }
    return ws;
}

void di_tok_ws_free(di_tok_ws *ws) {
    if (!ws) return;
    di_tok_match_free(&ws->match);
    di_tok_buf_free(&ws->norm);
    di_tok_buf_free(&ws->norm2);
    di_tok_buf_free(&ws->tmp);
    di_tok_buf_free(&ws->vspace);
    di_tok_buf_free(&ws->word);
    free(ws->pa.v);
    free(ws->pb.v);
    free(ws->ml.v);
    free(ws->el.v);
    free(ws->raw_splits.v);
    free(ws->norm_splits.v);
    free(ws->segs.v);
    di_tok_buf_free(&ws->segs.normtext);
    free(ws->sym_id);
    free(ws->sym_prev);
    free(ws->sym_next);
    free(ws->sym_rank);
    free(ws->heap);
    free(ws->cache);
    free(ws->cache_keys);
    free(ws->cache_ids);
    free(ws);
}

di_tok_ws *di_tok_ws_acquire(const di_tokenizer *tc) {
    di_tokenizer *t = (di_tokenizer *)tc; /* only the atomic slot fields are written */
    for (int i = 0; i < DI_TOK_MAX_WS; i++) {
        if (atomic_load_explicit(&t->ws_busy[i], memory_order_relaxed)) continue;
        if (atomic_exchange_explicit(&t->ws_busy[i], 1, memory_order_acquire)) continue;
        di_tok_ws *ws = atomic_load_explicit(&t->ws[i], memory_order_acquire);
        if (!ws) {
            ws = ws_create();
            if (!ws) {
                atomic_store_explicit(&t->ws_busy[i], 0, memory_order_release);
                return NULL;
            }
            ws->slot = i;
            atomic_store_explicit(&t->ws[i], ws, memory_order_release);
        }
        return ws;
    }
    di_tok_ws *ws = ws_create();
    if (ws) ws->slot = -1;
    return ws;
}

/* Scratch that grew for one very long input is given back, so a long-running server does not
 * keep the peak of every workspace (the word cache has a fixed size and stays). */
#define KEEP_BYTES (4u << 20)
#define TRIM_BUF(b) do { if ((b).cap > KEEP_BYTES) di_tok_buf_free(&(b)); } while (0)
#define TRIM_VEC(x, elem) do { if ((x).cap * (elem) > KEEP_BYTES) { free((x).v); (x).v = NULL; (x).n = (x).cap = 0; } } while (0)

static void trim(di_tok_ws *ws) {
    TRIM_BUF(ws->norm);
    TRIM_BUF(ws->norm2);
    TRIM_BUF(ws->tmp);
    TRIM_BUF(ws->vspace);
    TRIM_BUF(ws->word);
    TRIM_BUF(ws->segs.normtext);
    TRIM_VEC(ws->pa, sizeof(di_tok_piece));
    TRIM_VEC(ws->pb, sizeof(di_tok_piece));
    TRIM_VEC(ws->ml, sizeof(uint32_t));
    TRIM_VEC(ws->el, sizeof(di_tok_entry));
    TRIM_VEC(ws->raw_splits, sizeof(di_tok_split));
    TRIM_VEC(ws->norm_splits, sizeof(di_tok_split));
    TRIM_VEC(ws->segs, sizeof(di_tok_segment));
    if (ws->sym_cap * 24 > KEEP_BYTES) {
        free(ws->sym_id); free(ws->sym_prev); free(ws->sym_next); free(ws->sym_rank); free(ws->heap);
        ws->sym_id = ws->sym_prev = ws->sym_next = NULL;
        ws->sym_rank = NULL;
        ws->heap = NULL;
        ws->sym_cap = 0;
    }
}

void di_tok_ws_release(const di_tokenizer *tc, di_tok_ws *ws) {
    di_tokenizer *t = (di_tokenizer *)tc;
    if (!ws) return;
    if (ws->slot < 0) { di_tok_ws_free(ws); return; }
    trim(ws);
    atomic_store_explicit(&t->ws_busy[ws->slot], 0, memory_order_release);
}

void di_tok_ws_free_all(di_tokenizer *t) {
    for (int i = 0; i < DI_TOK_MAX_WS; i++) {
        di_tok_ws_free(atomic_load(&t->ws[i]));
        atomic_store(&t->ws[i], NULL);
    }
}
