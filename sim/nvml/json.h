/* A small JSON reader for node profiles: enough for objects, arrays, strings, numbers, booleans, null. */
#ifndef NVML_SIM_JSON_H
#define NVML_SIM_JSON_H

#include <stddef.h>

typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } jtype;

typedef struct jvalue {
    jtype type;
    double num;           /* J_NUM, J_BOOL (0/1) */
    char *str;            /* J_STR */
    size_t len;           /* items in J_ARR / J_OBJ */
    struct jvalue *items; /* J_ARR items, J_OBJ values */
    char **keys;          /* J_OBJ keys */
} jvalue;

/* Parses `text`; on failure returns NULL and writes a message with the byte offset into `err`. */
jvalue *json_parse(const char *text, char *err, size_t errlen);
void json_free(jvalue *v);
const jvalue *json_get(const jvalue *obj, const char *key);

#endif
