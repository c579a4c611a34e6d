/* Scanning JSON text in place, shared by merge_events.c and read_events.c: spans of the buffer for
 * keys and values, nothing decoded or copied. Values are delimited, not validated further. */
#ifndef POLYPROF_JSON_SCAN_H
#define POLYPROF_JSON_SCAN_H

#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

typedef struct { Py_ssize_t a, b; } span; /* [a, b) in the buffer; a == b: absent */


enum { INCOMPLETE = -1, MALFORMED = -3 };

static inline Py_ssize_t skip_ws(const char *s, Py_ssize_t i, Py_ssize_t n) {
    while (i < n && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t')) i++;
    return i;
}

/* End of the string whose opening quote is at i: 16 bytes at a time for its quote or a backslash
 * (SSE2, on every x86-64), the last few bytes of the buffer one by one. */
static inline Py_ssize_t string_end(const char *s, Py_ssize_t i, Py_ssize_t n) {
    i++;
#if defined(__SSE2__)
    const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\');
    while (i + 16 <= n) {
        __m128i chunk = _mm_loadu_si128((const __m128i *)(s + i));
        unsigned mask = (unsigned)_mm_movemask_epi8(_mm_or_si128(_mm_cmpeq_epi8(chunk, quote), _mm_cmpeq_epi8(chunk, backslash)));
        if (mask == 0) {
            i += 16;
            continue;
        }
        i += __builtin_ctz(mask);
        if (s[i] == '"') return i + 1;
        i += 2;  /* a backslash and the character it escapes */
    }
#endif
    for (; i < n; i++) {
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

/* ---- strict checking: JSON text that orjson.loads reads, or 0 (a subset of what it reads: numbers of
 * at most 40 characters and two exponent digits, no escaped surrogates, nesting to depth 64) ------ */
static inline Py_ssize_t utf8_char_end(const unsigned char *s, Py_ssize_t i, Py_ssize_t n) {
    unsigned char c = s[i];
    int more;
    unsigned lo = 0x80, hi = 0xBF;
    if (c < 0x80) return i + 1;
    if (c >= 0xC2 && c <= 0xDF) more = 1;
    else if (c >= 0xE0 && c <= 0xEF) more = 2, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4) more = 3, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else return -1;
    if (i + more >= n) return -1;
    if (s[i + 1] < lo || s[i + 1] > hi) return -1;
    for (int k = 2; k <= more; k++) if ((s[i + k] & 0xC0) != 0x80) return -1;
    return i + more + 1;
}

static inline int hex_digit(unsigned char c) {
    return (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
}

static Py_ssize_t strict_value_end(const unsigned char *s, Py_ssize_t i, Py_ssize_t n, int depth);

static inline Py_ssize_t strict_string_end(const unsigned char *s, Py_ssize_t i, Py_ssize_t n) {
    for (i++; i < n;) {
        unsigned char c = s[i];
        if (c == '"') return i + 1;
        if (c < 0x20) return -1;
        if (c == '\\') {
            if (i + 1 >= n) return -1;
            c = s[i + 1];
            if (c == 'u') {
                if (i + 5 >= n) return -1;
                int v = 0;
                for (int k = 2; k < 6; k++) {
                    int d = hex_digit(s[i + k]);
                    if (d < 0) return -1;
                    v = v * 16 + d;
                }
                if (v >= 0xD800 && v <= 0xDFFF) return -1;
                i += 6;
            } else if (strchr("\"\\/bfnrt", c) != NULL && c != 0) i += 2;
            else return -1;
        } else if ((i = utf8_char_end(s, i, n)) < 0) return -1;
    }
    return -1;
}

static inline Py_ssize_t strict_number_end(const unsigned char *s, Py_ssize_t i, Py_ssize_t n) {
    Py_ssize_t start = i;
    if (i < n && s[i] == '-') i++;
    if (i < n && s[i] == '0') i++;
    else if (i < n && s[i] >= '1' && s[i] <= '9') while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    else return -1;
    if (i < n && s[i] == '.') {
        Py_ssize_t d = ++i;
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
        if (i == d) return -1;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-')) i++;
        Py_ssize_t d = i;
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
        if (i == d || i - d > 2) return -1;
    }
    return i - start > 40 ? -1 : i;
}

static Py_ssize_t strict_value_end(const unsigned char *s, Py_ssize_t i, Py_ssize_t n, int depth) {
    i = skip_ws((const char *)s, i, n);
    if (i >= n) return -1;
    unsigned char c = s[i];
    if (c == '"') return strict_string_end(s, i, n);
    if (c == '{' || c == '[') {
        if (depth >= 64) return -1;
        unsigned char close = c == '{' ? '}' : ']';
        i = skip_ws((const char *)s, i + 1, n);
        if (i < n && s[i] == close) return i + 1;
        for (;;) {
            if (c == '{') {
                i = skip_ws((const char *)s, i, n);
                if (i >= n || s[i] != '"' || (i = strict_string_end(s, i, n)) < 0) return -1;
                i = skip_ws((const char *)s, i, n);
                if (i >= n || s[i] != ':') return -1;
                i++;
            }
            if ((i = strict_value_end(s, i, n, depth + 1)) < 0) return -1;
            i = skip_ws((const char *)s, i, n);
            if (i < n && s[i] == close) return i + 1;
            if (i >= n || s[i] != ',') return -1;
            i++;
        }
    }
    if (c == 't') return n - i >= 4 && memcmp(s + i, "true", 4) == 0 ? i + 4 : -1;
    if (c == 'f') return n - i >= 5 && memcmp(s + i, "false", 5) == 0 ? i + 5 : -1;
    if (c == 'n') return n - i >= 4 && memcmp(s + i, "null", 4) == 0 ? i + 4 : -1;
    return strict_number_end(s, i, n);
}

/* Whether the n bytes at s are one JSON value (with whitespace around it) that orjson reads. */
static inline int json_checked(const void *p, Py_ssize_t n) {
    const unsigned char *s = p;
    Py_ssize_t end = strict_value_end(s, 0, n, 0);
    return end >= 0 && skip_ws((const char *)s, end, n) == n;
}

#endif
