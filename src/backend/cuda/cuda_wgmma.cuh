/* cuda_wgmma.cuh - Hopper warpgroup MMA primitives shared by the wgmma kernels (inline PTX):
 * shared-memory matrix descriptors for 128-byte-swizzled bf16 tiles (K-major and MN-major),
 * wgmma.mma_async m64n256k16 / m64n128k16 / m64n64k16 (bf16 in, fp32 accumulate), fences,
 * commit / wait, named barriers.
 *
 * Owner: cuda. Used by cuda_gemm_wgmma.cu (grouped expert GEMM) and cuda_mla_decode_wgmma.cu.
 * Layout of a swizzled tile: chunk c (16 bytes = 8 bf16) of 128-byte row r lives at
 * r * 128 + ((c ^ (r % 8)) * 16) inside a 1024-byte aligned block of 8-row atoms. Outside an
 * sm_90a device pass the MMAs trap (the dispatch never calls them there). */
#ifndef DI_BACKEND_CUDA_WGMMA_CUH
#define DI_BACKEND_CUDA_WGMMA_CUH
#include "backend/cuda/cuda_mma.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DI_WGMMA 1
#endif

/* The accumulator operands of the wgmma asm statements: d[i .. i + 7] etc. as "+f" operands */
#define DI_ACC8(i)                                                                                                   \
    "+f"(d[(i)]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3]), "+f"(d[(i) + 4]), "+f"(d[(i) + 5]),         \
        "+f"(d[(i) + 6]), "+f"(d[(i) + 7])
#define DI_ACC32(i) DI_ACC8(i), DI_ACC8((i) + 8), DI_ACC8((i) + 16), DI_ACC8((i) + 24)
#define DI_ACC64(i) DI_ACC32(i), DI_ACC32((i) + 32)
/* The body of a wgmma wrapper compiled for a target without wgmma (never launched there) */
#define DI_WGMMA_MISSING()                                                                                           \
    do {                                                                                                             \
        (void)d;                                                                                                     \
        (void)da;                                                                                                    \
        (void)db;                                                                                                    \
        __trap();                                                                                                    \
    } while (0)

/* Shared-memory matrix descriptor of a K-major bf16 tile with 128-byte rows, SWIZZLE_128B:
 * start address >> 4 (bits 0-13), leading byte offset (unused for swizzled K-major, 1),
 * stride byte offset = 1024 (8-row atoms, >> 4, bits 32-45), layout type 1 = 128B swizzle
 * (bits 62-63). Base offset 0: every tile starts 1024-byte aligned; the k16 slices of a
 * 64-wide tile start 32 bytes apart (the swizzle applies to the computed address). */
static __device__ __forceinline__ uint64_t wg_desc(uint32_t saddr) {
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
           ((uint64_t)1 << 62);
}

static __device__ __forceinline__ void wg_fence() {
#ifdef DI_WGMMA
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
static __device__ __forceinline__ void wg_commit() {
#ifdef DI_WGMMA
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
static __device__ __forceinline__ void wg_wait() {
#ifdef DI_WGMMA
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
/* keeps the compiler from moving accumulator reads / writes across the async MMAs */
template <int N = 128>
static __device__ __forceinline__ void wg_fence_acc(float *d) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}
/* cp.async writes (generic proxy) -> visible to wgmma reads (async proxy) */
static __device__ __forceinline__ void fence_proxy_async() {
#ifdef DI_WGMMA
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

/* d[64 x 256] += A[64 x 16] . B[256 x 16]^T, A K-major in shared memory, B K-major (TB = 0) or
 * MN-major (TB = 1: B stored as 16 k-rows of 256 contiguous n, see wg_desc_mn) in shared memory */
template <int TB = 0>
static __device__ __forceinline__ void wgmma_256(float *d, uint64_t da, uint64_t db) {
#ifdef DI_WGMMA
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
        "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
        "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"
        "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"
        "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"
        "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,"
        "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"
        "}, %128, %129, p, 1, 1, 0, %131;\n"
        "}\n"
        : DI_ACC64(0), DI_ACC64(64)
        : "l"(da), "l"(db), "r"(1), "n"(TB));
#else
    DI_WGMMA_MISSING();
#endif
}

/* MN-major (transposed) descriptor, SWIZZLE_128B: the operand is stored as k-rows of 64
 * contiguous m/n elements (128 bytes, swizzled), 8 k-rows per 1024-byte atom; sbo = bytes
 * between 8-k-row atoms, lbo = bytes between the 64-element column blocks along m/n. */
static __device__ __forceinline__ uint64_t wg_desc_mn(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)((lbo >> 4) & 0x3FFF) << 16) |
           ((uint64_t)((sbo >> 4) & 0x3FFF) << 32) | ((uint64_t)1 << 62);
}

/* d[64 x 64] += A[64 x 16] . B[64 x 16]^T, both K-major in shared memory */
static __device__ __forceinline__ void wgmma_64(float *d, uint64_t da, uint64_t db) {
#ifdef DI_WGMMA
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
        "}, %32, %33, p, 1, 1, 0, 0;\n"
        "}\n"
        : DI_ACC32(0)
        : "l"(da), "l"(db), "r"(1));
#else
    DI_WGMMA_MISSING();
#endif
}

/* d[64 x 128] += A[64 x 16] . B[128 x 16]^T, both K-major in shared memory */
static __device__ __forceinline__ void wgmma_128(float *d, uint64_t da, uint64_t db) {
#ifdef DI_WGMMA
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
        "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
        "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
        "}, %64, %65, p, 1, 1, 0, 0;\n"
        "}\n"
        : DI_ACC64(0)
        : "l"(da), "l"(db), "r"(1));
#else
    DI_WGMMA_MISSING();
#endif
}

/* Named barriers (ids 1..15; 0 is __syncthreads) for warpgroups handing shared-memory buffers
 * to each other: sync waits until n threads (a multiple of 32) have arrived or synced on id,
 * arrive counts this thread's warp and goes on. Both order the memory accesses before them.
 * Not .aligned (bar.sync / bar.arrive are): the two sides of one barrier are different
 * instructions in different warps, which .aligned leaves undefined. */
static __device__ __forceinline__ void named_bar_sync(int id, int n) {
    asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
static __device__ __forceinline__ void named_bar_arrive(int id, int n) {
    asm volatile("barrier.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

#endif
