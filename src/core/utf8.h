/* utf8.h - strict UTF-8 (RFC 3629: no overlongs, no surrogates, max U+10FFFF). */
#ifndef DI_CORE_UTF8_H
#define DI_CORE_UTF8_H
#include <stddef.h>
#include <stdint.h>

/* Returns 1 if s[0..len) is valid UTF-8; else 0 and *bad_offset = first invalid byte offset. */
int di_utf8_valid(const char *s, size_t len, size_t *bad_offset);
/* Decodes one code point at s (len bytes available). Returns its byte length (1..4) and sets
 * *cp, or returns 0 if the bytes there are not a valid complete sequence. */
int di_utf8_decode(const unsigned char *s, size_t len, uint32_t *cp);
/* Encodes cp (<= 0x10FFFF, not a surrogate) into out[4]; returns the byte length (0 if invalid). */
int di_utf8_encode(uint32_t cp, char *out);
/* Length of the longest prefix of s[0..len) that does not end inside a multi-byte sequence
 * (for streaming: the tail len - result bytes may be an incomplete character). */
size_t di_utf8_complete_prefix(const char *s, size_t len);
#endif
