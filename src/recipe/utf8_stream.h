/* utf8_stream.h - lossy streaming UTF-8 sanitiser for model output.
 *
 * Bytes go in, in arbitrary chunks; only complete, valid UTF-8 comes out. A character split
 * across chunks is held (at most 3 bytes) until completed. Invalid input is replaced by U+FFFD
 * one replacement per maximal invalid subpart (the WHATWG / Rust from_utf8_lossy rule, which is
 * what Hugging Face's lossy decode produces), so the output does not depend on chunking. */
#ifndef DI_RECIPE_UTF8_STREAM_H
#define DI_RECIPE_UTF8_STREAM_H
#include <stddef.h>

typedef struct di_utf8_stream {
    unsigned char tail[4];
    size_t n_tail;
} di_utf8_stream;

/* Sink receiving sanitised output; returns 0, or -1 to abort (out of memory). */
typedef int (*di_utf8_sink)(void *ud, const char *s, size_t len);

static inline void di_utf8_stream_init(di_utf8_stream *u) { u->n_tail = 0; }
/* Pushes bytes; complete characters go to sink. Returns 0 or the sink's -1. */
int di_utf8_stream_push(di_utf8_stream *u, const char *bytes, size_t len, di_utf8_sink sink, void *ud);
/* Replaces a held incomplete tail with U+FFFD. */
int di_utf8_stream_flush(di_utf8_stream *u, di_utf8_sink sink, void *ud);
#endif
