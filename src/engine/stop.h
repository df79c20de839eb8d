/* stop.h - stop-string matching on streamed output text (OpenAI semantics: the text ends
 * right before the earliest occurrence of any stop string; the stop string is not included).
 *
 * Owner: engine. Text arrives in pieces (detokenized tokens); a stop string may span pieces.
 * di_stop_find searches only where a match can involve the newly appended bytes, so the total
 * work is linear in the output (times the stop strings). di_stop_holdback says how many
 * trailing bytes must not be shown yet because they could be the start of a stop string. */
#ifndef DI_ENGINE_STOP_H
#define DI_ENGINE_STOP_H
#include <stddef.h>

/* Searches text[0..len) for stop strings that end after byte `old_len` (text before that was
 * searched already). Returns the index of the stop string with the earliest start (ties: the
 * lower index) and sets *at to its start, or returns -1. */
int di_stop_find(const char *text, size_t len, size_t old_len, const char *const *stops, int n_stops, size_t *at);
/* Length of the longest suffix of text[0..len) that is a proper prefix of some stop string. */
size_t di_stop_holdback(const char *text, size_t len, const char *const *stops, int n_stops);
#endif
