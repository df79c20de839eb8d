/* safetensors.h - reading (mmap) and writing safetensors checkpoints.
 *
 * Owner: io. A di_weights is the set of tensors of a model directory: either a single
 * model.safetensors or the shards listed in model.safetensors.index.json. Files are mmapped
 * read-only; tensor data pointers point into the maps and stay valid until di_weights_free.
 * Loading validates everything a broken or malicious file could get wrong (header length vs
 * file size, header JSON, dtype names, shape products vs byte ranges, offsets out of range,
 * overlapping or leaving holes, duplicate names, __metadata__ not a string map, index entries
 * pointing at missing files/tensors or at files outside the directory) and returns an error
 * naming the file and tensor.
 *
 * Invariant: di_tensor_info.data is aligned to the element size (files written by the Python
 * safetensors library and by our writer always are; a tensor of a file that is not is copied
 * into an aligned buffer owned by the di_weights), so it may be read through typed pointers. */
#ifndef DI_IO_SAFETENSORS_H
#define DI_IO_SAFETENSORS_H
#include <stddef.h>
#include <stdint.h>
#include "core/dtype.h"
#include "deepinfer.h"

#define DI_MAX_DIMS 8
/* Largest accepted JSON header (the reference implementation's limit). */
#define DI_ST_MAX_HEADER (100u << 20)

typedef struct di_tensor_info {
    const char *name;
    di_dtype dtype;
    int ndim;
    int64_t shape[DI_MAX_DIMS];
    const void *data;      /* into the mmapped file; NULL only when nbytes == 0 */
    size_t nbytes;         /* = product(shape) * di_dtype_size(dtype) */
    const char *file;      /* path of the shard that holds it (for messages) */
} di_tensor_info;

typedef struct di_weights di_weights;

/* Opens model_dir/model.safetensors.index.json (sharded) or model_dir/model.safetensors,
 * or a single .safetensors file / an index .json if `path` names one. */
di_status di_weights_open(const char *path, di_weights **out);
void di_weights_free(di_weights *w);
size_t di_weights_count(const di_weights *w);
const di_tensor_info *di_weights_at(const di_weights *w, size_t i);
/* NULL if absent. */
const di_tensor_info *di_weights_find(const di_weights *w, const char *name);
/* Number of elements of a tensor (product of its shape; 1 for a scalar). */
int64_t di_tensor_numel(const di_tensor_info *t);
/* "[129280, 7168]" into buf (for messages); returns buf. */
const char *di_tensor_shape_str(int ndim, const int64_t *shape, char *buf, size_t len);
/* Value of a `__metadata__` key of the first file ("format" -> "pt"), or NULL. */
const char *di_weights_metadata(const di_weights *w, const char *key);

/* ---- writing (mkmodel, tests) ----
 * Tensors are added (with data, copied) or declared (lazy: bytes produced at write time by the
 * fill function, so models larger than memory stream to disk). Within each file, tensors are
 * laid out by decreasing element size, then insertion order, so every tensor is aligned to its
 * element size (the header is padded with spaces to a multiple of 8, as Python safetensors
 * does). Files are written to a temporary name and renamed when complete. */
typedef struct di_st_writer di_st_writer;
/* Produces the nbytes of tensor `index` (insertion order) into dst. */
typedef di_status (*di_st_fill_fn)(void *ctx, size_t index, void *dst, size_t nbytes);

di_st_writer *di_st_writer_create(void);
void di_st_writer_free(di_st_writer *wr);
/* Adds a tensor; the data is copied (nbytes must equal the shape's byte size). */
di_status di_st_writer_add(di_st_writer *wr, const char *name, di_dtype dtype, int ndim,
                           const int64_t *shape, const void *data, size_t nbytes);
/* Declares a tensor whose bytes come from the fill function at write time. */
di_status di_st_writer_add_lazy(di_st_writer *wr, const char *name, di_dtype dtype, int ndim, const int64_t *shape);
void di_st_writer_set_fill(di_st_writer *wr, di_st_fill_fn fn, void *ctx);
size_t di_st_writer_count(const di_st_writer *wr);
/* Total data bytes of all tensors. */
uint64_t di_st_writer_total_bytes(const di_st_writer *wr);
/* Writes all added tensors to one file (with __metadata__ {"format":"pt"}). */
di_status di_st_writer_write(di_st_writer *wr, const char *path);
/* Writes shards of at most max_shard_bytes of tensor data each (a larger tensor gets a shard
 * of its own) as model-0000K-of-0000N.safetensors plus model.safetensors.index.json in dir. */
di_status di_st_writer_write_sharded(di_st_writer *wr, const char *dir, size_t max_shard_bytes);
#endif
