/* rng.h - the sampler's counter-based random numbers: Philox-4x32-10 (Salmon, Moraes, Dror,
 * Shaw, "Parallel Random Numbers: As Easy as 1, 2, 3", SC'11).
 *
 * A draw is a pure function of (seed, position, stream, draw index): no state, so a request's
 * samples never depend on which other requests share its batch, on preemption, or on the
 * backend. The keying (docs/engine.md, "RNG"), fixed so that CUDA reproduces it bit for bit:
 *   key     = { (uint32)seed, (uint32)(seed >> 32) }
 *   counter = { position, stream, draw, DI_RNG_DOMAIN_SAMPLE }
 *   value   = word 0 of Philox4x32_10(counter, key)
 * position = index of the token being sampled in its sequence (prompt length + output index),
 * stream   = completion index (0 .. n-1) of the request,
 * draw     = 0 for the token draw (further indices are reserved, e.g. speculative decoding). */
#ifndef DI_SAMPLING_RNG_H
#define DI_SAMPLING_RNG_H
#include <stdint.h>

#define DI_RNG_DOMAIN_SAMPLE 0x53414d50u  /* "SAMP" */

/* The raw block function: out = Philox4x32 with 10 rounds of (ctr, key). */
void di_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* The sampler's 32-bit draw (see the keying above). */
uint32_t di_rng_u32(uint64_t seed, uint32_t position, uint32_t stream, uint32_t draw);

/* splitmix64 finalizer: derives per-request seeds from an engine seed and a request id. */
static inline uint64_t di_rng_mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
#endif
