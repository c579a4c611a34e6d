/* Scanning JSON text in place, shared by merge_events.c and read_events.c: spans of the buffer for
 * keys and values, nothing decoded or copied. Values are delimited, not validated further. */
#ifndef POLYPROF_JSON_SCAN_H
#define POLYPROF_JSON_SCAN_H

#include <string.h>

typedef struct { Py_ssize_t a, b; } span; /* [a, b) in the buffer; a == b: absent */


enum { INCOMPLETE = -1, MALFORMED = -3 };

static inline Py_ssize_t skip_ws(const char *s, Py_ssize_t i, Py_ssize_t n) {
    while (i < n && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t')) i++;
    return i;
}

/* End of the string whose opening quote is at i (the strings of traces are short: a plain loop beats memchr). */
static inline Py_ssize_t string_end(const char *s, Py_ssize_t i, Py_ssize_t n) {
    for (i++; i < n; i++) {
        char c = s[i];
        if (c == '"') return i + 1;
        if (c == '\\') i++;
    }
    return INCOMPLETE;
}

/* The characters of numbers and of true / false / null. */
static const unsigned char token_char[256] = {
    ['+'] = 1, ['-'] = 1, ['.'] = 1, ['0'] = 1, ['1'] = 1, ['2'] = 1, ['3'] = 1, ['4'] = 1, ['5'] = 1, ['6'] = 1,
    ['7'] = 1, ['8'] = 1, ['9'] = 1, ['E'] = 1, ['a'] = 1, ['e'] = 1, ['f'] = 1, ['l'] = 1, ['n'] = 1, ['r'] = 1,
    ['s'] = 1, ['t'] = 1, ['u'] = 1,
};

/* End of the JSON value that starts at i (brackets balanced and strings skipped, not validated further). */
static inline Py_ssize_t value_end(const char *s, Py_ssize_t i, Py_ssize_t n) {
    if (i >= n) return INCOMPLETE;
    char c = s[i];
    if (c == '"') return string_end(s, i, n);
    if (c == '{' || c == '[') {
        int depth = 0;
        for (; i < n; i++) {
            c = s[i];
            if (c == '"') {
                i = string_end(s, i, n);
                if (i < 0) return INCOMPLETE;
                i--;
            } else if (c == '{' || c == '[') depth++;
            else if (c == '}' || c == ']') {
                if (--depth == 0) return i + 1;
            }
        }
        return INCOMPLETE;
    }
    Py_ssize_t start = i;
    while (i < n && token_char[(unsigned char)s[i]]) i++;
    if (i == start) return MALFORMED;
    return i < n ? i : INCOMPLETE; /* a number may go on in the next chunk */
}

/* The next key of the object whose body is at *i: 0: the object ended (*i after '}'), 1: a key (*i at
   its value), INCOMPLETE or MALFORMED. */
static inline int next_key(const char *s, Py_ssize_t *i, Py_ssize_t n, span *key) {
    Py_ssize_t j = skip_ws(s, *i, n);
    if (j < n && s[j] == ',') j = skip_ws(s, j + 1, n);
    if (j >= n) return INCOMPLETE;
    if (s[j] == '}') {
        *i = j + 1;
        return 0;
    }
    if (s[j] != '"') return MALFORMED;
    Py_ssize_t k = string_end(s, j, n);
    if (k < 0) return INCOMPLETE;
    key->a = j + 1, key->b = k - 1;
    j = skip_ws(s, k, n);
    if (j >= n) return INCOMPLETE;
    if (s[j] != ':') return MALFORMED;
    *i = skip_ws(s, j + 1, n);
    return 1;
}

/* The next "key": value pair of the object whose body is at *i; as next_key, *i after the value (and
   left where it was when the pair is incomplete). */
static inline int next_pair(const char *s, Py_ssize_t *i, Py_ssize_t n, span *key, span *val) {
    Py_ssize_t at = *i;
    int r = next_key(s, &at, n, key);
    if (r == 0) *i = at;
    if (r != 1) return r;
    Py_ssize_t e = value_end(s, at, n);
    if (e < 0) return (int)e;
    val->a = at, val->b = e;
    *i = e;
    return 1;
}

static inline int is(const char *s, span x, const char *text) {
    size_t len = strlen(text);
    return (size_t)(x.b - x.a) == len && memcmp(s + x.a, text, len) == 0;
}

/* An integer token (no fraction, no exponent) as an __int128; 0 when it is not one. */
static inline int parse_int(const char *s, span x, __int128 *out) {
    Py_ssize_t i = x.a;
    int neg = i < x.b && s[i] == '-';
    if (neg) i++;
    if (i == x.b || x.b - i > 30) return 0;
    __int128 v = 0;
    for (; i < x.b; i++) {
        if (s[i] < '0' || s[i] > '9') return 0;
        v = v * 10 + (s[i] - '0');
    }
    *out = neg ? -v : v;
    return 1;
}

/* The next element of the array whose body is at i (past the previous element): 1 with *at on its
   first byte, 0 when the array ends (*at after its ']'), INCOMPLETE when the buffer ends first. */
static inline int next_item(const char *s, Py_ssize_t i, Py_ssize_t n, Py_ssize_t *at) {
    Py_ssize_t j = skip_ws(s, i, n);
    if (j < n && s[j] == ',') j = skip_ws(s, j + 1, n);
    if (j >= n) return INCOMPLETE;
    if (s[j] == ']') {
        *at = j + 1;
        return 0;
    }
    *at = j;
    return 1;
}

#endif
