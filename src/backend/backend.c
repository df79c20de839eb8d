/* backend.c - backend construction by device kind, and helpers shared by all backends.
 *
 * Owner: model. The CPU backend is always built; the CUDA backend only when the build found
 * nvcc (DI_HAVE_CUDA), otherwise asking for it is a clear DI_ERR_UNSUPPORTED. */
#include "backend/backend.h"

#include <string.h>

#include "core/status.h"

di_status di_backend_create(const di_backend_options *opts, di_backend **out) {
    *out = NULL;
    di_backend_options def = {DI_DEVICE_CPU, 0, 0, 0};
    if (!opts) opts = &def;
    if (opts->precision < DI_PRECISION_DEFAULT || opts->precision > DI_PRECISION_F32)
        return di_error(DI_ERR_INVALID_ARG, "precision %d: expected 0 (default), 1 (bf16) or 2 (f32)", opts->precision);
    switch (opts->device) {
    case DI_DEVICE_CPU:
        if (opts->precision == DI_PRECISION_BF16)
            return di_error(DI_ERR_UNSUPPORTED, "dtype bf16: the CPU backend computes in f32 only (bf16 "
                            "activations need --device cuda)");
        return di_backend_cpu_create(opts->n_threads, out);
    case DI_DEVICE_CUDA:
#ifdef DI_HAVE_CUDA
        return di_backend_cuda_create(opts->device_index, opts->precision, out);
#else
        return di_error(DI_ERR_UNSUPPORTED,
                        "device 'cuda': this build of deepinfer has no CUDA backend "
                        "(built without nvcc, or the CUDA backend is not implemented yet); use --device cpu");
#endif
    }
    return di_error(DI_ERR_INVALID_ARG, "unknown device kind %d", (int)opts->device);
}

void di_backend_free(di_backend *be) {
    if (be) be->destroy(be);
}

int di_precision_from_name(const char *name) {
    if (!name) return -1;
    if (!strcmp(name, "auto")) return DI_PRECISION_DEFAULT;
    if (!strcmp(name, "bf16") || !strcmp(name, "bfloat16")) return DI_PRECISION_BF16;
    if (!strcmp(name, "f32") || !strcmp(name, "fp32") || !strcmp(name, "float32")) return DI_PRECISION_F32;
    return -1;
}

size_t di_backend_act_size(const di_backend *be) { return di_dtype_size(be->caps.act_dtype); }
