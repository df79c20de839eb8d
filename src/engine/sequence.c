/* sequence.c - token and block-table storage of a sequence (see sequence.h). */
#include "engine/sequence.h"

#include <stdlib.h>
#include <string.h>

#include "core/status.h"

di_status di_seq_init(di_seq *s, const int32_t *prompt, int prompt_len, int cap) {
    memset(s, 0, sizeof *s);
    if (prompt_len < 1 || cap < prompt_len)
        return di_error(DI_ERR_INVALID_ARG, "sequence: prompt of %d tokens, capacity %d", prompt_len, cap);
    s->cap = cap;
    s->cap_blocks = (cap + DI_BLOCK_TOKENS - 1) / DI_BLOCK_TOKENS;
    s->tokens = calloc((size_t)cap, sizeof *s->tokens); /* zeroed: a chained step reads its unappended slot */
    s->blocks = malloc((size_t)s->cap_blocks * sizeof *s->blocks);
    s->hashes = malloc((size_t)s->cap_blocks * sizeof *s->hashes);
    if (!s->tokens || !s->blocks || !s->hashes) {
        di_seq_release(s);
        return di_error(DI_ERR_NOMEM, "sequence: out of memory for %d tokens", cap);
    }
    memcpy(s->tokens, prompt, (size_t)prompt_len * sizeof *prompt);
    s->len = s->prompt_len = prompt_len;
    s->seats = 1;
    s->n_cached_first = -1;
    return DI_OK;
}

void di_seq_release(di_seq *s) {
    if (!s) return;
    free(s->tokens);
    free(s->blocks);
    free(s->hashes);
    s->tokens = NULL;
    s->blocks = NULL;
    s->hashes = NULL;
    s->n_blocks = 0;
}

void di_seq_copy_tokens(di_seq *dst, const di_seq *src) {
    DI_ASSERT(dst->cap >= src->len);
    memcpy(dst->tokens, src->tokens, (size_t)src->len * sizeof *src->tokens);
    dst->len = src->len;
    dst->prompt_len = src->prompt_len;
    memcpy(dst->hashes, src->hashes, (size_t)src->n_hashed * sizeof *src->hashes);
    dst->n_hashed = src->n_hashed;
}

void di_seq_hash_blocks(di_seq *s, int n_full) {
    DI_ASSERT(n_full * DI_BLOCK_TOKENS <= s->len && n_full <= s->cap_blocks);
    for (int j = s->n_hashed; j < n_full; j++)
        s->hashes[j] = di_block_manager_hash(di_seq_parent_hash(s, j), s->tokens + (size_t)j * DI_BLOCK_TOKENS);
    if (n_full > s->n_hashed) s->n_hashed = n_full;
}
