/* penalties.c - token count maps and the repetition / frequency / presence penalties
 * (see penalties.h for the exact math). */
#include "sampling/penalties.h"

#include <stdlib.h>
#include <string.h>

#include "core/status.h"

/* FP contraction would turn l - c * f into one fused op on FMA machines and change the last
 * bit; the CUDA port must see the same two roundings. */
#define NO_CONTRACT __attribute__((optimize("fp-contract=off")))

static inline uint32_t slot_of(int32_t token, uint32_t cap) {
    uint32_t h = (uint32_t)token * 0x9E3779B1u;
    return (h ^ (h >> 15)) & (cap - 1);
}

static di_status rehash(di_token_counts *c, uint32_t ncap) {
    int32_t *nk = malloc((size_t)ncap * sizeof *nk);
    int32_t *nc = malloc((size_t)ncap * sizeof *nc);
    if (!nk || !nc) {
        free(nk);
        free(nc);
        return di_error(DI_ERR_NOMEM, "token counts: out of memory growing to %u entries", ncap);
    }
    memset(nk, 0xff, (size_t)ncap * sizeof *nk);
    for (uint32_t i = 0; i < c->cap; i++) {
        if (c->keys[i] < 0) continue;
        uint32_t j = slot_of(c->keys[i], ncap);
        while (nk[j] >= 0) j = (j + 1) & (ncap - 1);
        nk[j] = c->keys[i];
        nc[j] = c->counts[i];
    }
    free(c->keys);
    free(c->counts);
    c->keys = nk;
    c->counts = nc;
    c->cap = ncap;
    return DI_OK;
}

di_status di_token_counts_reserve(di_token_counts *c, uint32_t n) {
    uint32_t need = 16;
    while (need < 2 * n) need <<= 1;
    if (need <= c->cap) return DI_OK;
    return rehash(c, need);
}

di_status di_token_counts_add(di_token_counts *c, int32_t token) {
    DI_ASSERT(token >= 0);
    if (2 * (c->n + 1) > c->cap) DI_TRY(rehash(c, c->cap ? c->cap * 2 : 16));
    uint32_t j = slot_of(token, c->cap);
    while (c->keys[j] >= 0) {
        if (c->keys[j] == token) {
            c->counts[j]++;
            return DI_OK;
        }
        j = (j + 1) & (c->cap - 1);
    }
    c->keys[j] = token;
    c->counts[j] = 1;
    c->n++;
    return DI_OK;
}

int32_t di_token_counts_get(const di_token_counts *c, int32_t token) {
    if (!c || c->cap == 0 || token < 0) return 0;
    uint32_t j = slot_of(token, c->cap);
    while (c->keys[j] >= 0) {
        if (c->keys[j] == token) return c->counts[j];
        j = (j + 1) & (c->cap - 1);
    }
    return 0;
}

di_status di_token_counts_copy(di_token_counts *dst, const di_token_counts *src) {
    if (dst == src) return DI_OK;
    di_token_counts_free(dst);
    if (src->cap == 0) return DI_OK;
    dst->keys = malloc((size_t)src->cap * sizeof *dst->keys);
    dst->counts = malloc((size_t)src->cap * sizeof *dst->counts);
    if (!dst->keys || !dst->counts) {
        di_token_counts_free(dst);
        return di_error(DI_ERR_NOMEM, "token counts: out of memory copying %u entries", src->cap);
    }
    memcpy(dst->keys, src->keys, (size_t)src->cap * sizeof *dst->keys);
    memcpy(dst->counts, src->counts, (size_t)src->cap * sizeof *dst->counts);
    dst->cap = src->cap;
    dst->n = src->n;
    return DI_OK;
}

void di_token_counts_clear(di_token_counts *c) {
    if (c->cap) memset(c->keys, 0xff, (size_t)c->cap * sizeof *c->keys);
    c->n = 0;
}

void di_token_counts_free(di_token_counts *c) {
    if (!c) return;
    free(c->keys);
    free(c->counts);
    memset(c, 0, sizeof *c);
}

int di_penalties_active(const di_sampling_params *p) {
    return p->repetition_penalty != 1.0f || p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f;
}

static NO_CONTRACT float repeat(float l, float r) { return l > 0.0f ? l / r : l * r; }

static NO_CONTRACT float freq_presence(float l, float count, float f, float pres) {
    float t = count * f;
    l = l - t;
    return l - pres;
}

void di_penalties_apply(float *logits, int vocab, const di_sampling_params *p,
                        const di_token_counts *prompt, const di_token_counts *output, uint8_t *mark) {
    const float r = p->repetition_penalty;
    if (r != 1.0f) {
        /* every distinct token of prompt U output once: mark while applying, then unmark */
        const di_token_counts *sets[2] = {prompt, output};
        for (int s = 0; s < 2; s++) {
            const di_token_counts *c = sets[s];
            if (!c) continue;
            for (uint32_t i = 0; i < c->cap; i++) {
                int32_t t = c->keys[i];
                if (t < 0 || t >= vocab || mark[t]) continue;
                mark[t] = 1;
                logits[t] = repeat(logits[t], r);
            }
        }
        for (int s = 0; s < 2; s++) {
            const di_token_counts *c = sets[s];
            if (!c) continue;
            for (uint32_t i = 0; i < c->cap; i++)
                if (c->keys[i] >= 0 && c->keys[i] < vocab) mark[c->keys[i]] = 0;
        }
    }
    if ((p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f) && output) {
        for (uint32_t i = 0; i < output->cap; i++) {
            int32_t t = output->keys[i];
            if (t < 0 || t >= vocab) continue;
            logits[t] = freq_presence(logits[t], (float)output->counts[i], p->frequency_penalty,
                                      p->presence_penalty);
        }
    }
}
