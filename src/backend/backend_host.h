/* backend_host.h - host-side weight preparation shared by the backends (cpu/cpu_backend.c and
 * cuda/cuda_backend.cu, hence the C linkage): validation of the host matrices handed to
 * weight_upload and their conversion to fp32 (FP8 dequantized with its 128x128 block scales).
 *
 * Owner: model. weight_upload receives n matrices, matrix i being the row-wise concatenation of
 * its n_parts parts parts[i * n_parts + p] (see backend.h). Invariant established by
 * di_weight_parts_check: every part has a supported dtype and a valid row range, FP8 parts
 * carry block scales, part p of every matrix has the shape of part p of matrix 0, and all parts
 * share one column count. */
#ifndef DI_BACKEND_BACKEND_HOST_H
#define DI_BACKEND_BACKEND_HOST_H
#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Checks the parts of a weight_upload call (n >= 1 matrices of n_parts >= 1 parts each) and the
 * total size; on success *rows, *cols are the shape of one (concatenated) matrix. Errors name
 * the offending tensor. */
di_status di_weight_parts_check(int n, int n_parts, const di_host_matrix *parts, int *rows, int *cols);

/* Rows [row0, row0 + rows) of one part as fp32 into dst [rows, cols] (FP8: W = Wq *
 * weight_scale_inv of its block). */
void di_host_matrix_to_f32(float *dst, const di_host_matrix *p);

/* One matrix, the row-wise concatenation of parts[0 .. n_parts), as fp32 into dst [rows, cols]. */
void di_host_matrices_to_f32(float *dst, const di_host_matrix *parts, int n_parts);

#ifdef __cplusplus
}
#endif
#endif
