/* json_py.h - JSON text as Python's json.dumps(v, ensure_ascii=False) writes it (json_py.c). */
#ifndef DI_RECIPE_JSON_PY_H
#define DI_RECIPE_JSON_PY_H
#include <jansson.h>

/* ", " and ": " separators, keys in order, shortest round-trip floats. Returns malloc'd text or
 * NULL (out of memory). */
char *di_json_dumps_py(const json_t *v);
#endif
