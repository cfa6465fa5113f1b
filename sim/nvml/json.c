#include "json.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *s;
    size_t pos;
    char *err;
    size_t errlen;
    int depth;
} parser;

static int fail(parser *p, const char *what) {
    if (p->err[0] == '\0') snprintf(p->err, p->errlen, "%s at byte %zu", what, p->pos);
    return -1;
}

static void skip_ws(parser *p) {
    while (isspace((unsigned char)p->s[p->pos])) p->pos++;
}

static int parse_value(parser *p, jvalue *out);

static int parse_string(parser *p, char **out) {
    /* Caller checked the opening quote. Escapes other than \uXXXX above ASCII are kept simple. */
    size_t cap = 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) return fail(p, "out of memory");
    p->pos++;
    for (;;) {
        char c = p->s[p->pos];
        if (c == '\0') {
            free(buf);
            return fail(p, "unterminated string");
        }
        p->pos++;
        if (c == '"') break;
        if (c == '\\') {
            char e = p->s[p->pos++];
            switch (e) {
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'r': c = '\r'; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'u': {
                unsigned code = 0;
                for (int i = 0; i < 4; i++) {
                    char h = p->s[p->pos++];
                    if (!isxdigit((unsigned char)h)) {
                        free(buf);
                        return fail(p, "bad \\u escape");
                    }
                    code = code * 16 + (unsigned)(isdigit((unsigned char)h) ? h - '0' : (tolower(h) - 'a' + 10));
                }
                c = code < 0x80 ? (char)code : '?';
                break;
            }
            case '"': case '\\': case '/': c = e; break;
            default:
                free(buf);
                return fail(p, "bad escape");
            }
        }
        if (n + 2 > cap) {
            cap *= 2;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                return fail(p, "out of memory");
            }
            buf = nb;
        }
        buf[n++] = c;
    }
    buf[n] = '\0';
    *out = buf;
    return 0;
}

static int push(parser *p, jvalue *container, jvalue *item, char *key) {
    jvalue *ni = realloc(container->items, (container->len + 1) * sizeof(jvalue));
    if (!ni) return fail(p, "out of memory");
    container->items = ni;
    if (container->type == J_OBJ) {
        char **nk = realloc(container->keys, (container->len + 1) * sizeof(char *));
        if (!nk) return fail(p, "out of memory");
        container->keys = nk;
        container->keys[container->len] = key;
    }
    container->items[container->len++] = *item;
    return 0;
}

static int parse_array(parser *p, jvalue *out) {
    out->type = J_ARR;
    p->pos++;
    skip_ws(p);
    if (p->s[p->pos] == ']') {
        p->pos++;
        return 0;
    }
    for (;;) {
        jvalue item;
        if (parse_value(p, &item) < 0 || push(p, out, &item, NULL) < 0) return -1;
        skip_ws(p);
        char c = p->s[p->pos];
        if (c == ',') {
            p->pos++;
            continue;
        }
        if (c == ']') {
            p->pos++;
            return 0;
        }
        return fail(p, "expected ',' or ']'");
    }
}

static int parse_object(parser *p, jvalue *out) {
    out->type = J_OBJ;
    p->pos++;
    skip_ws(p);
    if (p->s[p->pos] == '}') {
        p->pos++;
        return 0;
    }
    for (;;) {
        skip_ws(p);
        if (p->s[p->pos] != '"') return fail(p, "expected a key string");
        char *key = NULL;
        if (parse_string(p, &key) < 0) return -1;
        skip_ws(p);
        if (p->s[p->pos] != ':') {
            free(key);
            return fail(p, "expected ':'");
        }
        p->pos++;
        jvalue item;
        if (parse_value(p, &item) < 0) {
            free(key);
            return -1;
        }
        if (push(p, out, &item, key) < 0) return -1;
        skip_ws(p);
        char c = p->s[p->pos];
        if (c == ',') {
            p->pos++;
            continue;
        }
        if (c == '}') {
            p->pos++;
            return 0;
        }
        return fail(p, "expected ',' or '}'");
    }
}

static int parse_value(parser *p, jvalue *out) {
    memset(out, 0, sizeof(*out));
    if (++p->depth > 64) return fail(p, "nesting too deep");
    skip_ws(p);
    const char *s = p->s + p->pos;
    int rc = 0;
    if (*s == '{') {
        rc = parse_object(p, out);
    } else if (*s == '[') {
        rc = parse_array(p, out);
    } else if (*s == '"') {
        out->type = J_STR;
        rc = parse_string(p, &out->str);
    } else if (strncmp(s, "true", 4) == 0) {
        out->type = J_BOOL;
        out->num = 1;
        p->pos += 4;
    } else if (strncmp(s, "false", 5) == 0) {
        out->type = J_BOOL;
        p->pos += 5;
    } else if (strncmp(s, "null", 4) == 0) {
        out->type = J_NULL;
        p->pos += 4;
    } else if (*s == '-' || isdigit((unsigned char)*s)) {
        char *end = NULL;
        out->type = J_NUM;
        out->num = strtod(s, &end);
        p->pos += (size_t)(end - s);
    } else {
        rc = fail(p, "unexpected character");
    }
    p->depth--;
    return rc;
}

static void free_inner(jvalue *v) {
    free(v->str);
    for (size_t i = 0; i < v->len; i++) {
        free_inner(&v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
}

jvalue *json_parse(const char *text, char *err, size_t errlen) {
    parser p = {text, 0, err, errlen, 0};
    err[0] = '\0';
    jvalue *root = calloc(1, sizeof(jvalue));
    if (!root) return NULL;
    if (parse_value(&p, root) < 0) {
        free_inner(root);
        free(root);
        return NULL;
    }
    skip_ws(&p);
    if (text[p.pos] != '\0') {
        fail(&p, "trailing characters");
        free_inner(root);
        free(root);
        return NULL;
    }
    return root;
}

void json_free(jvalue *v) {
    if (!v) return;
    free_inner(v);
    free(v);
}

const jvalue *json_get(const jvalue *obj, const char *key) {
    if (!obj || obj->type != J_OBJ) return NULL;
    for (size_t i = 0; i < obj->len; i++)
        if (strcmp(obj->keys[i], key) == 0) return &obj->items[i];
    return NULL;
}
