/* cuda_mla_prefill.cu - naive (decompressed) MLA attention for prefill chunks over the paged
 * latent cache, flash-style: memory is linear in context length.
 *
 * For a group of sequences and a window [c0, c0 + CH) of context positions:
 *   1. k_prefill_gather copies the window's cache rows (c | k_pe) into a dense buffer;
 *   2. one GEMM decompresses them: kv[row, h*(dn+dv) + j] = W_kvb[h*(dn+dv) + j, :] · c_row;
 *   3. the attention kernel updates every query of the group with those keys (causal), with an
 *      online softmax whose state (m, l, O in fp32) persists in scratch between windows; the
 *      last window writes out[t, h, :] = O / l in bf16.
 * Usually one window covers the whole context (CH = max context) and the state never leaves
 * registers. Kernels: fast (dn 128, rope 64, dv 128: DeepSeek V2/V3) = 64 queries x 1 head per
 * block, 64-key tiles double-buffered through shared memory, mma.sync for Q·Kᵀ and P·V with P
 * kept in registers; generic = one warp per (query, head), any shape.
 *
 * Owner: cuda. Scratch (carved from the caller's buffer, sized by
 * cuda_mla_prefill_scratch_bytes for max_tokens): lat [cap, r+dr] bf16, kv [cap, H*(dn+dv)]
 * bf16, state [n_tokens*H][2] f32, acc [n_tokens*H][dv] f32 (this step's tokens), then the
 * dense rows: as many as the rest of the buffer holds (>= max(max_tokens, 4096) rounded to 64
 * when sized by the query). Invariant: rows of the dense buffer that no sequence owns are
 * never read. */
#include <math.h>

#include "backend/cuda/cuda_mma.cuh"

typedef struct pf_args {
    bf16 *out;
    const bf16 *q, *lat, *kv, *cache;
    long ldq;
    const int32_t *seq_start, *ctx_len, *block_table;
    int max_blocks, g0, g1, c0, CH;
    int H, dn, dr, dv, r;
    float scale;
    int first, last;
    float *state, *acc;
} pf_args;

/* lat[(seq - g0) * CH + (p - c0)] = cache row of position p of seq, for p < ctx. */
__global__ void k_prefill_gather(pf_args a, int W) {
    long ri = blockIdx.x;
    int seq = a.g0 + (int)(ri / a.CH), p = a.c0 + (int)(ri % a.CH);
    if (seq >= a.g1 || p >= a.ctx_len[seq]) return;
    int blk = a.block_table[(long)seq * a.max_blocks + p / DI_KV_BLOCK_SIZE];
    const bf16 *src = a.cache + ((long)blk * DI_KV_BLOCK_SIZE + p % DI_KV_BLOCK_SIZE) * W;
    bf16 *dst = (bf16 *)a.lat + ri * W;
    if ((W & 7) == 0) {
        for (int i = threadIdx.x; i < W / 8; i += blockDim.x) ((uint4 *)dst)[i] = ((const uint4 *)src)[i];
    } else {
        for (int i = threadIdx.x; i < W; i += blockDim.x) dst[i] = src[i];
    }
}

/* ---------------------------------------------------------------- generic ---- */

enum { PG_MAXV = 16, PG_MAXQ = 24 }; /* per-lane registers: dv <= 512, dn + dr <= 768 */

__global__ void k_prefill_generic(pf_args a) {
    int qi = blockIdx.x, seq = a.g0 + blockIdx.z, lane = threadIdx.x & 31;
    int h = blockIdx.y * 4 + (threadIdx.x >> 5);
    if (seq >= a.g1 || h >= a.H) return;
    int t0 = a.seq_start[seq], q_len = a.seq_start[seq + 1] - t0;
    if (qi >= q_len) return;
    int ctx = a.ctx_len[seq], t = t0 + qi, pos = ctx - q_len + qi;
    int dn = a.dn, dr = a.dr, dv = a.dv, W = a.r + dr, kvw = dn + dv, H = a.H;
    float q[PG_MAXQ], o[PG_MAXV];
    const bf16 *qh = a.q + (long)t * a.ldq + (long)h * (dn + dr);
#pragma unroll
    for (int i = 0; i < PG_MAXQ; i++) {
        int j = lane + 32 * i;
        q[i] = j < dn + dr ? __bfloat162float(qh[j]) : 0.f;
    }
    long si = (long)t * H + h;
    float m = -INFINITY, l = 0.f;
    if (!a.first) {
        m = a.state[si * 2];
        l = a.state[si * 2 + 1];
    }
#pragma unroll
    for (int i = 0; i < PG_MAXV; i++) {
        int j = lane + 32 * i;
        o[i] = (!a.first && j < dv) ? a.acc[si * dv + j] : 0.f;
    }
    int kend = min(min(a.c0 + a.CH, ctx), pos + 1);
    for (int p = a.c0; p < kend; p++) {
        long row = (long)(seq - a.g0) * a.CH + (p - a.c0);
        const bf16 *kn = a.kv + row * H * kvw + (long)h * kvw, *kp = a.lat + row * W + a.r;
        float d = 0.f;
#pragma unroll
        for (int i = 0; i < PG_MAXQ; i++) {
            int j = lane + 32 * i;
            if (j < dn) d += q[i] * __bfloat162float(kn[j]);
            else if (j < dn + dr) d += q[i] * __bfloat162float(kp[j - dn]);
        }
        for (int off = 16; off > 0; off >>= 1) d += __shfl_xor_sync(0xffffffffu, d, off);
        float sc = a.scale * d, mn = fmaxf(m, sc);
        float corr = expf(m - mn), pr = expf(sc - mn);
        l = l * corr + pr;
#pragma unroll
        for (int i = 0; i < PG_MAXV; i++) {
            int j = lane + 32 * i;
            o[i] = o[i] * corr + (j < dv ? pr * __bfloat162float(kn[dn + j]) : 0.f);
        }
        m = mn;
    }
    if (a.last) {
        float inv = 1.0f / l;
#pragma unroll
        for (int i = 0; i < PG_MAXV; i++) {
            int j = lane + 32 * i;
            if (j < dv) a.out[si * dv + j] = __float2bfloat16_rn(o[i] * inv);
        }
    } else {
        if (lane == 0) {
            a.state[si * 2] = m;
            a.state[si * 2 + 1] = l;
        }
#pragma unroll
        for (int i = 0; i < PG_MAXV; i++) {
            int j = lane + 32 * i;
            if (j < dv) a.acc[si * dv + j] = o[i];
        }
    }
}

/* ---------------------------------------------------------------- fast ---- */

enum { PQ = 64, PKT = 64, PDN = 128, PDR = 64, PDQ = 192, PDV = 128, PLDK = 200, PLDV = 136 };
enum { PSMEM = PQ * PLDK * 2 + 2 * (PKT * PLDK * 2 + PKT * PLDV * 2) };

__global__ void __launch_bounds__(128) k_prefill_fast(pf_args a) {
    extern __shared__ __align__(16) unsigned char sm[];
    bf16 *Qs = (bf16 *)sm;
    bf16 *Kb = (bf16 *)(sm + PQ * PLDK * 2);
    bf16 *Vb = (bf16 *)(sm + PQ * PLDK * 2 + 2 * PKT * PLDK * 2);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int seq = a.g0 + blockIdx.z, h = blockIdx.y, H = a.H;
    if (seq >= a.g1) return;
    const int t0 = a.seq_start[seq], q_len = a.seq_start[seq + 1] - t0, q0 = blockIdx.x * PQ;
    if (q0 >= q_len) return;
    const int ctx = a.ctx_len[seq], first_pos = ctx - q_len;
    const int qmax = first_pos + min(q_len, q0 + PQ) - 1; /* largest query position of the tile */
    const int kend = min(min(a.c0 + a.CH, ctx), qmax + 1);
    const long rowbase = (long)(seq - a.g0) * a.CH - a.c0; /* dense row of position p: rowbase + p */

    /* Q tile */
    for (int c = tid; c < PQ * 24; c += 128) {
        int i = c / 24, ch = c % 24;
        bool ok = q0 + i < q_len;
        const bf16 *src = a.q + (long)(t0 + q0 + i) * a.ldq + (long)h * PDQ + ch * 8;
        cp_async16(Qs + i * PLDK + ch * 8, ok ? (const void *)src : (const void *)a.q, ok ? 16 : 0);
    }
    auto load_tile = [&](int k0, int buf) {
        bf16 *Ks = Kb + buf * PKT * PLDK, *Vs = Vb + buf * PKT * PLDV;
        for (int c = tid; c < PKT * 24; c += 128) { /* K: 16 chunks of k_nope, 8 of k_pe */
            int i = c / 24, ch = c % 24, p = k0 + i;
            bool ok = p < kend;
            long row = rowbase + p;
            const bf16 *src = ch < 16 ? a.kv + row * (H * 256) + (long)h * 256 + ch * 8
                                      : a.lat + row * 576 + 512 + (ch - 16) * 8;
            cp_async16(Ks + i * PLDK + ch * 8, ok ? (const void *)src : (const void *)a.kv, ok ? 16 : 0);
        }
        for (int c = tid; c < PKT * 16; c += 128) {
            int i = c / 16, ch = c % 16, p = k0 + i;
            bool ok = p < kend;
            const bf16 *src = a.kv + (rowbase + p) * (H * 256) + (long)h * 256 + 128 + ch * 8;
            cp_async16(Vs + i * PLDV + ch * 8, ok ? (const void *)src : (const void *)a.kv, ok ? 16 : 0);
        }
    };
    int kb = a.c0;
    if (kb < kend) load_tile(kb, 0);
    cp_async_commit();

    /* state: rows g and g+8 of this warp's 16 queries */
    const int qa = q0 + warp * 16 + g, qb = qa + 8;
    const int pa = first_pos + qa, pb = first_pos + qb;
    const long sa = (long)(t0 + qa) * H + h, sb = (long)(t0 + qb) * H + h;
    const bool va = qa < q_len, vb = qb < q_len;
    float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.f, l_b = 0.f;
    float o[PDV / 8][4];
#pragma unroll
    for (int j = 0; j < PDV / 8; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    if (!a.first) {
        if (va) {
            m_a = a.state[sa * 2];
            l_a = t4 == 0 ? a.state[sa * 2 + 1] : 0.f;
        }
        if (vb) {
            m_b = a.state[sb * 2];
            l_b = t4 == 0 ? a.state[sb * 2 + 1] : 0.f;
        }
#pragma unroll
        for (int j = 0; j < PDV / 8; j++) {
            int col = j * 8 + 2 * t4;
            if (va) {
                float2 v = *(const float2 *)(a.acc + sa * PDV + col);
                o[j][0] = v.x;
                o[j][1] = v.y;
            }
            if (vb) {
                float2 v = *(const float2 *)(a.acc + sb * PDV + col);
                o[j][2] = v.x;
                o[j][3] = v.y;
            }
        }
    }
    cp_async_wait<0>();
    __syncthreads();
    uint32_t qf[PDQ / 16][4];
#pragma unroll
    for (int ks = 0; ks < PDQ / 16; ks++)
        ldsm_x4(qf[ks], Qs + (warp * 16 + (lane & 15)) * PLDK + ks * 16 + (lane >> 4) * 8);

    for (int it = 0; kb < kend; kb += PKT, it++) {
        int buf = it & 1;
        cp_async_wait<0>();
        __syncthreads();
        if (kb + PKT < kend) load_tile(kb + PKT, buf ^ 1);
        cp_async_commit();
        const bf16 *Ks = Kb + buf * PKT * PLDK, *Vs = Vb + buf * PKT * PLDV;
        float s[PKT / 8][4];
#pragma unroll
        for (int j = 0; j < PKT / 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < PDQ / 16; ks++)
#pragma unroll
            for (int j2 = 0; j2 < PKT / 16; j2++) {
                uint32_t bfr[4];
                ldsm_x4(bfr, Ks + (j2 * 16 + ((lane >> 4) & 1) * 8 + (lane & 7)) * PLDK + ks * 16 + ((lane >> 3) & 1) * 8);
                mma16816(s[2 * j2], qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3], bfr[0], bfr[1]);
                mma16816(s[2 * j2 + 1], qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3], bfr[2], bfr[3]);
            }
        float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
        for (int j = 0; j < PKT / 8; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                int p = kb + j * 8 + 2 * t4 + (c & 1);
                bool ok = p < kend && p <= (c < 2 ? pa : pb);
                float v = ok ? s[j][c] * a.scale : -INFINITY;
                s[j][c] = v;
                if (c < 2) mx_a = fmaxf(mx_a, v);
                else mx_b = fmaxf(mx_b, v);
            }
        for (int off = 1; off <= 2; off <<= 1) {
            mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, off));
            mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, off));
        }
        float mn_a = fmaxf(m_a, mx_a), mn_b = fmaxf(m_b, mx_b);
        float ua = mn_a == -INFINITY ? 0.f : mn_a, ub = mn_b == -INFINITY ? 0.f : mn_b; /* fully masked rows */
        float ca = expf(m_a - ua), cb = expf(m_b - ub);
        m_a = mn_a;
        m_b = mn_b;
        l_a *= ca;
        l_b *= cb;
#pragma unroll
        for (int j = 0; j < PDV / 8; j++) {
            o[j][0] *= ca;
            o[j][1] *= ca;
            o[j][2] *= cb;
            o[j][3] *= cb;
        }
        uint32_t pf[PKT / 16][4];
#pragma unroll
        for (int j = 0; j < PKT / 8; j++) {
            float p0 = expf(s[j][0] - ua), p1 = expf(s[j][1] - ua), p2 = expf(s[j][2] - ub), p3 = expf(s[j][3] - ub);
            l_a += p0 + p1;
            l_b += p2 + p3;
            pf[j / 2][(j & 1) * 2] = pack_bf16(p0, p1);
            pf[j / 2][(j & 1) * 2 + 1] = pack_bf16(p2, p3);
        }
#pragma unroll
        for (int ks = 0; ks < PKT / 16; ks++)
#pragma unroll
            for (int j2 = 0; j2 < PDV / 16; j2++) {
                int m8 = lane >> 3;
                uint32_t bfr[4];
                ldsm_x4_t(bfr, Vs + (ks * 16 + (m8 & 1) * 8 + (lane & 7)) * PLDV + j2 * 16 + (m8 >> 1) * 8);
                mma16816(o[2 * j2], pf[ks][0], pf[ks][1], pf[ks][2], pf[ks][3], bfr[0], bfr[1]);
                mma16816(o[2 * j2 + 1], pf[ks][0], pf[ks][1], pf[ks][2], pf[ks][3], bfr[2], bfr[3]);
            }
    }
    cp_async_wait<0>();
    if (a.last) {
        float La = l_a, Lb = l_b;
        for (int off = 1; off <= 2; off <<= 1) {
            La += __shfl_xor_sync(0xffffffffu, La, off);
            Lb += __shfl_xor_sync(0xffffffffu, Lb, off);
        }
        float ia = 1.0f / La, ib = 1.0f / Lb;
#pragma unroll
        for (int j = 0; j < PDV / 8; j++) {
            int col = j * 8 + 2 * t4;
            if (va) *(uint32_t *)(a.out + sa * PDV + col) = pack_bf16(o[j][0] * ia, o[j][1] * ia);
            if (vb) *(uint32_t *)(a.out + sb * PDV + col) = pack_bf16(o[j][2] * ib, o[j][3] * ib);
        }
        return;
    }
    float La = l_a, Lb = l_b;
    for (int off = 1; off <= 2; off <<= 1) {
        La += __shfl_xor_sync(0xffffffffu, La, off);
        Lb += __shfl_xor_sync(0xffffffffu, Lb, off);
    }
    if (t4 == 0) {
        if (va) {
            a.state[sa * 2] = m_a;
            a.state[sa * 2 + 1] = La;
        }
        if (vb) {
            a.state[sb * 2] = m_b;
            a.state[sb * 2 + 1] = Lb;
        }
    }
#pragma unroll
    for (int j = 0; j < PDV / 8; j++) {
        int col = j * 8 + 2 * t4;
        if (va) *(float2 *)(a.acc + sa * PDV + col) = make_float2(o[j][0], o[j][1]);
        if (vb) *(float2 *)(a.acc + sb * PDV + col) = make_float2(o[j][2], o[j][3]);
    }
}

/* ---------------------------------------------------------------- host ---- */

static int cap_rows(int max_tokens) {
    int c = max_tokens > 4096 ? max_tokens : 4096;
    return (c + 63) & ~63;
}

typedef struct pf_scratch {
    bf16 *lat, *kv;
    float *state, *acc;
    int cap; /* rows of lat / kv */
} pf_scratch;

static size_t state_bytes(const di_mla_dims *d, int n_tokens) {
    size_t th = (size_t)n_tokens * d->n_heads;
    return align256(th * 2 * sizeof(float)) + align256(th * d->v_dim * sizeof(float));
}
static size_t row_bytes(const di_mla_dims *d) {
    return ((size_t)d->kv_rank + d->rope_dim + (size_t)d->n_heads * (d->nope_dim + d->v_dim)) * 2;
}

size_t cuda_mla_prefill_scratch_bytes(di_backend *be, const di_mla_dims *d, int max_tokens) {
    (void)be;
    return state_bytes(d, max_tokens) + (size_t)cap_rows(max_tokens) * row_bytes(d) + 512;
}

/* state/acc for this step's tokens first, then as many dense rows as the rest holds */
static void carve(pf_scratch *ps, void *base, size_t bytes, const di_mla_dims *d, int n_tokens) {
    size_t th = (size_t)n_tokens * d->n_heads, W = (size_t)d->kv_rank + d->rope_dim, off = 0;
    char *p = (char *)base;
    ps->state = (float *)p;
    off += align256(th * 2 * sizeof(float));
    ps->acc = (float *)(p + off);
    off += align256(th * d->v_dim * sizeof(float));
    size_t rest = bytes > off + 512 ? bytes - off - 512 : 0;
    size_t cap = rest / row_bytes(d);
    cap &= ~(size_t)63;
    if (cap > (size_t)1 << 30) cap = (size_t)1 << 30;
    ps->cap = (int)cap;
    ps->lat = (bf16 *)(p + off);
    off += align256(cap * W * 2);
    ps->kv = (bf16 *)(p + off);
}

void cuda_mla_prefill(di_backend *be, void *out, const void *q, int ldq, const void *cache, const di_weight *W_kvb,
                      const di_attn_batch *ab, int seq_begin, int seq_end, const di_mla_dims *d, void *scratch,
                      size_t scratch_bytes) {
    cuda_state *st = cst(be);
    int H = d->n_heads, dn = d->nope_dim, dr = d->rope_dim, dv = d->v_dim, r = d->kv_rank, W = r + dr;
    int kvw = H * (dn + dv);
    DI_ASSERT(W_kvb->rows == kvw && W_kvb->cols == r && W_kvb->n == 1);
    if (seq_end <= seq_begin || ab->n_tokens <= 0) return;
    DI_ASSERT(scratch_bytes >= cuda_mla_prefill_scratch_bytes(be, d, ab->n_tokens));
    if (ab->sel_pos) { /* V3.2: each token's selected positions only (cuda_mla_sparse.cu) */
        cuda_mla_sparse_prefill(st, out, q, ldq, cache, W_kvb, ab, seq_begin, seq_end, d, scratch, scratch_bytes);
        return;
    }
    pf_scratch ps;
    carve(&ps, scratch, scratch_bytes, d, ab->n_tokens);
    DI_ASSERT(ps.cap >= 64);
    int fast = dn == PDN && dr == PDR && dv == PDV && r == 512 && ldq % 8 == 0 && ((uintptr_t)q & 15) == 0;
    DI_ASSERT(fast || (dv <= 32 * PG_MAXV && dn + dr <= 32 * PG_MAXQ));
    int max_ctx = ab->max_ctx_len > 0 ? ab->max_ctx_len : 1;
    int CH = ((max_ctx + 63) & ~63);
    if (CH > ps.cap) CH = ps.cap & ~63;
    int G = ps.cap / CH;
    if (G < 1) G = 1;
    int max_q = ab->max_q_len > 0 ? ab->max_q_len : ab->n_tokens;
    pf_args a;
    a.out = (bf16 *)out;
    a.q = (const bf16 *)q;
    a.lat = ps.lat;
    a.kv = ps.kv;
    a.cache = (const bf16 *)cache;
    a.ldq = ldq;
    a.seq_start = ab->seq_start;
    a.ctx_len = ab->seq_ctx_len;
    a.block_table = ab->block_table;
    a.max_blocks = ab->max_blocks;
    a.CH = CH;
    a.H = H;
    a.dn = dn;
    a.dr = dr;
    a.dv = dv;
    a.r = r;
    a.scale = d->softmax_scale;
    a.state = ps.state;
    a.acc = ps.acc;
    static bool attr = false;
    if (fast && !attr) {
        if (cuda_note(st, cudaFuncSetAttribute(k_prefill_fast, cudaFuncAttributeMaxDynamicSharedMemorySize, PSMEM),
                      "prefill smem attribute"))
            return;
        attr = true;
    }
    for (int g0 = seq_begin; g0 < seq_end; g0 += G) {
        int g1 = g0 + G < seq_end ? g0 + G : seq_end, ng = g1 - g0;
        a.g0 = g0;
        a.g1 = g1;
        for (int c0 = 0; c0 < max_ctx; c0 += CH) {
            a.c0 = c0;
            a.first = c0 == 0;
            a.last = c0 + CH >= max_ctx;
            long rows = (long)ng * CH;
            k_prefill_gather<<<(unsigned)rows, 64, 0, st->stream>>>(a, W);
            CUDA_LAUNCHED(st, "prefill_gather");
            cuda_linear(st, ps.kv, kvw, 0, 0, ps.lat, W, W_kvb, (int)rows);
            if (fast) {
                dim3 grid(ceil_div_i(max_q, PQ), H, ng);
                k_prefill_fast<<<grid, 128, PSMEM, st->stream>>>(a);
            } else {
                dim3 grid(max_q, ceil_div_i(H, 4), ng);
                k_prefill_generic<<<grid, 128, 0, st->stream>>>(a);
            }
            CUDA_LAUNCHED(st, "mla_prefill");
        }
    }
}
