/* cuda_moe.cu - the routed experts of a MoE layer on the GPU (the router is cuda_router.cu): all
 * routed experts of a layer without host synchronisation: a one-block kernel counts tokens per
 * expert and builds the permutation, offsets, active-expert list and GEMM tile table on the
 * device; two grouped GEMMs (gate+up with SiLU-mul fused into the epilogue, then down) run over
 * every expert in one launch each; a combine kernel sums each token's experts in its top-k order
 * with the routing weights. Steps of 16..128 tokens with bf16 experts instead pad every expert to
 * T rows (a token picks an expert at most once, so none overflows) and run the two GEMMs as
 * cuBLASLt batched calls (gather, GEMM, SiLU-mul, GEMM, combine): by default over min(E, T*k)
 * slots whose matrices come from pointer arrays the permutation kernel writes (only experts with
 * tokens are read from HBM; every slot's gate+up input is x itself, so there is no gather:
 * st->moe_direct), or strided over all experts (DEEPINFER_CUDA_MOE_LT=1, or when
 * cuBLASLt has no pointer-array algorithm). Steps of at most DEEPINFER_CUDA_MOE_SMALL tokens
 * (default 1) go to cuda_moe_small.cu instead.
 *
 * Owner: cuda. Semantics follow backend.h / cpu_moe.c (HF transformers 5.17). The permutation
 * order inside an expert comes from shared atomics (not deterministic), but every output row
 * depends only on its own input row, so results are. Scratch layout (256-byte aligned): offsets
 * [E+1] i32, tile_off [E+1] i32, active [E+1] i32 (count last), perm [T*k] i32 (position ->
 * token), slot_of [T*k] i32 (pair -> position), A [T*k, I] bf16, Y [T*k, D] bf16, then the
 * padded path's pointer arrays [6][E] and Xp / Hp / Ap / Yp [E*cap] x D / 2I / I / D bf16 (Hp and
 * Yp with cap spare rows more; cap = min(max_tokens, 128)). */
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_pdl.cuh"

/* ---------------------------------------------------------------- experts ---- */

typedef struct moe_scratch {
    int32_t *offsets, *tile_off, *active, *perm, *slot_of;
    bf16 *A, *Y;
    /* batched path: every expert owns `cap` padded rows (cap <= MOE_LT_MAX_CAP); Hp and Yp have
     * cap more rows after the E experts' (the pointer-array path's unused slots write there) */
    const void **ptrs;       /* [6][E]: pointer arrays of the two pointer-array GEMMs */
    bf16 *Xp, *Hp, *Ap, *Yp; /* [E * cap (+ cap)] x [D], [2I], [I], [D] */
} moe_scratch;

enum { MOE_LT_MIN_T = 16, MOE_LT_PTR_MIN_T = 8, MOE_LT_MAX_CAP = 128 };

static size_t carve(moe_scratch *ms, void *base, int Tk, int D, int I, int E, int cap) {
    char *p = (char *)base;
    size_t off = 0;
#define TAKE(field, type, count)                                                                                       \
    do {                                                                                                               \
        if (ms) ms->field = (type *)(p + off);                                                                         \
        off += align256((size_t)(count) * sizeof(type));                                                               \
    } while (0)
    TAKE(offsets, int32_t, E + 1);
    TAKE(tile_off, int32_t, E + 1);
    TAKE(active, int32_t, E + 1);
    TAKE(perm, int32_t, Tk);
    TAKE(slot_of, int32_t, Tk);
    TAKE(A, bf16, (size_t)Tk * I);
    TAKE(Y, bf16, (size_t)Tk * D);
    size_t ec = (size_t)E * cap;
    TAKE(ptrs, const void *, (size_t)6 * E);
    TAKE(Xp, bf16, ec * D);
    TAKE(Hp, bf16, (ec + cap) * 2 * I);
    TAKE(Ap, bf16, ec * I);
    TAKE(Yp, bf16, (ec + cap) * D);
#undef TAKE
    return off;
}

static int lt_cap(int max_tokens) { return max_tokens < MOE_LT_MAX_CAP ? max_tokens : MOE_LT_MAX_CAP; }

size_t cuda_moe_scratch_bytes(di_backend *be, int max_tokens, int k, int D, int I, int E) {
    (void)be;
    return carve(NULL, NULL, max_tokens * k, D, I, E, lt_cap(max_tokens));
}

/* The pointer arrays of the padded path's two cuBLASLt GEMMs (gate+up: W1, Xp -> Hp; down: W2,
 * Ap -> Yp), arr[m * nb + i] for matrix m of slot i < nb. The n active experts (active[], in
 * expert order) take n of the nb slots (their weights and their padded rows at e * cap); each
 * spare slot points at the weights and inputs of the active expert just before it (read at
 * about the same time: L2 hits) and writes the spare cap rows after the E experts' in Hp / Yp,
 * which nobody reads. spread: active j sits in slot floor(j * nb / n), so the spare slots are
 * spread among the active ones (their L2 reads overlap the HBM-bound ones); else active j in
 * slot j and the spare slots after the last (all re-reading its weights at the end). */
typedef struct moe_ptr_args {
    const void **arr; /* NULL: no pointer arrays (strided or grouped path) */
    const bf16 *w1, *w2;
    bf16 *xp, *hp, *ap, *yp;
    const bf16 *x; /* non-NULL: direct (see moe_padded): every slot's gate+up input is x itself */
    int nb, cap, D, I, spread;
} moe_ptr_args;

/* One block: counts per expert, offsets, tile table (tiles of bm rows), the list of experts
 * with tokens (active[0..n), n in active[E]), permutation (perm: position -> token, unless NULL;
 * slot_of: pair -> position); cap > 0: positions are padded rows (expert e owns e*cap..);
 * pa.arr: also the pointer arrays (moe_ptr_args); pa.x (direct): pair (t, j) of expert e sits in
 * row e*cap + t, the row its token has in x (no atomics, no gather). */
__global__ void __launch_bounds__(1024) k_moe_permute(const int32_t *idx, int Tk, int k, int E, int bm,
                                                      int32_t *offsets, int32_t *tile_off, int32_t *active,
                                                      int32_t *perm, int32_t *slot_of, int cap, moe_ptr_args pa,
                                                      const moe_zero *zero) {
    __shared__ int cnt[DI_MAX_EXPERTS], cur[DI_MAX_EXPERTS];
    int tid = threadIdx.x;
    for (int e = tid; e < E; e += blockDim.x) cnt[e] = 0;
    pdl_wait(); /* st->moe_pdl: the ids come from the router */
    if (zero) { /* the fill of a memset node folded into this kernel (moe_zero, cuda_graph_fill.cu) */
        const moe_zero z = *zero;
        if (z.dst)
            for (unsigned long long i = tid; i < z.width; i += blockDim.x) {
                if (z.esize == 4) ((unsigned *)z.dst)[i] = z.value;
                else if (z.esize == 2) ((unsigned short *)z.dst)[i] = (unsigned short)z.value;
                else ((unsigned char *)z.dst)[i] = (unsigned char)z.value;
            }
    }
    __syncthreads();
    for (int i = tid; i < Tk; i += blockDim.x) {
        int e = idx[i];
        if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    if (tid < 32) { /* warp 0: exclusive scans of counts and tile counts, active list */
        int run = 0, trun = 0, arun = 0;
        for (int b = 0; b < E; b += 32) {
            int e = b + tid;
            int c = e < E ? cnt[e] : 0, tc = (c + bm - 1) / bm;
            unsigned has = __ballot_sync(0xffffffffu, c > 0);
            if (c > 0) active[arun + __popc(has & ((1u << tid) - 1u))] = e;
            arun += __popc(has);
            int inc = c, tinc = tc;
            for (int o = 1; o < 32; o <<= 1) {
                int u = __shfl_up_sync(0xffffffffu, inc, o), tu = __shfl_up_sync(0xffffffffu, tinc, o);
                if (tid >= o) {
                    inc += u;
                    tinc += tu;
                }
            }
            if (e < E) {
                offsets[e] = run + inc - c;
                cur[e] = run + inc - c;
                tile_off[e] = trun + tinc - tc;
            }
            run += __shfl_sync(0xffffffffu, inc, 31);
            trun += __shfl_sync(0xffffffffu, tinc, 31);
        }
        if (tid == 0) {
            offsets[E] = run;
            tile_off[E] = trun;
            active[E] = arun;
        }
    }
    __syncthreads(); /* also makes warp 0's global writes (active) visible to the block */
    if (pa.arr && tid < pa.nb) {
        int n = active[E], i = tid, nb = pa.nb, j = -1;
        bool spare = true;
        if (n > 0 && pa.spread) { /* the last active j with floor(j * nb / n) <= i (n <= nb) */
            j = (int)(((long)(i + 1) * n + nb - 1) / nb) - 1;
            spare = (int)((long)j * nb / n) != i;
        } else if (n > 0) {
            j = i < n ? i : n - 1;
            spare = i >= n;
        }
        int e = j >= 0 ? active[j] : 0;
        long cap = pa.cap, D = pa.D, I = pa.I;
        const void **a = pa.arr;
        a[i] = pa.w1 + (long)e * 2 * I * D;
        a[nb + i] = pa.x ? pa.x : pa.xp + (long)e * cap * D;
        a[2 * nb + i] = pa.hp + (spare ? (long)E : (long)e) * cap * 2 * I;
        a[3 * nb + i] = pa.w2 + (long)e * D * I;
        a[4 * nb + i] = pa.ap + (long)e * cap * I;
        a[5 * nb + i] = pa.yp + (spare ? (long)E : (long)e) * cap * D;
    }
    for (int i = tid; i < Tk; i += blockDim.x) {
        int e = idx[i];
        if (e < 0 || e >= E) continue;
        int pos;
        if (pa.x) pos = e * cap + i / k; /* direct: the token's own row of x */
        else {
            pos = atomicAdd(&cur[e], 1);
            if (cap > 0) pos = e * cap + (pos - offsets[e]); /* padded: expert e owns rows e*cap.. */
        }
        if (perm) perm[pos] = i / k;
        slot_of[i] = pos;
    }
}

void *cuda_moe_permute_fn(void) { return (void *)k_moe_permute; }

/* Padded path, one block per (token, expert) pair i: Xp[slot_of[i]] = x[i / k] (D % 8 == 0).
 * Padded rows without a token are never written (nor read back). */
__global__ void k_moe_gather(bf16 *Xp, const bf16 *x, const int32_t *slot_of, int k, int D) {
    int i = blockIdx.x;
    const uint4 *s = (const uint4 *)(x + (long)(i / k) * D);
    uint4 *d = (uint4 *)(Xp + (long)slot_of[i] * D);
    for (int c = threadIdx.x; c < D / 8; c += blockDim.x) d[c] = s[c];
}

/* threads of a k_moe_silu_rows block: one 8-column piece each up to 512 (V2-Lite's I = 1408:
 * 176 pieces, 192 threads; with 128 a quarter of them took a second dependent round trip) */
static int silu_rows_threads(int I) { return I / 8 < 512 ? (I / 8 + 31) / 32 * 32 : 512; }

/* Padded path, one block per pair i: Ap[r] = silu(Hp[r, :I]) * Hp[r, I:] for r = slot_of[i]
 * (I % 8 == 0), the arithmetic of cuda_ops.cu's k_silu_mul (same bits); only rows with a token. */
__global__ void k_moe_silu_rows(bf16 *Ap, const bf16 *Hp, const int32_t *slot_of, int I) {
    pdl_wait(); /* st->moe_pdl: Hp comes from the gate+up GEMM */
    long r = slot_of[blockIdx.x];
    int I8 = I / 8;
    const uint4 *row = (const uint4 *)(Hp + r * 2 * I);
    uint4 *o = (uint4 *)(Ap + r * I);
    for (int c = threadIdx.x; c < I8; c += blockDim.x) o[c] = silu_mul_bf16x8(ld_act16(row + c), ld_act16(row + I8 + c));
}

/* out[t, :] = sum_j w[t, j] * Y[slot_of[t*k + j], :] in j order (fp32). */
__global__ void k_moe_combine(bf16 *out, const bf16 *Y, const int32_t *slot_of, const float *w, int k, int D,
                              int release) {
    if (release) pdl_launch_dependents(); /* st->combine_pdl: the next layer's norm (PDL) may launch */
    pdl_wait();                           /* st->moe_pdl: Y comes from the down GEMM */
    int t = blockIdx.x;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float acc = 0.f;
        for (int j = 0; j < k; j++) {
            long row = slot_of[(long)t * k + j];
            acc += w[(long)t * k + j] * __bfloat162float(Y[row * D + d]);
        }
        out[(long)t * D + d] = __float2bfloat16_rn(acc);
    }
}

/* The same with 8 columns per thread (D % 8 == 0; k <= COMBINE_MAXK): the k rows' 16-byte
 * loads are all issued before the sums, which run in j order as above (same bits). */
__global__ void k_moe_combine_v8(bf16 *out, const bf16 *Y, const int32_t *slot_of, const float *w, int k, int D,
                                 int release) {
    if (release) pdl_launch_dependents();
    pdl_wait(); /* st->moe_pdl: Y comes from the down GEMM */
    int t = blockIdx.x, D8 = D / 8;
    for (int c = threadIdx.x; c < D8; c += blockDim.x) {
        uint4 r[COMBINE_MAXK];
#pragma unroll
        for (int j = 0; j < COMBINE_MAXK; j++)
            if (j < k) r[j] = ld_act16((const uint4 *)(Y + (long)slot_of[(long)t * k + j] * D) + c);
        float acc[8];
#pragma unroll
        for (int i = 0; i < 8; i++) acc[i] = 0.f;
#pragma unroll
        for (int j = 0; j < COMBINE_MAXK; j++)
            if (j < k) {
                float wj = w[(long)t * k + j];
                const bf16 *b = (const bf16 *)&r[j];
#pragma unroll
                for (int i = 0; i < 8; i++) acc[i] += wj * __bfloat162float(b[i]);
            }
        uint4 o;
        bf16 *ob = (bf16 *)&o;
#pragma unroll
        for (int i = 0; i < 8; i++) ob[i] = __float2bfloat16_rn(acc[i]);
        ((uint4 *)(out + (long)t * D))[c] = o;
    }
}

/* pdl: launched with PDL (st->moe_pdl, the padded path: after a cuBLASLt GEMM) */
static void launch_combine(cuda_state *st, bf16 *out, const bf16 *Y, const int32_t *slot_of, const float *w, int k,
                           int D, int T, bool pdl) {
    if (D % 8 == 0 && k <= COMBINE_MAXK && ((uintptr_t)out & 15) == 0 && ((uintptr_t)Y & 15) == 0)
        cuda_launch_pdl(st, pdl, k_moe_combine_v8, dim3(T), dim3(D / 8 < 256 ? (D / 8 + 31) / 32 * 32 : 256), 0, out,
                        Y, slot_of, w, k, D, st->combine_pdl);
    else
        cuda_launch_pdl(st, pdl, k_moe_combine, dim3(T), dim3(256), 0, out, Y, slot_of, w, k, D, st->combine_pdl);
    CUDA_LAUNCHED(st, "moe_combine");
}

/* Decode-sized steps (st->moe_lt >= 1, MOE_LT_MIN_T (moe_lt 3: MOE_LT_PTR_MIN_T) .. 128
 * tokens, bf16, 8-aligned dims): both expert GEMMs on cuBLASLt with cap = T padded rows per
 * expert (a token picks an expert at most once, so none overflows): permute (padded), gather,
 * gate+up GEMM, SiLU-mul of the rows with a token, down GEMM, combine. moe_lt >= 2: batches of
 * nb = min(E, T*k) slots through pointer arrays written by k_moe_permute, so only the experts
 * with tokens stream their weights from HBM (the spare slots re-read an active expert's from
 * L2; moe_ptr_args); with st->moe_direct the token of pair (t, j) keeps row t of its expert's
 * cap rows, and every slot's gate+up input is x itself ([T, D] = [cap, D]): no gather. If
 * cuBLASLt has no pointer-array algorithm (or moe_lt 1), strided batches over all E experts.
 * 0: not taken (the grouped kernels run). */
static int moe_padded(cuda_state *st, void *out, const void *x, const int32_t *topk_idx,
                      const float *topk_w, int k, const di_weight *gate_up, const di_weight *down, int T,
                      moe_scratch *ms, int bm, const void *defer_scratch) {
    int E = gate_up->n, D = gate_up->cols, I = down->cols, Tk = T * k, mode = st->moe_lt;
    int min_t = mode == 3 ? MOE_LT_PTR_MIN_T : MOE_LT_MIN_T; /* 4: as 2, spare slots at the end */
    if (mode < 1 || T < min_t || T > MOE_LT_MAX_CAP || gate_up->dtype != DI_DTYPE_BF16 ||
        down->dtype != DI_DTYPE_BF16 || D % 8 != 0 || I % 8 != 0)
        return 0;
    int cap = T, nb = E < Tk ? E : Tk;
    lt_shape g1 = {2 * I, D, cap, D, 2 * I, 0, 0, 0, E, (long)2 * I * D, (long)cap * D, (long)cap * 2 * I, 0};
    lt_shape g2 = {D, I, cap, I, D, 0, 0, 0, E, (long)D * I, (long)cap * I, (long)cap * D, 0};
    moe_ptr_args pa = {};
    /* pointer arrays: plan_align (cuda_blaslt.cu) takes the weight bases as 256-byte aligned */
    if (mode >= 2 && ((uintptr_t)gate_up->data & 255) == 0 && ((uintptr_t)down->data & 255) == 0) {
        g1.batch = g2.batch = nb;
        g1.ptr_array = g2.ptr_array = 1;
        /* direct: cap = T, so x itself is every slot's [cap, D] input; a row without a token of
         * the expert is computed as in the gathered layout (whose padding rows hold stale
         * data) and never read */
        const bf16 *xd = st->moe_direct ? (const bf16 *)x : NULL;
        if (xd && !lt_ready(st, &g1, xd, ms->Hp)) xd = NULL;
        if (lt_ready(st, &g1, xd ? xd : ms->Xp, ms->Hp) && lt_ready(st, &g2, ms->Ap, ms->Yp))
            pa = moe_ptr_args{ms->ptrs, (const bf16 *)gate_up->data, (const bf16 *)down->data,
                              ms->Xp, ms->Hp, ms->Ap, ms->Yp, xd, nb, cap, D, I, mode != 4};
    }
    if (!pa.arr) { /* strided over all experts */
        if (T < MOE_LT_MIN_T) return 0;
        g1.batch = g2.batch = E;
        g1.ptr_array = g2.ptr_array = 0;
        if (!lt_ready(st, &g1, ms->Xp, ms->Hp) || !lt_ready(st, &g2, ms->Ap, ms->Yp)) return 0;
    }
    const bool pdl = pdl_with(st, st->moe_pdl);
    cuda_launch_pdl(st, pdl, k_moe_permute, dim3(1), dim3(1024), 0, topk_idx, Tk, k, E, bm, ms->offsets, ms->tile_off,
                    ms->active, (int32_t *)NULL, ms->slot_of, cap, pa, (const moe_zero *)st->moe_zero_dev);
    CUDA_LAUNCHED(st, "moe_permute");
    if (!pa.x) {
        k_moe_gather<<<Tk, 128, 0, st->stream>>>(ms->Xp, (const bf16 *)x, ms->slot_of, k, D);
        CUDA_LAUNCHED(st, "moe_gather");
    }
    if (pa.arr) {
        const void **a = ms->ptrs;
        lt_run_ptr(st, &g1, pa.x ? (const void *)pa.x : ms->Xp, ms->Hp, a, a + nb, (void *)(a + 2 * nb));
    } else {
        lt_run(st, &g1, gate_up->data, ms->Xp, ms->Hp);
    }
    cuda_launch_pdl(st, pdl, k_moe_silu_rows, dim3(Tk), dim3(silu_rows_threads(I)), 0, ms->Ap,
                    (const bf16 *)ms->Hp, (const int32_t *)ms->slot_of, I);
    CUDA_LAUNCHED(st, "moe_silu_rows");
    if (pa.arr) {
        const void **a = ms->ptrs;
        lt_run_ptr(st, &g2, ms->Ap, ms->Yp, a + 3 * nb, a + 4 * nb, (void *)(a + 5 * nb));
    } else {
        lt_run(st, &g2, down->data, ms->Ap, ms->Yp);
    }
    if (defer_scratch) { /* moe_experts_defer: the combine is the next add_rmsnorm_experts' */
        st->deferred.scratch = defer_scratch;
        st->deferred.T = T;
        st->deferred.D = D;
        st->deferred.c = moe_comb{ms->Yp, ms->slot_of, topk_w, k};
        st->deferred.spare = ms->Xp; /* read by the gate+up GEMM at most, which is done by then */
        return 1;
    }
    launch_combine(st, (bf16 *)out, ms->Yp, ms->slot_of, topk_w, k, D, T, pdl);
    return 1;
}

void cuda_moe_combine_launch(cuda_state *st, bf16 *out, const moe_comb *c, int D, int T) {
    launch_combine(st, out, c->Y, c->slot_of, c->w, c->k, D, T, false);
}

/* The backend.h contract of moe_experts' weights and scratch (shared by moe_experts_defer). */
static void check_experts(di_backend *be, const di_weight *gate_up, const di_weight *down, int T, int k,
                          size_t scratch_bytes) {
    int E = gate_up->n, D = gate_up->cols, I = down->cols;
    DI_ASSERT(gate_up->rows == 2 * I && down->n == E && down->rows == D && E <= DI_MAX_EXPERTS);
    DI_ASSERT(scratch_bytes >= cuda_moe_scratch_bytes(be, T, k, D, I, E));
}

/* The tile table's row height for T*k pairs over the experts of w: 128 (the wgmma kernel's BM)
 * with >= st->wgmma_min_rows (16) rows per expert on average where the wgmma kernel will take
 * it (bf16; 64, its decode-sized tiles, up to st->wgmma_bm64_max (32) rows on average), else
 * from 96 rows on (the tiled kernel's measured switch point); 64 below. At
 * 24-48 rows per expert the wgmma kernel's mostly empty 128-row tiles still stream the weights
 * near the copy rate, where the tiled kernel's 64-row tiles reached ~55% of it (docs/PERF.md,
 * 2026-12-03). */
static int tile_rows(const cuda_state *st, int Tk, const di_weight *w) {
    bool wg = st->wgmma && w->dtype == DI_DTYPE_BF16;
    int avg = ceil_div_i(Tk, w->n), min_rows = wg ? st->wgmma_min_rows : 96;
    if (avg < min_rows) return 64;
    return wg && wgmma_bm64(st, avg) ? 64 : 128; /* the wgmma kernel's 64-row tiles */
}

void cuda_moe_experts(di_backend *be, void *out, const void *x, const int32_t *topk_idx, const float *topk_w, int k,
                      const di_weight *gate_up, const di_weight *down, int T, void *scratch, size_t scratch_bytes) {
    cuda_state *st = cst(be);
    int E = gate_up->n, D = gate_up->cols, I = down->cols;
    check_experts(be, gate_up, down, T, k, scratch_bytes);
    if (T <= 0) return;
    /* up to st->moe_small (<= 4) tokens: no permutation, each selected expert read once
     * (cuda_moe_small.cu) */
    if (T <= st->moe_small && cuda_moe_small_fits(T, k, gate_up, down, NULL, NULL, scratch_bytes)) {
        cuda_moe_small(st, out, x, topk_idx, topk_w, k, gate_up, down, NULL, NULL, T, scratch);
        return;
    }
    int Tk = T * k;
    moe_scratch ms;
    /* the caller sized the scratch for some max_tokens >= T: the padded area holds lt_cap(T)
     * rows per expert at least */
    carve(&ms, scratch, Tk, D, I, E, lt_cap(T));
    int bm = tile_rows(st, Tk, gate_up);
    moe_ptr_args no_ptrs = {};
    if (moe_padded(st, out, x, topk_idx, topk_w, k, gate_up, down, T, &ms, bm, NULL)) return;
    k_moe_permute<<<1, 1024, 0, st->stream>>>(topk_idx, Tk, k, E, bm, ms.offsets, ms.tile_off, ms.active, ms.perm,
                                              ms.slot_of, 0, no_ptrs, NULL);
    CUDA_LAUNCHED(st, "moe_permute");
    gemm_rows r1 = {ms.offsets, ms.perm, ms.tile_off, bm, Tk, T, ms.active, ms.active + E};
    gemm_out o1 = {ms.A, I, 0, 0, 0, I, 0};
    cuda_gemm(st, &o1, (const bf16 *)x, D, 0, gate_up, &r1);
    gemm_rows r2 = {ms.offsets, NULL, ms.tile_off, bm, Tk, T, ms.active, ms.active + E};
    gemm_out o2 = {ms.Y, D, 0, 0, 0, 0, 0};
    cuda_gemm(st, &o2, ms.A, I, 0, down, &r2);
    launch_combine(st, (bf16 *)out, ms.Y, ms.slot_of, topk_w, k, D, T, false);
}

/* backend.h moe_experts_defer: the padded path (16-128 tokens, bf16) without its combine, which
 * the next add_rmsnorm_experts does (cuda_ops.cu); 0, nothing launched, elsewhere. */
int cuda_moe_experts_defer(di_backend *be, const void *x, const int32_t *topk_idx, const float *topk_w, int k,
                           const di_weight *gate_up, const di_weight *down, int T, void *scratch, size_t scratch_bytes) {
    cuda_state *st = cst(be);
    int E = gate_up->n, D = gate_up->cols, I = down->cols;
    check_experts(be, gate_up, down, T, k, scratch_bytes);
    if (!st->moe_defer || T <= 0) return 0; /* moe_padded declines the small path's sizes itself */
    moe_scratch ms;
    carve(&ms, scratch, T * k, D, I, E, lt_cap(T));
    return moe_padded(st, NULL, x, topk_idx, topk_w, k, gate_up, down, T, &ms, tile_rows(st, T * k, gate_up), scratch);
}
