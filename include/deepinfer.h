/* deepinfer.h - the public C API of deepinfer.
 *
 * deepinfer is an inference engine for DeepSeek-architecture mixture-of-experts models
 * (DeepSeek-V3/R1/V3.1/V3.2, V2/V2-Lite, Kimi-K2, Moonlight). This header is what an
 * application links against: status codes, and (as the engine lands) the engine API
 * di_engine_create / di_engine_add_request / di_engine_step / di_engine_abort /
 * di_generate / di_engine_free.
 *
 * Conventions: every fallible call returns a di_status; on failure di_last_error() gives a
 * message naming what was wrong (per thread). Handles are opaque; *_free(NULL) is a no-op. */
#ifndef DEEPINFER_H
#define DEEPINFER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum di_status {
    DI_OK = 0,
    DI_ERR_INVALID_ARG = 1,  /* a caller passed a bad value (flag, parameter, request field) */
    DI_ERR_IO = 2,           /* a file could not be opened / read / written / mapped */
    DI_ERR_FORMAT = 3,       /* a file or message is malformed (JSON, safetensors, UTF-8, ...) */
    DI_ERR_NOMEM = 4,        /* host or device memory exhausted */
    DI_ERR_UNSUPPORTED = 5,  /* well-formed but not supported (component, dtype, config) */
    DI_ERR_NOT_FOUND = 6,    /* a named thing (tensor, token, file) does not exist */
    DI_ERR_BACKEND = 7,      /* the compute backend failed (CUDA error, ...) */
    DI_ERR_INTERNAL = 8      /* a bug in deepinfer */
} di_status;

/* Message of the last error recorded on this thread (empty if none). */
const char *di_last_error(void);
/* Short name of a status code. */
const char *di_status_name(di_status s);

#ifdef __cplusplus
}
#endif
#endif /* DEEPINFER_H */
