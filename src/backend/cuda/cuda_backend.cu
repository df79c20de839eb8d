/* cuda_backend.cu - the CUDA backend (Hopper sm_90a): creation, the op table, device memory
 * and pinned staging, weight upload (bf16, or fp8 e4m3 + 128x128 block scales kept as in the
 * checkpoint; all f32 for the f32 op table of cuda_f32.cu; parts checked and converted on the
 * host by backend_host.c), the step workspace
 * (reserve) and CUDA-graph capture hooks.
 *
 * Owner: cuda. Invariants: ops are enqueued on the main stream, or between side_begin and
 * side_end on the side stream (two non-blocking streams, forked and joined with events, which
 * graph capture records as edges; the side lane has its own cuBLASLt workspace); the host
 * never waits except in download() and sync(), which join the side lane and report the first
 * recorded asynchronous error; upload() stages through pinned memory (reset at each host-visible sync
 * point) so step metadata copies are asynchronous; no allocation outside load/reserve. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.h"
#include "backend/backend_host.h"

/* ---------------------------------------------------------------- errors ---- */

int cuda_note(cuda_state *st, cudaError_t e, const char *what) {
    if (e == cudaSuccess) return 0;
    if (!st->err[0])
        snprintf(st->err, sizeof st->err, "cuda backend: %s: %s (%s)", what, cudaGetErrorString(e),
                 cudaGetErrorName(e));
    return 1;
}

void cuda_note_msg(cuda_state *st, const char *msg) {
    if (!st->err[0]) snprintf(st->err, sizeof st->err, "cuda backend: %s", msg);
}

/* Returns the recorded error (and clears it) or DI_OK. */
static di_status take_error(cuda_state *st) {
    if (!st->err[0]) return DI_OK;
    di_status s = di_error(DI_ERR_BACKEND, "%s", st->err);
    st->err[0] = 0;
    return s;
}

/* A default-on switch: on unless the variable is set and starts with '0'. */
static int env_on(const char *name) {
    const char *v = getenv(name);
    return !(v && v[0] == '0');
}

/* A default-off switch: on only when the variable is set and starts with '1'. */
static int env_set(const char *name) {
    const char *v = getenv(name);
    return v && v[0] == '1';
}

/* The device's peak memory bandwidth from its memory clock and bus width, bytes/s (0 unknown). */
static double peak_mem_bw(int device) {
    int khz = 0, bits = 0;
    if (cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, device) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return 2.0 * khz * 1e3 * bits / 8.0; /* double data rate */
}

/* DEEPINFER_CUDA_LT_PTR_TILE_M's default: 128 on cards of at least 4 TB/s peak (the H200: 4.8),
 * 64 below (the H100's 3.35). Measured with 3 rounds in one call each (v2lite-8l, batch 16 /
 * 32 / 64 tok/s): H200 64 -> 128: 7357-7361 -> 7407-7411, 12608-12613 -> 12653-12656, 23428-
 * 23440 -> 23413-23424; on an H100 64 beat 128 and 32 (docs/PERF.md, 2026-12-05 / 12-06). */
static int default_ptr_tile_m(int device) { return peak_mem_bw(device) >= 4e12 ? 128 : 64; }

static di_status cuda_fail(cudaError_t e, const char *what) {
    return di_error(DI_ERR_BACKEND, "cuda backend: %s: %s", what, cudaGetErrorString(e));
}

/* ---------------------------------------------------------------- memory ---- */

static di_status c_alloc(di_backend *be, size_t bytes, void **out) {
    cuda_state *st = cst(be);
    *out = NULL;
    cudaError_t e = cudaMalloc(out, bytes ? bytes : 256);
    if (e != cudaSuccess) {
        cudaGetLastError();
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        return di_error(DI_ERR_NOMEM, "cuda backend: out of device memory allocating %zu bytes (%zu of %zu free): %s",
                        bytes, fr, tot, cudaGetErrorString(e));
    }
    (void)st;
    return DI_OK;
}

static void c_free(di_backend *be, void *p) {
    if (!p) return;
    cuda_note(cst(be), cudaFree(p), "cudaFree");
}

static void c_upload(di_backend *be, void *dst, const void *src, size_t bytes) {
    cuda_state *st = cst(be);
    if (!bytes) return;
    if (st->capturing) {
        cuda_note_msg(st, "upload() inside a graph capture");
        return;
    }
    size_t need = align256(bytes);
    if (st->pin && st->pin_used + need <= st->pin_bytes) {
        char *stage = st->pin + st->pin_used;
        memcpy(stage, src, bytes);
        st->pin_used += need;
        cuda_note(st, cudaMemcpyAsync(dst, stage, bytes, cudaMemcpyHostToDevice, st->stream), "upload");
    } else {
        /* pageable source: the copy is staged by the driver before the call returns */
        cuda_note(st, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st->stream), "upload");
    }
}

/* ---------------------------------------------------------------- lanes ---- */

/* The main lane waits for everything issued on the side lane so far. */
static void side_join(cuda_state *st) {
    if (!st->side_dirty) return;
    cuda_note(st, cudaEventRecord(st->ev_join, st->side_stream), "side lane join (record)");
    cuda_note(st, cudaStreamWaitEvent(st->main_stream, st->ev_join, 0), "side lane join (wait)");
    st->side_dirty = 0;
    st->prog_main = 1;
}

#if CUDART_VERSION >= 13000
#define DI_CAPTURE_INFO cudaStreamGetCaptureInfo
#define DI_CAPTURE_UPDATE cudaStreamUpdateCaptureDependencies
#elif CUDART_VERSION >= 12030
#define DI_CAPTURE_INFO cudaStreamGetCaptureInfo_v3 /* the edge-data forms before CUDA 13 */
#define DI_CAPTURE_UPDATE cudaStreamUpdateCaptureDependencies_v2
#endif

/* DEEPINFER_CUDA_LANES_PROG (default 1): in a capture, the first PDL launch on a lane after a
 * fork (side lane) or a join (main lane) turns the edges from its kernel dependencies into
 * programmatic ones, as PDL does within one lane: it may start once they have released it, and
 * its pdl_wait() waits for all of them (cuda_pdl.cuh). Called by cuda_launch_cluster. */
void cuda_capture_prog_edges(cuda_state *st) {
    int *flag = st->stream == st->side_stream ? &st->prog_side : &st->prog_main;
    if (!*flag) return;
    *flag = 0;
#ifdef DI_CAPTURE_INFO
    cudaStreamCaptureStatus cs;
    const cudaGraphNode_t *deps = NULL;
    const cudaGraphEdgeData *ed = NULL;
    size_t n = 0;
    if (DI_CAPTURE_INFO(st->stream, &cs, NULL, NULL, &deps, &ed, &n) != cudaSuccess) {
        cudaGetLastError();
        return;
    }
    if (cs != cudaStreamCaptureStatusActive || n == 0 || n > 8) return;
    cudaGraphNode_t nd[8];
    cudaGraphEdgeData e[8];
    int changed = 0;
    for (size_t i = 0; i < n; i++) {
        nd[i] = deps[i];
        memset(&e[i], 0, sizeof e[i]);
        if (ed) e[i] = ed[i];
        cudaGraphNodeType t;
        if (cudaGraphNodeGetType(nd[i], &t) != cudaSuccess) {
            cudaGetLastError();
            return;
        }
        if (t == cudaGraphNodeTypeKernel && e[i].type == cudaGraphDependencyTypeDefault) {
            e[i].type = cudaGraphDependencyTypeProgrammatic;
            e[i].from_port = cudaGraphKernelNodePortProgrammatic;
            changed = 1;
        }
    }
    if (changed)
        cuda_note(st, DI_CAPTURE_UPDATE(st->stream, nd, e, n, cudaStreamSetCaptureDependencies),
                  "programmatic lane edges");
#endif /* else (CUDA < 12.3): no edge data in captures, plain edges stay */
}

/* Back to the main lane (no wait). */
static void side_leave(cuda_state *st) {
    st->on_side = 0;
    st->stream = st->main_stream;
}

/* Back to the main lane, which then waits for the side lane (side_join; before any host-visible
 * sync, copy or graph boundary). */
static void lanes_rejoin(cuda_state *st) {
    side_leave(st);
    side_join(st);
}

static int c_side_begin(di_backend *be, int T) {
    cuda_state *st = cst(be);
    if (!st->lanes || T > st->lanes_max_t || st->on_side || !st->side_stream || !st->lt_ws_side) return 0;
    if (cuda_note(st, cudaEventRecord(st->ev_fork, st->main_stream), "side lane fork (record)") ||
        cuda_note(st, cudaStreamWaitEvent(st->side_stream, st->ev_fork, 0), "side lane fork (wait)"))
        return 0;
    st->on_side = 1;
    st->side_dirty = 1;
    st->stream = st->side_stream;
    st->prog_side = 1;
    return 1;
}

static void c_side_end(di_backend *be) { side_leave(cst(be)); }

static void c_side_resume(di_backend *be) {
    cuda_state *st = cst(be);
    if (st->on_side || !st->side_dirty) {
        cuda_note_msg(st, "side_resume() without a side lane to resume");
        return;
    }
    st->on_side = 1;
    st->stream = st->side_stream;
}

static void c_side_join(di_backend *be) { lanes_rejoin(cst(be)); }

static di_status c_sync(di_backend *be) {
    cuda_state *st = cst(be);
    if (st->capturing) return di_error(DI_ERR_INTERNAL, "cuda backend: sync() inside a graph capture");
    lanes_rejoin(st);
    cuda_note(st, cudaStreamSynchronize(st->stream), "stream synchronize");
    st->pin_used = 0;
    return take_error(st);
}

static di_status c_download(di_backend *be, void *dst, const void *src, size_t bytes) {
    cuda_state *st = cst(be);
    if (st->capturing) return di_error(DI_ERR_INTERNAL, "cuda backend: download() inside a graph capture");
    lanes_rejoin(st);
    if (bytes) cuda_note(st, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, st->stream), "download");
    return c_sync(be);
}

/* ---------------------------------------------------------------- asynchronous copies ---- */

static di_status c_host_alloc(di_backend *be, size_t bytes, void **out) {
    (void)be;
    *out = NULL;
    cudaError_t e = cudaMallocHost(out, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        cudaGetLastError();
        *out = NULL;
        return di_error(DI_ERR_NOMEM, "cuda backend: cudaMallocHost(%zu bytes): %s", bytes, cudaGetErrorString(e));
    }
    return DI_OK;
}

static void c_host_free(di_backend *be, void *ptr) {
    (void)be;
    if (ptr) cudaFreeHost(ptr);
}

/* host -> device on the in lane, not ordered after queued work; the main lane waits for it */
static void c_copy_in(di_backend *be, void *dst, const void *src, size_t bytes) {
    cuda_state *st = cst(be);
    if (st->capturing) {
        cuda_note_msg(st, "copy_in() inside a graph capture");
        return;
    }
    if (!bytes) return;
    lanes_rejoin(st);
    cuda_note(st, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st->in_stream), "copy_in");
    cuda_note(st, cudaEventRecord(st->ev_in, st->in_stream), "copy_in (record)");
    cuda_note(st, cudaStreamWaitEvent(st->main_stream, st->ev_in, 0), "copy_in (wait)");
}

/* device -> host on the out lane after everything issued on the main lane; fence f after it.
 * Inside a capture the out lane joins the capture: the copy and the fence become graph nodes
 * (an external event-record node, so each replay marks the fence), and graph_end joins the
 * out lane back before the capture ends (out_dirty). */
static void c_copy_out(di_backend *be, void *dst, const void *src, size_t bytes, int f) {
    cuda_state *st = cst(be);
    if (f < 0 || f >= DI_BACKEND_FENCES) {
        cuda_note_msg(st, "copy_out(): fence out of range");
        return;
    }
    lanes_rejoin(st);
    cuda_note(st, cudaEventRecord(st->ev_out, st->main_stream), "copy_out (record)");
    cuda_note(st, cudaStreamWaitEvent(st->out_stream, st->ev_out, 0), "copy_out (wait)");
    if (bytes) cuda_note(st, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, st->out_stream), "copy_out");
    if (st->capturing) {
        cuda_note(st, cudaEventRecordWithFlags(st->fence[f], st->out_stream, cudaEventRecordExternal),
                  "copy_out (captured fence)");
        st->out_dirty = 1;
    } else {
        cuda_note(st, cudaEventRecord(st->fence[f], st->out_stream), "copy_out (fence)");
    }
}

static di_status c_fence_wait(di_backend *be, int f) {
    cuda_state *st = cst(be);
    if (st->capturing) return di_error(DI_ERR_INTERNAL, "cuda backend: fence_wait() inside a graph capture");
    if (f < 0 || f >= DI_BACKEND_FENCES) return di_error(DI_ERR_INVALID_ARG, "cuda backend: fence %d out of range", f);
    cuda_note(st, cudaEventSynchronize(st->fence[f]), "fence wait");
    /* a kernel fault surfaces on the stream; a completed fence implies the ops before it ran */
    cuda_note(st, cudaGetLastError(), "fence wait");
    return take_error(st);
}

static void c_memset(di_backend *be, void *dst, int byte, size_t bytes) {
    cuda_state *st = cst(be);
    if (bytes) cuda_note(st, cudaMemsetAsync(dst, byte, bytes, st->stream), "memset");
}

/* ---------------------------------------------------------------- weights ---- */

/* 1 if the stacked parts can stay fp8 with one block-scale grid per matrix. */
static int keep_fp8(int n, int n_parts, const di_host_matrix *parts, di_weight_layout layout) {
    if (layout != DI_WEIGHT_PLAIN) return 0;
    const di_host_matrix *f = &parts[0];
    if (f->block_cols % 8 != 0) return 0;
    for (int i = 0; i < n * n_parts; i++) {
        const di_host_matrix *p = &parts[i];
        if (p->dtype != DI_DTYPE_F8_E4M3 || p->block_rows != f->block_rows || p->block_cols != f->block_cols)
            return 0;
        if (p->row0 % p->block_rows != 0) return 0;
        if (i % n_parts != n_parts - 1 && p->rows % p->block_rows != 0) return 0;
    }
    return 1;
}

static di_status upload_dev(cuda_state *st, void *dst, const void *src, size_t bytes, const char *name) {
    cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) return di_error(DI_ERR_BACKEND, "cuda backend: uploading '%s': %s", name, cudaGetErrorString(e));
    (void)st;
    return DI_OK;
}

/* fp8 activation-quantization buffers for max_tokens rows of the widest fp8 weight (load time) */
static di_status alloc_act_quant(di_backend *be) {
    cuda_state *st = cst(be);
    c_free(be, st->aq);
    c_free(be, st->aq_scale);
    st->aq = NULL;
    st->aq_scale = NULL;
    if (st->max_fp8_cols <= 0 || st->max_tokens <= 0) return DI_OK;
    size_t t4 = ((size_t)st->max_tokens + 3) & ~(size_t)3;
    DI_TRY(c_alloc(be, t4 * st->max_fp8_cols, (void **)&st->aq));
    return c_alloc(be, t4 * ceil_div_i(st->max_fp8_cols, 128) * sizeof(float), (void **)&st->aq_scale);
}

static di_status upload_fp8(di_backend *be, int n, int n_parts, const di_host_matrix *parts, int rows, int cols,
                            di_weight *out) {
    cuda_state *st = cst(be);
    int br = parts[0].block_rows, bc = parts[0].block_cols, nbr = ceil_div_i(rows, br), sld = scale_ld(cols, bc);
    size_t per = (size_t)rows * cols, sper = (size_t)nbr * sld;
    size_t dbytes = align256(per * (size_t)n), sbytes = sper * (size_t)n * sizeof(float);
    char *dev = NULL;
    DI_TRY(c_alloc(be, dbytes + sbytes, (void **)&dev));
    float *hs = (float *)calloc(sper * (size_t)n, sizeof(float));
    if (!hs) {
        c_free(be, dev);
        return di_error(DI_ERR_NOMEM, "tensor '%s': out of host memory for scales", parts[0].name);
    }
    di_status s = DI_OK;
    size_t scols = (size_t)ceil_div_i(cols, bc);
    for (int i = 0; i < n && s == DI_OK; i++) {
        int row_off = 0;
        for (int p = 0; p < n_parts && s == DI_OK; p++) {
            const di_host_matrix *hm = &parts[(size_t)i * n_parts + p];
            const uint8_t *src = (const uint8_t *)hm->data + (size_t)hm->row0 * cols;
            s = upload_dev(st, dev + (size_t)i * per + (size_t)row_off * cols, src, (size_t)hm->rows * cols, hm->name);
            for (int b = 0; b < ceil_div_i(hm->rows, br); b++)
                for (size_t c = 0; c < scols; c++)
                    hs[(size_t)i * sper + (size_t)(row_off / br + b) * sld + c] =
                        hm->scale[(size_t)(hm->row0 / br + b) * scols + c];
            row_off += hm->rows;
        }
    }
    if (s == DI_OK) s = upload_dev(st, dev + dbytes, hs, sbytes, parts[0].name);
    free(hs);
    if (s != DI_OK) {
        c_free(be, dev);
        return s;
    }
    out->n = n;
    out->rows = rows;
    out->cols = cols;
    out->dtype = DI_DTYPE_F8_E4M3;
    out->data = dev;
    out->scale = dev + dbytes;
    out->block_rows = br;
    out->block_cols = bc;
    out->bytes = dbytes + sbytes;
    if (cols > st->max_fp8_cols) {
        st->max_fp8_cols = cols;
        if (st->max_tokens > 0) return alloc_act_quant(be); /* reserved already: grow the buffers */
    }
    return DI_OK;
}

/* bf16 matrices (f32 for vectors and on the f32 op table, st->f32), converted on the host one
 * matrix at a time (FP8 dequantized with its block scales), transposed if asked. */
static di_status upload_converted(di_backend *be, int n, int n_parts, const di_host_matrix *parts, int rows,
                                  int cols, di_weight_layout layout, di_weight *out) {
    cuda_state *st = cst(be);
    int f32 = st->f32 || (n == 1 && rows == 1), tr = layout == DI_WEIGHT_TRANSPOSED;
    size_t per = (size_t)rows * cols, es = f32 ? 4 : 2;
    char *dev = NULL;
    DI_TRY(c_alloc(be, per * (size_t)n * es, (void **)&dev));
    /* f: the fp32 matrix; h: what is uploaded when it is not f itself (bf16, or f transposed) */
    float *f = (float *)malloc(per * sizeof(float));
    void *h = !f32 || tr ? malloc(per * es) : NULL;
    if (!f || (!h && (!f32 || tr))) {
        free(f);
        free(h);
        c_free(be, dev);
        return di_error(DI_ERR_NOMEM, "tensor '%s': out of host memory converting", parts[0].name);
    }
    di_status s = DI_OK;
    for (int i = 0; i < n && s == DI_OK; i++) {
        int all_bf16 = !f32 && !tr;
        for (int p = 0; p < n_parts; p++) all_bf16 &= parts[(size_t)i * n_parts + p].dtype == DI_DTYPE_BF16;
        char *dst = dev + (size_t)i * per * es;
        if (all_bf16) { /* straight copy of the checkpoint's rows */
            size_t off = 0;
            for (int p = 0; p < n_parts && s == DI_OK; p++) {
                const di_host_matrix *hm = &parts[(size_t)i * n_parts + p];
                s = upload_dev(st, dst + off * 2, (const uint16_t *)hm->data + (size_t)hm->row0 * cols,
                               (size_t)hm->rows * cols * 2, hm->name);
                off += (size_t)hm->rows * cols;
            }
            continue;
        }
        di_host_matrices_to_f32(f, &parts[(size_t)i * n_parts], n_parts);
        if (h)
            for (int r = 0; r < rows; r++)
                for (int c = 0; c < cols; c++) {
                    size_t from = (size_t)r * cols + c, to = tr ? (size_t)c * rows + r : from;
                    if (f32) ((float *)h)[to] = f[from];
                    else ((uint16_t *)h)[to] = di_f32_to_bf16(f[from]);
                }
        s = upload_dev(st, dst, h ? h : f, per * es, parts[0].name);
    }
    free(f);
    free(h);
    if (s != DI_OK) {
        c_free(be, dev);
        return s;
    }
    out->n = n;
    out->rows = tr ? cols : rows;
    out->cols = tr ? rows : cols;
    out->dtype = f32 ? DI_DTYPE_F32 : DI_DTYPE_BF16;
    out->data = dev;
    out->bytes = per * (size_t)n * es;
    if (out->cols > st->max_cols) st->max_cols = out->cols;
    return DI_OK;
}

static di_status c_weight_upload(di_backend *be, int n, int n_parts, const di_host_matrix *parts,
                                 di_weight_layout layout, di_weight *out) {
    memset(out, 0, sizeof *out);
    int rows, cols;
    DI_TRY(di_weight_parts_check(n, n_parts, parts, &rows, &cols));
    if (!cst(be)->f32 && !(n == 1 && rows == 1) && keep_fp8(n, n_parts, parts, layout))
        return upload_fp8(be, n, n_parts, parts, rows, cols, out);
    return upload_converted(be, n, n_parts, parts, rows, cols, layout, out);
}

static void c_weight_free(di_backend *be, di_weight *w) {
    if (!w) return;
    c_free(be, w->data);  /* scales live in the same allocation */
    memset(w, 0, sizeof *w);
}

/* ---------------------------------------------------------------- workspace ---- */

static di_status c_reserve(di_backend *be, const di_backend_reserve *r) {
    cuda_state *st = cst(be);
    if (r->max_tokens <= 0 || r->max_seqs <= 0)
        return di_error(DI_ERR_INVALID_ARG, "cuda backend: reserve: max_tokens %d / max_seqs %d", r->max_tokens,
                        r->max_seqs);
    st->max_tokens = r->max_tokens;
    st->max_seqs = r->max_seqs;
    st->vocab = r->vocab_size;
    st->mla = r->mla;
    if (!st->lt_ws) {
        st->lt_ws_bytes = (size_t)64 << 20;
        DI_TRY(c_alloc(be, st->lt_ws_bytes, &st->lt_ws));
    }
    if (st->lanes && !st->lt_ws_side) DI_TRY(c_alloc(be, st->lt_ws_bytes, &st->lt_ws_side));
    if (!st->moe_zero_dev) {
        DI_TRY(c_alloc(be, sizeof(moe_zero), (void **)&st->moe_zero_dev));
        cudaError_t e = cudaMemset(st->moe_zero_dev, 0, sizeof(moe_zero));
        if (e != cudaSuccess) return cuda_fail(e, "cudaMemset");
    }
    c_free(be, st->dec_part);
    st->dec_part = NULL;
    DI_TRY(alloc_act_quant(be));
    st->dec_part_bytes = cuda_mla_decode_part_bytes(st, &r->mla, r->max_tokens);
    if (st->dec_part_bytes) DI_TRY(c_alloc(be, st->dec_part_bytes, (void **)&st->dec_part));
    if (!st->pin) {
        st->pin_bytes = (size_t)16 << 20;
        cudaError_t e = cudaMallocHost((void **)&st->pin, st->pin_bytes);
        if (e != cudaSuccess) {
            cudaGetLastError();
            st->pin = NULL;
            st->pin_bytes = 0; /* uploads fall back to pageable copies */
        }
    }
    return DI_OK;
}

/* ---------------------------------------------------------------- graphs ---- */

static di_status c_graph_begin(di_backend *be) {
    cuda_state *st = cst(be);
    if (st->capturing) return di_error(DI_ERR_INTERNAL, "cuda backend: nested graph capture");
    lanes_rejoin(st);
    st->prog_side = st->prog_main = 0;
    st->out_dirty = 0;
    DI_TRY(take_error(st));
    cudaError_t e = cudaStreamBeginCapture(st->stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) return cuda_fail(e, "cudaStreamBeginCapture");
    st->capturing = 1;
    return DI_OK;
}

static di_status c_graph_end(di_backend *be, void **graph) {
    cuda_state *st = cst(be);
    *graph = NULL;
    if (!st->capturing) return di_error(DI_ERR_INTERNAL, "cuda backend: graph_end without graph_begin");
    lanes_rejoin(st); /* an unjoined side or out lane would fail the capture */
    if (st->out_dirty) {
        cuda_note(st, cudaEventRecord(st->ev_out, st->out_stream), "copy_out (join record)");
        cuda_note(st, cudaStreamWaitEvent(st->main_stream, st->ev_out, 0), "copy_out (join wait)");
        st->out_dirty = 0;
    }
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(st->stream, &g);
    st->capturing = 0;
    di_status s = take_error(st);
    if (s == DI_OK && e != cudaSuccess) s = cuda_fail(e, "cudaStreamEndCapture");
    if (s == DI_OK && st->graph_fill) cuda_graph_fill_memsets(st, g);
    cudaGraphExec_t x = NULL;
    if (s == DI_OK) {
        /* with lane priorities, the graph keeps each kernel's stream priority (node priority) */
        e = cudaGraphInstantiate(&x, g, st->lane_priority ? cudaGraphInstantiateFlagUseNodePriority : 0);
        if (e != cudaSuccess) s = cuda_fail(e, "cudaGraphInstantiate");
    }
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();
    if (s == DI_OK) *graph = (void *)x;
    return s;
}

static di_status c_graph_launch(di_backend *be, void *graph) {
    cuda_state *st = cst(be);
    lanes_rejoin(st);
    cudaError_t e = cudaGraphLaunch((cudaGraphExec_t)graph, st->stream);
    if (e != cudaSuccess) return cuda_fail(e, "cudaGraphLaunch");
    return DI_OK;
}

static void c_graph_free(di_backend *be, void *graph) {
    (void)be;
    if (graph) cudaGraphExecDestroy((cudaGraphExec_t)graph);
}

/* ---------------------------------------------------------------- lifecycle ---- */

static void c_destroy(di_backend *be) {
    cuda_state *st = cst(be);
    if (st) {
        if (st->main_stream) cudaStreamSynchronize(st->main_stream);
        if (st->side_stream) cudaStreamSynchronize(st->side_stream);
        if (st->lt_ws_side) cudaFree(st->lt_ws_side);
        if (st->moe_zero_dev) cudaFree(st->moe_zero_dev);
        if (st->ev_fork) cudaEventDestroy(st->ev_fork);
        if (st->ev_join) cudaEventDestroy(st->ev_join);
        if (st->side_stream) cudaStreamDestroy(st->side_stream);
        if (st->in_stream) cudaStreamSynchronize(st->in_stream);
        if (st->out_stream) cudaStreamSynchronize(st->out_stream);
        for (int f = 0; f < DI_BACKEND_FENCES; f++)
            if (st->fence[f]) cudaEventDestroy(st->fence[f]);
        if (st->ev_in) cudaEventDestroy(st->ev_in);
        if (st->ev_out) cudaEventDestroy(st->ev_out);
        if (st->in_stream) cudaStreamDestroy(st->in_stream);
        if (st->out_stream) cudaStreamDestroy(st->out_stream);
        lt_free_plans(st);
        if (st->lt) cublasLtDestroy(st->lt);
        if (st->lt_ws) cudaFree(st->lt_ws);
        if (st->aq) cudaFree(st->aq);
        if (st->aq_scale) cudaFree(st->aq_scale);
        if (st->dec_part) cudaFree(st->dec_part);
        if (st->pin) cudaFreeHost(st->pin);
        if (st->main_stream) cudaStreamDestroy(st->main_stream);
        free(st);
    }
    free(be);
}

extern "C" di_status di_backend_cuda_create(int device_index, int precision, di_backend **out) {
    *out = NULL;
    int n_dev = 0;
    cudaError_t e = cudaGetDeviceCount(&n_dev);
    if (e != cudaSuccess || n_dev == 0) {
        cudaGetLastError();
        return di_error(DI_ERR_UNSUPPORTED, "device 'cuda': no usable CUDA device (%s)",
                        e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    }
    if (device_index < 0 || device_index >= n_dev)
        return di_error(DI_ERR_INVALID_ARG, "device 'cuda': device index %d outside [0, %d)", device_index, n_dev);
    cudaDeviceProp prop;
    if ((e = cudaGetDeviceProperties(&prop, device_index)) != cudaSuccess) return cuda_fail(e, "cudaGetDeviceProperties");
    if (prop.major < 9)
        return di_error(DI_ERR_UNSUPPORTED, "device 'cuda': %s has compute capability %d.%d; this build targets sm_90a (Hopper)",
                        prop.name, prop.major, prop.minor);
    if ((e = cudaSetDevice(device_index)) != cudaSuccess) return cuda_fail(e, "cudaSetDevice");
    di_backend *be = (di_backend *)calloc(1, sizeof *be);
    cuda_state *st = (cuda_state *)calloc(1, sizeof *st);
    if (!be || !st) {
        free(be);
        free(st);
        return di_error(DI_ERR_NOMEM, "cuda backend: out of memory");
    }
    be->impl = st;
    st->device = device_index;
    st->n_sm = prop.multiProcessorCount;
    st->fp8_act_quant = env_set("DEEPINFER_FP8_ACT_QUANT");
    const char *lm = getenv("DEEPINFER_CUDA_LT_MIN_ROWS");
    st->gemv = env_on("DEEPINFER_CUDA_GEMV");
    const char *ml = getenv("DEEPINFER_CUDA_MOE_LT");
    st->moe_lt = ml && ml[0] >= '0' && ml[0] <= '4' && !ml[1] ? ml[0] - '0' : 2;
    st->moe_direct = env_on("DEEPINFER_CUDA_MOE_DIRECT");
    st->moe_defer = env_on("DEEPINFER_CUDA_MOE_DEFER");
    st->mla_uv_multi = env_on("DEEPINFER_CUDA_MLA_UV_MULTI");
    st->moe_fold = env_on("DEEPINFER_CUDA_MOE_FOLD");
    st->moe_pdl = env_on("DEEPINFER_CUDA_MOE_PDL");
    const char *lp = getenv("DEEPINFER_CUDA_LT_PTR_ALGO");
    st->lt_ptr_algo = lp && atoi(lp) > 0 && atoi(lp) < 8 ? atoi(lp) : 0;
    st->lt_log = env_set("DEEPINFER_CUDA_LT_LOG");
    const char *la = getenv("DEEPINFER_CUDA_LT_ALGO");
    st->lt_algo = la && atoi(la) > 0 && atoi(la) < 8 ? atoi(la) : 0;
    const char *tm = getenv("DEEPINFER_CUDA_LT_PTR_TILE_M");
    st->lt_ptr_tile_m = tm && tm[0] >= '0' && tm[0] <= '9' ? atoi(tm) : default_ptr_tile_m(device_index);
    st->graph_fill = env_on("DEEPINFER_CUDA_GRAPH_FILL");
    st->router_smem = env_on("DEEPINFER_CUDA_ROUTER_SMEM");
    st->wgmma = env_on("DEEPINFER_CUDA_WGMMA");
    const char *wm = getenv("DEEPINFER_CUDA_WGMMA_MIN_ROWS");
    st->wgmma_min_rows = wm && wm[0] >= '1' && wm[0] <= '9' ? atoi(wm) : 16;
    const char *w64 = getenv("DEEPINFER_CUDA_WGMMA_BM64_MAX");
    st->wgmma_bm64_max = w64 && w64[0] >= '0' && w64[0] <= '9' ? atoi(w64) : 32;
    const char *mw = getenv("DEEPINFER_CUDA_MLA_WGMMA");
    st->mla_wgmma = !(mw && !strcmp(mw, "0"));
    const char *ms = getenv("DEEPINFER_CUDA_MOE_SMALL"), *pd = getenv("DEEPINFER_CUDA_PDL");
    st->moe_small = ms && ms[0] >= '0' && ms[0] <= '4' && !ms[1] ? ms[0] - '0' : 1;
    st->down_early = env_on("DEEPINFER_CUDA_DOWN_EARLY");
    st->combine_pdl = env_on("DEEPINFER_CUDA_COMBINE_PDL");
    st->norm_pdl = env_on("DEEPINFER_CUDA_NORM_PDL");
    st->rope_pdl = env_on("DEEPINFER_CUDA_ROPE_PDL");
    st->rope_late = env_on("DEEPINFER_CUDA_ROPE_LATE");
    st->lanes_prog = env_on("DEEPINFER_CUDA_LANES_PROG");
    st->silu_pdl = env_on("DEEPINFER_CUDA_SILU_PDL");
    st->sample_pdl = env_on("DEEPINFER_CUDA_SAMPLE_PDL");
    st->route_pdl = env_on("DEEPINFER_CUDA_ROUTE_PDL");
    const char *rr = getenv("DEEPINFER_CUDA_ROUTE_REDUX");
    st->route_redux = rr && rr[0] >= '0' && rr[0] <= '9' ? atoi(rr) : 256;
    st->router_mid = env_on("DEEPINFER_CUDA_ROUTER_MID");
    const char *rt = getenv("DEEPINFER_CUDA_ROUTER_TT");
    st->router_tt = rt && (!strcmp(rt, "1") || !strcmp(rt, "2") || !strcmp(rt, "4") || !strcmp(rt, "8")) ? atoi(rt) : 1;
    st->mla_early = env_on("DEEPINFER_CUDA_MLA_EARLY");
    st->pdl = pd && pd[0] >= '0' && pd[0] <= '2' && !pd[1] ? pd[0] - '0' : 1;
    const char *sc = getenv("DEEPINFER_CUDA_SAMPLE_CLUSTER");
    st->sample_cluster = sc && (!strcmp(sc, "0") || !strcmp(sc, "4") || !strcmp(sc, "8")) ? atoi(sc) : 1;
    st->sample_greedy = env_on("DEEPINFER_CUDA_SAMPLE_GREEDY");
    st->mla_uv = env_on("DEEPINFER_CUDA_MLA_UV");
    st->mla_wide = env_on("DEEPINFER_CUDA_MLA_WIDE");
    /* GEMMs of 2 rows on the GEMV at every width: batch 2 +2.7% (H100, 2026-12-06); at 3-4 rows
     * cuBLASLt stays ahead (-3.2% at batches 3 and 4 with 4) */
    const char *gr = getenv("DEEPINFER_CUDA_GEMV_ROWS");
    st->gemv_rows = gr ? atoi(gr) : 2;
    if (st->gemv_rows > 4) st->gemv_rows = 4; /* the GEMV's token tiles: 1, 2, 4 */
    st->mla_split_floor = env_on("DEEPINFER_CUDA_MLA_SPLIT_FLOOR");
    st->gu_silu = env_on("DEEPINFER_CUDA_GU_SILU");
    const char *gw = getenv("DEEPINFER_CUDA_GEMV_WANT"), *gk = getenv("DEEPINFER_CUDA_GEMV_MIN_K");
    st->gemv_want = gw && atoi(gw) > 0 ? atoi(gw) : 16;
    st->gemv_min_k = gk && atoi(gk) >= 256 ? atoi(gk) : 512;
    const char *sg = getenv("DEEPINFER_CUDA_SIDE_GEMV_WANT");
    st->side_gemv_want = sg && atoi(sg) > 0 ? atoi(sg) : 8;
    const char *ss = getenv("DEEPINFER_CUDA_SIDE_SMS");
    st->side_sms = ss && ss[0] >= '0' && ss[0] <= '9' ? atoi(ss) : st->n_sm * 3 / 4;
    if (st->side_sms > st->n_sm) st->side_sms = st->n_sm;
    const char *sm = getenv("DEEPINFER_CUDA_SPARSE_MIN_TILES");
    st->sp_min_tiles = sm && atoi(sm) > 0 ? atoi(sm) : 2;
    st->lt_min_rows = lm ? atoi(lm) : 2;
    if (st->lt_min_rows < 1) st->lt_min_rows = 1;
    /* the main lane at the highest stream priority and the side lane at the lowest, so that
     * the critical path's blocks are scheduled first when both lanes have blocks waiting
     * (DEEPINFER_CUDA_LANE_PRIORITY=0: both at the default priority) */
    int p_least = 0, p_greatest = 0;
    st->lane_priority = env_on("DEEPINFER_CUDA_LANE_PRIORITY") &&
                        cudaDeviceGetStreamPriorityRange(&p_least, &p_greatest) == cudaSuccess;
    if (!st->lane_priority) p_least = p_greatest = 0;
    if ((e = cudaStreamCreateWithPriority(&st->main_stream, cudaStreamNonBlocking, p_greatest)) != cudaSuccess) {
        c_destroy(be);
        return cuda_fail(e, "cudaStreamCreate");
    }
    st->stream = st->main_stream;
    /* the side lane: DEEPINFER_CUDA_LANES=0 off, N > 1 used for steps of at most N tokens
     * (default: DEFAULT_LANES_MAX_T) */
    const char *ln = getenv("DEEPINFER_CUDA_LANES");
    st->lanes = env_on("DEEPINFER_CUDA_LANES");
    st->lanes_max_t = ln && atoi(ln) > 1 ? atoi(ln) : DEFAULT_LANES_MAX_T;
    if (st->lanes &&
        ((e = cudaStreamCreateWithPriority(&st->side_stream, cudaStreamNonBlocking, p_least)) != cudaSuccess ||
         (e = cudaEventCreateWithFlags(&st->ev_fork, cudaEventDisableTiming)) != cudaSuccess ||
         (e = cudaEventCreateWithFlags(&st->ev_join, cudaEventDisableTiming)) != cudaSuccess)) {
        c_destroy(be);
        return cuda_fail(e, "creating the side lane");
    }
    /* the copy lanes of asynchronous steps */
    if ((e = cudaStreamCreateWithFlags(&st->in_stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&st->out_stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&st->ev_in, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&st->ev_out, cudaEventDisableTiming)) != cudaSuccess) {
        c_destroy(be);
        return cuda_fail(e, "creating the copy lanes");
    }
    for (int f = 0; f < DI_BACKEND_FENCES; f++)
        if ((e = cudaEventCreateWithFlags(&st->fence[f], cudaEventDisableTiming)) != cudaSuccess) {
            c_destroy(be);
            return cuda_fail(e, "creating the copy fences");
        }
    if (cublasLtCreate(&st->lt) != CUBLAS_STATUS_SUCCESS) {
        st->lt = NULL;
        c_destroy(be);
        return di_error(DI_ERR_BACKEND, "cuda backend: cublasLtCreate failed");
    }
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    be->name = "cuda";
    be->device = DI_DEVICE_CUDA;
    be->caps.act_dtype = DI_DTYPE_BF16;
    be->caps.keeps_fp8 = 1;
    be->caps.memory_bytes = fr;
    be->caps.n_threads = 1;
    be->destroy = c_destroy;
    be->alloc = c_alloc;
    be->free = c_free;
    be->upload = c_upload;
    be->download = c_download;
    be->memset = c_memset;
    be->sync = c_sync;
    if (env_on("DEEPINFER_CUDA_ASYNC_COPIES")) {
        be->host_alloc = c_host_alloc;
        be->host_free = c_host_free;
        be->copy_in = c_copy_in;
        be->copy_out = c_copy_out;
        be->fence_wait = c_fence_wait;
    }
    be->weight_upload = c_weight_upload;
    be->weight_free = c_weight_free;
    be->embed = cuda_embed;
    be->rmsnorm = cuda_rmsnorm;
    be->add_rmsnorm = cuda_add_rmsnorm;
    be->silu_mul = cuda_silu_mul;
    be->matmul_silu = cuda_matmul_silu;
    be->add = cuda_add;
    be->gather_rows = cuda_gather_rows;
    be->matmul = cuda_matmul;
    be->bmm = cuda_bmm;
    be->rope = cuda_rope;
    be->kv_write = cuda_kv_write;
    be->rope_kv_write = env_on("DEEPINFER_CUDA_ROPE_KV") ? cuda_rope_kv_write : NULL; /* 0: four launches */
    be->kv_copy_blocks = cuda_kv_copy_blocks;
    be->mla_prefill = cuda_mla_prefill;
    be->mla_prefill_scratch_bytes = cuda_mla_prefill_scratch_bytes;
    be->mla_decode = cuda_mla_decode;
    be->mla_decode_uv = cuda_mla_decode_uv;
    be->layernorm = cuda_layernorm;
    be->indexer_topk = cuda_indexer_topk;
    be->indexer_scratch_bytes = cuda_indexer_scratch_bytes;
    be->moe_route = cuda_moe_route;
    be->moe_experts = cuda_moe_experts;
    be->moe_scratch_bytes = cuda_moe_scratch_bytes;
    be->moe_experts_shared = cuda_moe_experts_shared;
    be->moe_experts_defer = cuda_moe_experts_defer;
    be->add_rmsnorm_experts = cuda_add_rmsnorm_experts;
    be->check_dims = cuda_check_dims;
    be->reserve = c_reserve;
    be->sample = cuda_sample;
    be->side_begin = c_side_begin;
    be->side_end = c_side_end;
    be->side_join = c_side_join;
    /* side_resume: the model issues the queries before the latent GEMV (docs/cuda.md; measured
     * batch 1 +0.3%, batch 16 equal); DEEPINFER_CUDA_Q_FIRST=0: the latent GEMV first */
    if (env_on("DEEPINFER_CUDA_Q_FIRST")) be->side_resume = c_side_resume;
    be->graph_begin = c_graph_begin;
    be->graph_end = c_graph_end;
    be->graph_launch = c_graph_launch;
    be->graph_free = c_graph_free;
    if (precision == DI_PRECISION_F32) cuda_f32_install(be);
    *out = be;
    return DI_OK;
}
