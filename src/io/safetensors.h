/* safetensors.h - reading (mmap) and writing safetensors checkpoints.
 *
 * Owner: io. A di_weights is the set of tensors of a model directory: either a single
 * model.safetensors or the shards listed in model.safetensors.index.json. Files are mmapped
 * read-only; tensor data pointers point into the maps and stay valid until di_weights_free.
 * Loading validates everything a broken or malicious file could get wrong (header length vs
 * file size, header JSON, dtype names, shape products vs byte ranges, offsets out of range or
 * overlapping, duplicate names, index entries pointing at missing files/tensors) and returns an
 * error naming the file and tensor. */
#ifndef DI_IO_SAFETENSORS_H
#define DI_IO_SAFETENSORS_H
#include <stddef.h>
#include <stdint.h>
#include "core/dtype.h"
#include "deepinfer.h"

#define DI_MAX_DIMS 8

typedef struct di_tensor_info {
    const char *name;
    di_dtype dtype;
    int ndim;
    int64_t shape[DI_MAX_DIMS];
    const void *data;      /* into the mmapped file; NULL only when nbytes == 0 */
    size_t nbytes;
    const char *file;      /* path of the shard that holds it (for messages) */
} di_tensor_info;

typedef struct di_weights di_weights;

/* Opens model_dir/model.safetensors.index.json (sharded) or model_dir/model.safetensors,
 * or a single .safetensors file if `path` names one. */
di_status di_weights_open(const char *path, di_weights **out);
void di_weights_free(di_weights *w);
size_t di_weights_count(const di_weights *w);
const di_tensor_info *di_weights_at(const di_weights *w, size_t i);
/* NULL if absent. */
const di_tensor_info *di_weights_find(const di_weights *w, const char *name);

/* ---- writing (mkmodel, tests) ---- */
typedef struct di_st_writer di_st_writer;
di_st_writer *di_st_writer_create(void);
void di_st_writer_free(di_st_writer *wr);
/* Adds a tensor; the data is copied. Tensors are written in insertion order. */
di_status di_st_writer_add(di_st_writer *wr, const char *name, di_dtype dtype, int ndim,
                           const int64_t *shape, const void *data, size_t nbytes);
/* Writes all added tensors to one file (with optional __metadata__ {"format":"pt"}). */
di_status di_st_writer_write(di_st_writer *wr, const char *path);
/* Writes shards of at most max_shard_bytes each as model-0000K-of-0000N.safetensors plus
 * model.safetensors.index.json in dir. */
di_status di_st_writer_write_sharded(di_st_writer *wr, const char *dir, size_t max_shard_bytes);
#endif
