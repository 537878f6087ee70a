/* The fact pattern's matches at C speed: fact_matches(text) == facts._FACT.findall(text).

   facts.py keeps the pattern and the pure-Python scan (the reference and the fallback); it
   uses this module only while PATTERN below is the pattern it compiles, so a change to the
   pattern turns the native scan off until this file is changed with it. The equivalence is a
   property test (tests/providers/test_factscan.py).

   The pattern is `[^`\s]{2,60}` in backticks, or, where the character before is none of
   [\w./@$€£~:%+<-]: a run of C = [\w./@$€£~:%+-] holding a REQ (a digit, `_`, `/`, `@`, a dot
   inside a word, a lower-to-upper hump, ...), extended over C2 = C plus [?=&#]. Every REQ's
   characters are in C2, so a match ends where the run of C2 characters from its start ends:
   no backtracking is needed, only whether some REQ starts inside the run of C. Character
   classes are the regex module's for str patterns (\w: str.isalnum() or `_`; \d: decimal
   digits; \s: str.isspace()). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

static const char PATTERN[] =
    "`[^`\\s]{2,60}`"
    "|(?<![\\w./@$\xe2\x82\xac\xc2\xa3~:%+<-])[\\w./@$\xe2\x82\xac\xc2\xa3~:%+-]*"
    "(?:[\\d_/@]|\\w\\.\\w|[a-z][A-Z]|[A-Z]{2}[a-z]|[A-Z]-[A-Za-z]|[a-z]-[A-Z]|\\w\\+[A-Z]"
    "|[A-Za-z]#)"
    "[\\w./@$\xe2\x82\xac\xc2\xa3~:%+?=&#-]*";

enum { WORD = 1, C = 2, C2 = 4, LB = 8, DIGIT = 16, SPACE = 32 };

static unsigned char ascii[128];

static void init_table(void) {
    for (int ch = 0; ch < 128; ch++) {
        unsigned char f = 0;
        if ((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
            ch == '_')
            f |= WORD | C | C2 | LB;
        if (ch >= '0' && ch <= '9')
            f |= DIGIT;
        if (strchr("./@$~:%+-", ch) && ch)
            f |= C | C2 | LB;
        if (strchr("?=&#", ch) && ch)
            f |= C2;
        if (ch == '<')
            f |= LB;
        if (Py_UNICODE_ISSPACE(ch))
            f |= SPACE;
        ascii[ch] = f;
    }
}

static inline unsigned flags(Py_UCS4 ch) {
    if (ch < 128)
        return ascii[ch];
    unsigned f = 0;
    if (Py_UNICODE_ISALNUM(ch))
        f |= WORD | C | C2 | LB;
    if (Py_UNICODE_ISDECIMAL(ch))
        f |= DIGIT;
    if (ch == 0x20AC || ch == 0xA3) /* € £ */
        f |= C | C2 | LB;
    if (Py_UNICODE_ISSPACE(ch))
        f |= SPACE;
    return f;
}

#define LOWER(ch) ((ch) >= 'a' && (ch) <= 'z')
#define UPPER(ch) ((ch) >= 'A' && (ch) <= 'Z')
#define LETTER(ch) (LOWER(ch) || UPPER(ch))

/* Whether one of the pattern's REQ alternatives matches at p (p < n). */
#if defined(__GNUC__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE inline
#endif

static ALWAYS_INLINE int req_at(int kind, const void *data, Py_ssize_t n, Py_ssize_t p, Py_UCS4 ch,
                         unsigned f) {
    if ((f & DIGIT) || ch == '_' || ch == '/' || ch == '@')
        return 1;
    if (p + 1 >= n)
        return 0;
    Py_UCS4 b = PyUnicode_READ(kind, data, p + 1);
    if (f & WORD) {
        if (b == '.' && p + 2 < n && (flags(PyUnicode_READ(kind, data, p + 2)) & WORD))
            return 1;
        if (b == '+' && p + 2 < n && UPPER(PyUnicode_READ(kind, data, p + 2)))
            return 1;
    }
    if (LOWER(ch) && UPPER(b))
        return 1;
    if (UPPER(ch) && p + 2 < n) {
        Py_UCS4 c = PyUnicode_READ(kind, data, p + 2);
        if (UPPER(b) && LOWER(c))
            return 1;
        if (b == '-' && LETTER(c))
            return 1;
    }
    if (LOWER(ch) && b == '-' && p + 2 < n && UPPER(PyUnicode_READ(kind, data, p + 2)))
        return 1;
    if (LETTER(ch) && b == '#')
        return 1;
    return 0;
}

/* The scan for one kind of str: called with a constant kind, so that the compiler reads the
   characters of that width directly (PyUnicode_READ's switch folds away). */
static ALWAYS_INLINE PyObject *scan_kind(PyObject *text, int kind) {
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    Py_ssize_t pos = 0;
    while (pos < n) {
        Py_UCS4 ch = PyUnicode_READ(kind, data, pos);
        Py_ssize_t start = pos, end = -1;
        if (ch == '`') {
            Py_ssize_t j = pos + 1;
            while (j < n && j - pos <= 61) {
                Py_UCS4 c = PyUnicode_READ(kind, data, j);
                if (c == '`' || (flags(c) & SPACE))
                    break;
                j++;
            }
            Py_ssize_t run = j - pos - 1;
            if (run >= 2 && run <= 60 && j < n && PyUnicode_READ(kind, data, j) == '`')
                end = j + 1;
            else
                pos++;
        } else {
            unsigned f = flags(ch);
            if (!(f & C) || (pos > 0 && (flags(PyUnicode_READ(kind, data, pos - 1)) & LB))) {
                pos++;
                continue;
            }
            /* The run of C from pos; whether a REQ starts inside it. */
            Py_ssize_t p = pos;
            int found = 0;
            while (p < n) {
                Py_UCS4 c = PyUnicode_READ(kind, data, p);
                unsigned g = flags(c);
                if (!(g & C))
                    break;
                if (!found && req_at(kind, data, n, p, c, g))
                    found = 1;
                p++;
            }
            if (!found) {
                pos = p; /* every position inside the run follows a C character */
                continue;
            }
            while (p < n && (flags(PyUnicode_READ(kind, data, p)) & C2))
                p++;
            end = p;
        }
        if (end >= 0) {
            PyObject *match = PyUnicode_Substring(text, start, end);
            if (match == NULL || PyList_Append(out, match) < 0) {
                Py_XDECREF(match);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(match);
            pos = end;
        }
    }
    return out;
}

static PyObject *fact_matches(PyObject *module, PyObject *text) {
    (void)module;
    if (!PyUnicode_Check(text)) {
        PyErr_SetString(PyExc_TypeError, "fact_matches() wants a str");
        return NULL;
    }
    switch (PyUnicode_KIND(text)) {
    case PyUnicode_1BYTE_KIND:
        return scan_kind(text, PyUnicode_1BYTE_KIND);
    case PyUnicode_2BYTE_KIND:
        return scan_kind(text, PyUnicode_2BYTE_KIND);
    default:
        return scan_kind(text, PyUnicode_4BYTE_KIND);
    }
}

/* ---- Amounts with thousands separators: facts._GROUPED.findall(text, start, end) ----

   (?<![\w.,])[$€£]?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?!\w|[.,]\d). No backtracking changes the
   outcome: every shorter choice of a part leaves a digit, or a `,`/`.` before a digit, right
   after it, which the lookahead (or the next part) rejects; so a match is the longest reading
   from its start, kept only if the lookahead holds there. As with the regex, characters before
   `start` are seen by the lookbehind and none from `end` on are seen at all. */

static const char GROUPED[] =
    "(?<![\\w.,])[$\xe2\x82\xac\xc2\xa3]?\\d{1,3}(?:,\\d{3})+(?:\\.\\d+)?(?!\\w|[.,]\\d)";

#define IS_DIGIT_AT(p) ((p) < end && (flags(PyUnicode_READ(kind, data, (p))) & DIGIT))
#define IS_CURRENCY(ch) ((ch) == '$' || (ch) == 0x20AC || (ch) == 0xA3)

/* The end of the amount starting at p, or -1. */
static Py_ssize_t grouped_at(int kind, const void *data, Py_ssize_t end, Py_ssize_t p) {
    if (p > 0) {
        Py_UCS4 b = PyUnicode_READ(kind, data, p - 1);
        if ((flags(b) & WORD) || b == '_' || b == '.' || b == ',')
            return -1;
    }
    Py_ssize_t q = p;
    if (IS_CURRENCY(PyUnicode_READ(kind, data, q)))
        q++;
    Py_ssize_t d = q;
    while (d - q < 4 && IS_DIGIT_AT(d))
        d++;
    if (d == q || d - q > 3)
        return -1;
    Py_ssize_t r = d;
    while (r + 3 < end && PyUnicode_READ(kind, data, r) == ',' && IS_DIGIT_AT(r + 1) &&
           IS_DIGIT_AT(r + 2) && IS_DIGIT_AT(r + 3))
        r += 4;
    if (r == d)
        return -1;
    if (r + 1 < end && PyUnicode_READ(kind, data, r) == '.' && IS_DIGIT_AT(r + 1)) {
        r += 2;
        while (IS_DIGIT_AT(r))
            r++;
    }
    if (r < end) {
        Py_UCS4 c = PyUnicode_READ(kind, data, r);
        if ((flags(c) & WORD) || c == '_')
            return -1;
        if ((c == '.' || c == ',') && IS_DIGIT_AT(r + 1))
            return -1;
    }
    return r;
}

/* text, start, end as str.find takes them (clamped to the text). */
static int parse_span(PyObject *const *args, Py_ssize_t nargs, const char *name, PyObject **text,
                      Py_ssize_t *start, Py_ssize_t *end) {
    if (nargs < 1 || nargs > 3) {
        PyErr_Format(PyExc_TypeError, "%s() takes 1 to 3 arguments", name);
        return -1;
    }
    if (!PyUnicode_Check(args[0])) {
        PyErr_Format(PyExc_TypeError, "%s() wants a str", name);
        return -1;
    }
    *text = args[0];
    Py_ssize_t n = PyUnicode_GET_LENGTH(args[0]);
    *start = 0;
    *end = n;
    if (nargs > 1 && (*start = PyNumber_AsSsize_t(args[1], PyExc_OverflowError)) == -1 &&
        PyErr_Occurred())
        return -1;
    if (nargs > 2 && (*end = PyNumber_AsSsize_t(args[2], PyExc_OverflowError)) == -1 &&
        PyErr_Occurred())
        return -1;
    /* As re's pos and endpos: negative means 0, past the end means the end. */
    if (*start < 0)
        *start = 0;
    if (*end < 0)
        *end = 0;
    if (*end > n)
        *end = n;
    if (*start > n)
        *start = n;
    return 0;
}

static int append_substring(PyObject *out, PyObject *text, Py_ssize_t start, Py_ssize_t end) {
    PyObject *match = PyUnicode_Substring(text, start, end);
    if (match == NULL)
        return -1;
    int failed = PyList_Append(out, match);
    Py_DECREF(match);
    return failed;
}

/* A matcher: the end of the match at p (group 1 in [*g0, *g1)), or -1; it sees nothing from
   `end` on. */
/* The one-byte characters each pattern's match can start with (filled at import). */
static unsigned char grouped_starts[256], quoted_starts[256], name_starts[256];

static void init_starts(void) {
    for (int ch = 0; ch < 256; ch++) {
        grouped_starts[ch] = (ch >= '0' && ch <= '9') || ch == '$' || ch == 0xA3;
        quoted_starts[ch] = ch == '"';
        name_starts[ch] = (ch >= 'A' && ch <= 'Z') || (ch >= 0xC0 && ch <= 0xDE);
    }
}

typedef Py_ssize_t (*matcher)(int kind, const void *data, Py_ssize_t end, Py_ssize_t p,
                              Py_ssize_t *g0, Py_ssize_t *g1);

/* findall(text, start, end) of a pattern that has a matcher: the non-overlapping matches
   (or their group 1), left to right; or with `spans`, the (start, end) of each whole match
   (what finditer's matches' span() give). */
/* `starts`: the one-byte characters a match can start with (one-byte texts, most of them, skip
   the others in a tight loop; the matcher tests every position of wider texts itself). */
static PyObject *findall_with(PyObject *const *args, Py_ssize_t nargs, const char *name,
                              matcher match_at, const unsigned char *starts, int spans) {
    PyObject *text;
    Py_ssize_t start, end;
    if (parse_span(args, nargs, name, &text, &start, &end) < 0)
        return NULL;
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    Py_ssize_t p = start;
    const Py_UCS1 *bytes = kind == PyUnicode_1BYTE_KIND ? PyUnicode_1BYTE_DATA(text) : NULL;
    while (p < end) {
        if (bytes != NULL) {
            while (p < end && !starts[bytes[p]])
                p++;
            if (p == end)
                break;
        }
        Py_ssize_t g0 = p, g1 = p;
        Py_ssize_t r = match_at(kind, data, end, p, &g0, &g1);
        if (r < 0) {
            p++;
            continue;
        }
        int failed;
        if (spans) {
            PyObject *span = Py_BuildValue("(nn)", p, r);
            failed = span == NULL ? -1 : PyList_Append(out, span);
            Py_XDECREF(span);
        } else
            failed = append_substring(out, text, g0, g1);
        if (failed < 0) {
            Py_DECREF(out);
            return NULL;
        }
        p = r > p ? r : p + 1;
    }
    return out;
}

static Py_ssize_t grouped_match(int kind, const void *data, Py_ssize_t end, Py_ssize_t p,
                                Py_ssize_t *g0, Py_ssize_t *g1) {
    Py_UCS4 ch = PyUnicode_READ(kind, data, p);
    if (!IS_CURRENCY(ch) && !(flags(ch) & DIGIT))
        return -1;
    *g0 = p;
    return *g1 = grouped_at(kind, data, end, p);
}

static PyObject *grouped_amounts(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    return findall_with(args, nargs, "grouped_amounts", grouped_match, grouped_starts, 0);
}

/* ---- Quoted phrases: the spans of facts._QUOTED_PHRASE.finditer(text, start, end) ----

   ["“]([^"“”\n]{3,80})["”]: the run of allowed characters after an opening quote must be
   3 to 80 long and end at a closing quote (a longer run leaves an allowed character after any
   80 of it, so no shorter reading matches either). */

static const char QUOTED[] = "[\\\"\xe2\x80\x9c]([^\\\"\xe2\x80\x9c\xe2\x80\x9d\\n]{3,80})[\\\"\xe2\x80\x9d]";

static Py_ssize_t quoted_match(int kind, const void *data, Py_ssize_t end, Py_ssize_t p,
                               Py_ssize_t *g0, Py_ssize_t *g1) {
    Py_UCS4 ch = PyUnicode_READ(kind, data, p);
    if (ch != '"' && ch != 0x201C)
        return -1;
    Py_ssize_t q = p + 1;
    while (q < end && q - p <= 81) {
        Py_UCS4 c = PyUnicode_READ(kind, data, q);
        if (c == '"' || c == 0x201C || c == 0x201D || c == '\n')
            break;
        q++;
    }
    Py_ssize_t run = q - p - 1;
    if (run < 3 || run > 80 || q >= end)
        return -1;
    Py_UCS4 close = PyUnicode_READ(kind, data, q);
    if (close != '"' && close != 0x201D)
        return -1;
    *g0 = p + 1;
    *g1 = q;
    return q + 1;
}

static PyObject *quoted_spans(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    return findall_with(args, nargs, "quoted_spans", quoted_match, quoted_starts, 1);
}

/* ---- Names: facts._NAME.findall(text, start, end) ----

   A capital after a lower-case letter, digit, `,` or `;` and a blank (maybe an opening quote
   between), after a digit, a letter and a blank, or after a dash between blanks; the rest of
   its word (lower-case letters and maybe inner capitalized parts, or capitals then lower-case
   letters), hyphenated parts, a possessive `'s`, up to three more
   capitalized words after blanks, and no word character, `-` or quoted word character right
   after. This follows the regex's backtracking in its order (greedy parts longest first,
   alternatives in turn), so the first end it accepts is the regex's; the parts only recurse
   three words deep (repeated parts are walked without recursion, see `chain`). */

static const char NAME[] =
    "([A-Z\xc3\x80-\xc3\x9e](?:(?<=[a-z\xc3\x9f-\xc3\xbf\\d,;][ \\t][A-Z\xc3\x80-\xc3\x9e])"
    "|(?<=[a-z\xc3\x9f-\xc3\xbf\\d,;][ \\t][\"'(\xe2\x80\x9c\xe2\x80\x98][A-Z\xc3\x80-\xc3\x9e])"
    "|(?<=\\d[A-Za-z][ \\t][A-Z\xc3\x80-\xc3\x9e])"
    "|(?<=[ \\t][\xe2\x80\x93\xe2\x80\x94][ \\t][A-Z\xc3\x80-\xc3\x9e]))"
    "(?:[a-z\xc3\x9f-\xc3\xbf]+(?:[A-Z\xc3\x80-\xc3\x9e][a-z\xc3\x9f-\xc3\xbf]+)*"
    "|[A-Z\xc3\x80-\xc3\x9e]+[a-z\xc3\x9f-\xc3\xbf]*)"
    "(?:-[A-Za-z\xc3\x9f-\xc3\xbf]+)*(?:'s)?"
    "(?:[ \\t]+(?:[A-Z\xc3\x80-\xc3\x9e][a-z\xc3\x9f-\xc3\xbf]+|[A-Z\xc3\x80-\xc3\x9e]{2,}"
    "[a-z\xc3\x9f-\xc3\xbf]*)(?:-[A-Za-z\xc3\x9f-\xc3\xbf]+)*(?:'s)?){0,3})"
    "(?![\\w-]|['\xe2\x80\x99]\\w)";

static inline int is_low(Py_UCS4 c) { return (c >= 'a' && c <= 'z') || (c >= 0xDF && c <= 0xFF); }
static inline int is_cap(Py_UCS4 c) { return (c >= 'A' && c <= 'Z') || (c >= 0xC0 && c <= 0xDE); }
static inline int is_hyphen_letter(Py_UCS4 c) { return LETTER(c) || (c >= 0xDF && c <= 0xFF); }
static inline int is_blank(Py_UCS4 c) { return c == ' ' || c == '\t'; }
static inline int is_word(Py_UCS4 c) { return (flags(c) & WORD) || c == '_'; }
static inline int is_after_word(Py_UCS4 c) {
    return is_low(c) || (flags(c) & DIGIT) || c == ',' || c == ';';
}

typedef struct {
    int kind;
    const void *data;
    Py_ssize_t end; /* nothing from here on is seen */
} span;

#define AT(s, i) PyUnicode_READ((s)->kind, (s)->data, (i))

static Py_ssize_t run_of(const span *s, Py_ssize_t q, int (*is)(Py_UCS4)) {
    Py_ssize_t r = q;
    while (r < s->end && is(AT(s, r)))
        r++;
    return r - q;
}

static Py_ssize_t name_words(const span *s, Py_ssize_t q, int words);

/* ('s)? at q, then the further words. */
static Py_ssize_t possessive(const span *s, Py_ssize_t q, int words) {
    if (q + 1 < s->end && AT(s, q) == '\'' && AT(s, q + 1) == 's') {
        Py_ssize_t r = name_words(s, q + 2, words);
        if (r >= 0)
            return r;
    }
    return name_words(s, q, words);
}

typedef Py_ssize_t (*continuation)(const span *s, Py_ssize_t q, int words);

static inline int is_dash(Py_UCS4 c) { return c == '-'; }

/* (?:H B+)* at q (a head character, then the longest run of body characters; head and body
   characters are disjoint), then `then`. The regex tries the most parts, each longest first:
   its order of ends is the end of the whole chain, then every position back to q except
   those right after a part's head (a part has a body character at least). */
static Py_ssize_t chain(const span *s, Py_ssize_t q, int (*is_head)(Py_UCS4),
                       int (*is_body)(Py_UCS4), continuation then, int words) {
    Py_ssize_t e = q;
    while (e + 1 < s->end && is_head(AT(s, e)) && is_body(AT(s, e + 1)))
        e += 1 + run_of(s, e + 1, is_body);
    Py_ssize_t r = then(s, e, words);
    for (Py_ssize_t x = e - 1; r < 0 && x >= q; x--)
        if (x == q || !is_head(AT(s, x - 1)))
            r = then(s, x, words);
    return r;
}

/* The hyphenated parts (?:-[A-Za-zß-ÿ]+)* at q, then the rest. */
static Py_ssize_t hyphens(const span *s, Py_ssize_t q, int words) {
    return chain(s, q, is_dash, is_hyphen_letter, possessive, words);
}

/* A word of a name at q ([A-ZÀ-Þ][a-zß-ÿ]+ or [A-ZÀ-Þ]{2,}[a-zß-ÿ]*), then the rest. */
static Py_ssize_t name_word(const span *s, Py_ssize_t q, int words) {
    if (q >= s->end || !is_cap(AT(s, q)))
        return -1;
    for (Py_ssize_t k = run_of(s, q + 1, is_low); k >= 1; k--) {
        Py_ssize_t r = hyphens(s, q + 1 + k, words);
        if (r >= 0)
            return r;
    }
    for (Py_ssize_t i = run_of(s, q, is_cap); i >= 2; i--)
        for (Py_ssize_t j = run_of(s, q + i, is_low); j >= 0; j--) {
            Py_ssize_t r = hyphens(s, q + i + j, words);
            if (r >= 0)
                return r;
        }
    return -1;
}

/* Up to 3 - words more words after blanks at q; then the end must be followed by no word
   character, `-` or quote before one. */
static Py_ssize_t name_words(const span *s, Py_ssize_t q, int words) {
    if (words < 3)
        for (Py_ssize_t k = run_of(s, q, is_blank); k >= 1; k--) {
            Py_ssize_t r = name_word(s, q + k, words + 1);
            if (r >= 0)
                return r;
        }
    if (q < s->end) {
        Py_UCS4 c = AT(s, q);
        if (is_word(c) || c == '-')
            return -1;
        if ((c == '\'' || c == 0x2019) && q + 1 < s->end && is_word(AT(s, q + 1)))
            return -1;
    }
    return q;
}

static Py_ssize_t name_match(int kind, const void *data, Py_ssize_t end, Py_ssize_t p,
                             Py_ssize_t *g0, Py_ssize_t *g1) {
    span s = {kind, data, end};
    if (!is_cap(AT(&s, p)) || p < 2)
        return -1;
    Py_UCS4 b1 = AT(&s, p - 1), b2 = AT(&s, p - 2), b3 = p >= 3 ? AT(&s, p - 3) : 0;
    int quote = b1 == '"' || b1 == '\'' || b1 == '(' || b1 == 0x201C || b1 == 0x2018;
    int first = (is_blank(b1) && is_after_word(b2)) ||
                (p >= 3 && quote && is_blank(b2) && is_after_word(b3)) ||
                (p >= 3 && is_blank(b1) && LETTER(b2) && (flags(b3) & DIGIT)) ||
                (p >= 3 && is_blank(b1) && (b2 == 0x2013 || b2 == 0x2014) && is_blank(b3));
    if (!first)
        return -1;
    Py_ssize_t r = -1;
    for (Py_ssize_t k = run_of(&s, p + 1, is_low); r < 0 && k >= 1; k--)
        r = chain(&s, p + 1 + k, is_cap, is_low, hyphens, 0); /* inner capitalized parts */
    for (Py_ssize_t i = run_of(&s, p + 1, is_cap); r < 0 && i >= 1; i--)
        for (Py_ssize_t j = run_of(&s, p + 1 + i, is_low); r < 0 && j >= 0; j--)
            r = hyphens(&s, p + 1 + i + j, 0);
    *g0 = p;
    *g1 = r;
    return r;
}

static PyObject *names(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    return findall_with(args, nargs, "names", name_match, name_starts, 0);
}

/* name_facts(text, start, end, not_names) -> list[str]: the names facts.name_matches keeps
   of names(text, start, end): a one-word name unless not_names holds it; a name of several
   words (blanks between them) without the not_names words it starts with, joined by single
   spaces, unless none is left. */
static int name_fact(PyObject *out, PyObject *match, PyObject *not_names) {
    if (PyUnicode_FindChar(match, ' ', 0, PY_SSIZE_T_MAX, 1) == -1 &&
        PyUnicode_FindChar(match, '\t', 0, PY_SSIZE_T_MAX, 1) == -1) {
        int known = PySet_Contains(not_names, match);
        return known != 0 ? (known < 0 ? -1 : 0) : PyList_Append(out, match);
    }
    PyObject *words = PyUnicode_Split(match, NULL, -1);
    if (words == NULL)
        return -1;
    Py_ssize_t n = PyList_GET_SIZE(words), first = 0;
    int failed = 0;
    while (first < n) {
        int known = PySet_Contains(not_names, PyList_GET_ITEM(words, first));
        if (known < 0)
            failed = -1;
        if (known != 1)
            break;
        first++;
    }
    if (!failed && first < n) {
        PyObject *rest = PyList_GetSlice(words, first, n), *sep = PyUnicode_FromString(" ");
        PyObject *name = rest == NULL || sep == NULL ? NULL : PyUnicode_Join(sep, rest);
        failed = name == NULL ? -1 : PyList_Append(out, name);
        Py_XDECREF(name);
        Py_XDECREF(sep);
        Py_XDECREF(rest);
    }
    Py_DECREF(words);
    return failed;
}

static PyObject *name_facts(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 4 || !PyAnySet_Check(args[3]))
        return PyErr_Format(PyExc_TypeError, "name_facts() wants a str, two ints and a set");
    PyObject *found = findall_with(args, 3, "name_facts", name_match, name_starts, 0);
    if (found == NULL)
        return NULL;
    PyObject *out = PyList_New(0);
    for (Py_ssize_t k = 0; out != NULL && k < PyList_GET_SIZE(found); k++)
        if (name_fact(out, PyList_GET_ITEM(found, k), args[3]) < 0)
            Py_CLEAR(out);
    Py_DECREF(found);
    return out;
}

/* ---- Ranks: facts._rank(value) and the ranked distinct facts of facts._ranked_facts ---- */

static const char PATHLIKE[] = "^[\\w.-]*/[\\w./-]*\\w$|^[\\w-]+\\.[a-z]{1,4}$";
static const char PUNCT_EDGES[] = ".:,-+%~";
static const char DIGIT_PATTERN[] = "\\d";
static const char LETTER[] = "[^\\W\\d_]";
static const char MIN_FACT_LEN[] = "2";

#define IS_W(ch, f) (((f) & WORD) || (ch) == '_')

/* Whether facts._PATHLIKE.search(value) finds something. */
static int pathlike(int kind, const void *data, Py_ssize_t n) {
    if (n > 0 && PyUnicode_READ(kind, data, n - 1) == '\n')
        n--; /* `$` matches before a final line break too */
    if (n < 2)
        return 0;
    /* Alternative 1: only [\w./-], a slash among them, a word character last. */
    int slash = 0, other = 0;
    Py_ssize_t dots = 0, dot_at = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 ch = PyUnicode_READ(kind, data, i);
        if (ch == '/')
            slash = 1;
        else if (ch == '.') {
            dots++;
            dot_at = i;
        } else if (ch != '-' && !IS_W(ch, flags(ch)))
            other = 1;
    }
    Py_UCS4 last = PyUnicode_READ(kind, data, n - 1);
    if (!other && slash && IS_W(last, flags(last)))
        return 1;
    /* ^[\w-]+\.[a-z]{1,4}$: one dot, after a word, before 1 to 4 of a-z. */
    if (other || slash || dots != 1 || dot_at < 1 || n - dot_at - 1 < 1 || n - dot_at - 1 > 4)
        return 0;
    for (Py_ssize_t i = dot_at + 1; i < n; i++)
        if (!LOWER(PyUnicode_READ(kind, data, i)))
            return 0;
    return 1;
}

/* facts._rank(value) (not quoted), or -1 with an exception set. */
static long rank_of(PyObject *value) {
    int kind = PyUnicode_KIND(value);
    const void *data = PyUnicode_DATA(value);
    Py_ssize_t n = PyUnicode_GET_LENGTH(value);
    if (pathlike(kind, data, n))
        return 0;
    int digits = 0, letters = 0, hyphens = 0, scheme = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 ch = PyUnicode_READ(kind, data, i);
        unsigned f = flags(ch);
        if (f & DIGIT)
            digits = 1;
        else if (f & WORD && ch != '_')
            letters = 1;
        else if (ch == '-')
            hyphens++;
        else if (ch == ':' && i + 2 < n && PyUnicode_READ(kind, data, i + 1) == '/' &&
                 PyUnicode_READ(kind, data, i + 2) == '/')
            scheme = 1;
    }
    if (digits && letters)
        return scheme ? 1 : 0;
    if (letters || hyphens == 2)
        return 1;
    if (n == 0) {
        PyErr_SetString(PyExc_IndexError, "string index out of range");
        return -1;
    }
    return IS_CURRENCY(PyUnicode_READ(kind, data, 0)) || n >= 3 ? 2 : 3;
}

static PyObject *fact_rank(PyObject *module, PyObject *value) {
    (void)module;
    if (!PyUnicode_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "fact_rank() wants a str");
        return NULL;
    }
    long rank = rank_of(value);
    return rank < 0 ? NULL : PyLong_FromLong(rank);
}

/* ranked(distinct) -> [(rank, position, fact)] for the facts of at least two characters of a
   dict fact -> quoted (facts._ranked_facts after facts._distinct). */
static PyObject *ranked(PyObject *module, PyObject *distinct) {
    (void)module;
    if (!PyDict_CheckExact(distinct)) {
        PyErr_SetString(PyExc_TypeError, "ranked() wants a dict");
        return NULL;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    Py_ssize_t at = 0, pos = 0;
    PyObject *key, *quoted;
    Py_INCREF(distinct); /* PyObject_IsTrue may run code; the dict must outlive the loop */
    while (PyDict_Next(distinct, &at, &key, &quoted)) {
        Py_ssize_t here = pos++;
        if (!PyUnicode_Check(key)) {
            PyErr_SetString(PyExc_TypeError, "ranked() wants str facts");
            goto fail;
        }
        if (PyUnicode_GET_LENGTH(key) < MIN_FACT_LEN[0] - '0')
            continue;
        Py_INCREF(key);
        Py_INCREF(quoted);
        int is_quoted = PyObject_IsTrue(quoted);
        Py_DECREF(quoted);
        long rank = is_quoted < 0 ? -1 : is_quoted ? 0 : rank_of(key);
        PyObject *item = rank < 0 ? NULL : PyTuple_New(3);
        PyObject *r = item == NULL ? NULL : PyLong_FromLong(rank);
        PyObject *p = r == NULL ? NULL : PyLong_FromSsize_t(here);
        if (p == NULL) {
            Py_XDECREF(r);
            Py_XDECREF(item);
            Py_DECREF(key);
            goto fail;
        }
        PyTuple_SET_ITEM(item, 0, r);
        PyTuple_SET_ITEM(item, 1, p);
        PyTuple_SET_ITEM(item, 2, key); /* steals the reference taken above */
        int failed = PyList_Append(out, item);
        Py_DECREF(item);
        if (failed < 0)
            goto fail;
    }
    Py_DECREF(distinct);
    return out;
fail:
    Py_DECREF(distinct);
    Py_DECREF(out);
    return NULL;
}

/* quote_into(quoted, matches): facts._quote_into, each match's fact into the dict (backticked
   code as True, the rest stripped of PUNCT_EDGES as False unless already there). */
static int is_punct_edge(Py_UCS4 ch) {
    return ch < 128 && ch && strchr(PUNCT_EDGES, (int)ch) != NULL;
}

static PyObject *quote_into(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 2 || !PyDict_CheckExact(args[0]) || !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "quote_into() wants a dict and a list");
        return NULL;
    }
    PyObject *quoted = args[0], *matches = args[1];
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(matches); i++) {
        PyObject *v = PyList_GET_ITEM(matches, i);
        if (!PyUnicode_Check(v)) {
            PyErr_SetString(PyExc_TypeError, "quote_into() wants str matches");
            return NULL;
        }
        Py_ssize_t n = PyUnicode_GET_LENGTH(v);
        if (n == 0) {
            PyErr_SetString(PyExc_IndexError, "string index out of range");
            return NULL;
        }
        int kind = PyUnicode_KIND(v);
        const void *data = PyUnicode_DATA(v);
        PyObject *fact;
        if (PyUnicode_READ(kind, data, 0) == '`') {
            fact = PyUnicode_Substring(v, 1, n > 1 ? n - 1 : 1);
            if (fact == NULL || PyDict_SetItem(quoted, fact, Py_True) < 0) {
                Py_XDECREF(fact);
                return NULL;
            }
            Py_DECREF(fact);
            continue;
        }
        Py_ssize_t a = 0, b = n;
        while (a < b && is_punct_edge(PyUnicode_READ(kind, data, a)))
            a++;
        while (b > a && is_punct_edge(PyUnicode_READ(kind, data, b - 1)))
            b--;
        if (a == 0 && b == n) {
            fact = v;
            Py_INCREF(fact);
        } else if ((fact = PyUnicode_Substring(v, a, b)) == NULL)
            return NULL;
        PyObject *had = PyDict_SetDefault(quoted, fact, Py_False);
        Py_DECREF(fact);
        if (had == NULL)
            return NULL;
    }
    Py_RETURN_NONE;
}

/* ---- Line hits: relevance.line_hits after its pieces are cut and lowered ----

   line_hits(pieces, terms, weights) -> (scores, first_hit): `pieces` are (offset, lowered
   piece) pairs; each term's hits are looked for with str.find's own search, a line at a time
   (a term's other hits on a line are skipped), exactly as relevance.python_line_hits does, and
   the scores are summed in the same order (so the same floats). */

typedef struct {
    Py_ssize_t *at;
    Py_ssize_t len, cap;
} offsets;

/* -1 when out of memory (no exception set: this may run without the GIL; raw allocator). */
static int offsets_add(offsets *o, Py_ssize_t value) {
    if (o->len == o->cap) {
        Py_ssize_t cap = o->cap ? 2 * o->cap : 16;
        Py_ssize_t *grown = PyMem_RawRealloc(o->at, (size_t)cap * sizeof(Py_ssize_t));
        if (grown == NULL)
            return -1;
        o->at = grown;
        o->cap = cap;
    }
    o->at[o->len++] = value;
    return 0;
}

static int compare_offsets(const void *a, const void *b) {
    Py_ssize_t x = *(const Py_ssize_t *)a, y = *(const Py_ssize_t *)b;
    return (x > y) - (x < y);
}

/* Where the lines of `low` start: 0 and after each line break (str.split("\n")'s pieces). */
static int line_starts(PyObject *low, offsets *starts) {
    int kind = PyUnicode_KIND(low);
    const void *data = PyUnicode_DATA(low);
    Py_ssize_t n = PyUnicode_GET_LENGTH(low);
    int failed = offsets_add(starts, 0);
    for (Py_ssize_t i = 0; i < n && !failed; i++)
        if (PyUnicode_READ(kind, data, i) == '\n')
            failed = offsets_add(starts, i + 1);
    if (failed)
        PyErr_NoMemory();
    return failed;
}

/* bisect.bisect_right(starts, at) */
static Py_ssize_t bisect_right(const offsets *starts, Py_ssize_t at) {
    Py_ssize_t lo = 0, hi = starts->len;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (at < starts->at[mid])
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

static int set_first_hit(PyObject *first_hit, Py_ssize_t line, Py_ssize_t at) {
    PyObject *key = PyLong_FromSsize_t(line);
    PyObject *value = key == NULL ? NULL : PyLong_FromSsize_t(at);
    PyObject *had = value == NULL ? NULL : PyDict_SetDefault(first_hit, key, value);
    Py_XDECREF(key);
    Py_XDECREF(value);
    return had == NULL ? -1 : 0;
}

/* The terms of at least two characters by their first two (a bucket of a small hash table):
   one pass over a piece tries at each position only the terms that start with its two
   characters, instead of one str.find pass per term. */
enum { BUCKETS = 1024 };

typedef struct {
    Py_ssize_t *next; /* the next term of the same bucket, -1 at the end */
    Py_ssize_t head[BUCKETS];
} term_table;

static inline unsigned bucket_of(Py_UCS4 a, Py_UCS4 b) {
    return (unsigned)(a * 31u + b) & (BUCKETS - 1);
}

static int build_table(PyObject *const *terms, Py_ssize_t k, term_table *table) {
    table->next = PyMem_Calloc((size_t)(k ? k : 1), sizeof(Py_ssize_t));
    if (table->next == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (int i = 0; i < BUCKETS; i++)
        table->head[i] = -1;
    for (Py_ssize_t t = k - 1; t >= 0; t--) { /* each bucket lists its terms in order */
        PyObject *term = terms[t];
        table->next[t] = -1;
        if (PyUnicode_GET_LENGTH(term) < 2)
            continue;
        int kind = PyUnicode_KIND(term);
        const void *data = PyUnicode_DATA(term);
        unsigned h = bucket_of(PyUnicode_READ(kind, data, 0), PyUnicode_READ(kind, data, 1));
        table->next[t] = table->head[h];
        table->head[h] = t;
    }
    return 0;
}

/* Whether term occurs in low at p (p + len(term) <= n checked here). */
static inline int occurs_at(int kind, const void *data, Py_ssize_t n, Py_ssize_t p,
                            PyObject *term) {
    Py_ssize_t m = PyUnicode_GET_LENGTH(term);
    if (p + m > n)
        return 0;
    int tkind = PyUnicode_KIND(term);
    const void *tdata = PyUnicode_DATA(term);
    for (Py_ssize_t j = 2; j < m; j++)
        if (PyUnicode_READ(kind, data, p + j) != PyUnicode_READ(tkind, tdata, j))
            return 0;
    return 1;
}

typedef struct {
    offsets lines, at; /* one piece's first hit per line of one term: line start, position */
    Py_ssize_t last_line;
} term_hits;

/* A hit of a term at `at` on the line starting at `line` (of the piece), unless it has one
   there already: what str.find from each next line start finds. */
static inline int hit(term_hits *h, Py_ssize_t line_no, Py_ssize_t line, Py_ssize_t at) {
    if (h->last_line == line_no)
        return 0;
    h->last_line = line_no;
    return offsets_add(&h->lines, line) < 0 || offsets_add(&h->at, at) < 0 ? -1 : 0;
}

/* The first hits per line of the terms shorter than two characters, with str.find. */
static int short_term_hits(PyObject *low, PyObject *term, offsets *starts, term_hits *h) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(low);
    Py_ssize_t at = PyUnicode_Find(low, term, 0, n, 1);
    while (at >= 0) {
        if (starts->len == 0 && line_starts(low, starts) < 0)
            return -1;
        Py_ssize_t after = bisect_right(starts, at);
        if (hit(h, after, starts->at[after - 1], at) < 0) {
            PyErr_NoMemory();
            return -1;
        }
        at = after < starts->len ? PyUnicode_Find(low, term, starts->at[after], n, 1) : -1;
    }
    return at == -2 ? -1 : 0;
}

/* The terms' first hits per line in `low` at positions of the hash table's terms (two
   characters or more); reads only immutable strings and raw memory, so it runs without the
   GIL. Returns -1 when out of memory (no exception set). */
static int scan_piece(PyObject *low, Py_ssize_t offset, PyObject *const *terms,
                      const term_table *table, term_hits *found) {
    int kind = PyUnicode_KIND(low);
    const void *data = PyUnicode_DATA(low);
    Py_ssize_t n = PyUnicode_GET_LENGTH(low);
    Py_ssize_t line_no = 0, line = 0;
    Py_UCS4 b = n > 0 ? PyUnicode_READ(kind, data, 0) : 0;
    for (Py_ssize_t p = 0; p + 1 < n; p++) {
        Py_UCS4 a = b;
        b = PyUnicode_READ(kind, data, p + 1);
        for (Py_ssize_t t = table->head[bucket_of(a, b)]; t >= 0; t = table->next[t]) {
            PyObject *term = terms[t];
            int tkind = PyUnicode_KIND(term);
            const void *tdata = PyUnicode_DATA(term);
            if (found[t].last_line != line_no && PyUnicode_READ(tkind, tdata, 0) == a &&
                PyUnicode_READ(tkind, tdata, 1) == b && occurs_at(kind, data, n, p, term) &&
                hit(&found[t], line_no, offset + line, offset + p) < 0)
                return -1;
        }
        if (a == '\n') {
            line_no++;
            line = p + 1;
        }
    }
    return 0;
}

/* Pieces this long are scanned with the GIL released (~3 ns a character): a multi-megabyte
   tool output then holds it for no longer than a piece takes. */
enum { NOGIL_CHARS = 16384 };

/* The hits of the terms in one lowered piece, into each term's lines and into first_hit in
   the order relevance.python_line_hits puts them (term by term, each in text order). */
static int piece_hits(PyObject *piece, PyObject *const *terms, Py_ssize_t k,
                      const term_table *table, term_hits *found, offsets *lines,
                      PyObject *first_hit) {
    if (!PyTuple_Check(piece) || PyTuple_GET_SIZE(piece) != 2 ||
        !PyUnicode_Check(PyTuple_GET_ITEM(piece, 1))) {
        PyErr_SetString(PyExc_TypeError, "line_hits() wants (offset, str) pieces");
        return -1;
    }
    Py_ssize_t offset = PyNumber_AsSsize_t(PyTuple_GET_ITEM(piece, 0), PyExc_OverflowError);
    if (offset == -1 && PyErr_Occurred())
        return -1;
    PyObject *low = PyTuple_GET_ITEM(piece, 1);
    Py_INCREF(low); /* kept alive through the scan, whatever happens to `pieces` meanwhile */
    for (Py_ssize_t t = 0; t < k; t++) {
        found[t].lines.len = found[t].at.len = 0;
        found[t].last_line = -1;
    }
    offsets starts = {NULL, 0, 0};
    int failed = 0;
    for (Py_ssize_t t = 0; t < k && !failed; t++)
        if (PyUnicode_GET_LENGTH(terms[t]) < 2)
            failed = short_term_hits(low, terms[t], &starts, &found[t]) < 0;
    PyMem_RawFree(starts.at);
    if (!failed) {
        if (PyUnicode_GET_LENGTH(low) >= NOGIL_CHARS) {
            Py_BEGIN_ALLOW_THREADS
            failed = scan_piece(low, offset, terms, table, found);
            Py_END_ALLOW_THREADS
        } else
            failed = scan_piece(low, offset, terms, table, found);
        if (failed)
            PyErr_NoMemory();
    }
    Py_DECREF(low);
    for (Py_ssize_t t = 0; t < k && !failed; t++) {
        term_hits *h = &found[t];
        if (PyUnicode_GET_LENGTH(terms[t]) < 2) /* offsets of the piece */
            for (Py_ssize_t i = 0; i < h->lines.len; i++) {
                h->lines.at[i] += offset;
                h->at.at[i] += offset;
            }
        for (Py_ssize_t i = 0; i < h->lines.len && !failed; i++) {
            if (offsets_add(&lines[t], h->lines.at[i]) < 0) {
                PyErr_NoMemory();
                failed = 1;
            } else
                failed = set_first_hit(first_hit, h->lines.at[i], h->at.at[i]) < 0;
        }
    }
    return failed ? -1 : 0;
}

/* scores[line] += weight / (distinct lines of the term), term after term. */
static int add_scores(PyObject *scores, offsets *lines, double weight) {
    if (lines->len == 0)
        return 0;
    qsort(lines->at, (size_t)lines->len, sizeof(Py_ssize_t), compare_offsets);
    Py_ssize_t distinct = 1;
    for (Py_ssize_t i = 1; i < lines->len; i++)
        if (lines->at[i] != lines->at[distinct - 1])
            lines->at[distinct++] = lines->at[i];
    lines->len = distinct;
    double share = weight / (double)distinct;
    for (Py_ssize_t i = 0; i < distinct; i++) {
        PyObject *key = PyLong_FromSsize_t(lines->at[i]);
        if (key == NULL)
            return -1;
        PyObject *old = PyDict_GetItemWithError(scores, key);
        double before = 0.0;
        if (old != NULL)
            before = PyFloat_AS_DOUBLE(old); /* only floats are put in */
        else if (PyErr_Occurred()) {
            Py_DECREF(key);
            return -1;
        }
        PyObject *value = PyFloat_FromDouble(before + share);
        int failed = value == NULL ? -1 : PyDict_SetItem(scores, key, value);
        Py_XDECREF(value);
        Py_DECREF(key);
        if (failed < 0)
            return -1;
    }
    return 0;
}

static PyObject *line_hits(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 3 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[1]) ||
        !PyList_CheckExact(args[2]) || PyList_GET_SIZE(args[1]) != PyList_GET_SIZE(args[2])) {
        PyErr_SetString(PyExc_TypeError, "line_hits() wants lists of pieces, terms and weights");
        return NULL;
    }
    PyObject *pieces = args[0], *weights = args[2];
    /* The terms are held in an array of this call's own (the scan reads them without the GIL). */
    PyObject *tuple = PyList_AsTuple(args[1]);
    if (tuple == NULL)
        return NULL;
    Py_ssize_t k = PyTuple_GET_SIZE(tuple);
    PyObject *const *terms = &PyTuple_GET_ITEM(tuple, 0);
    for (Py_ssize_t t = 0; t < k; t++)
        if (!PyUnicode_Check(terms[t])) {
            PyErr_SetString(PyExc_TypeError, "line_hits() wants str terms");
            Py_DECREF(tuple);
            return NULL;
        }
    Py_INCREF(pieces);
    Py_INCREF(weights);
    PyObject *scores = PyDict_New(), *first_hit = PyDict_New(), *out = NULL;
    offsets *lines = PyMem_Calloc((size_t)(k ? k : 1), sizeof(offsets));
    term_hits *found = PyMem_Calloc((size_t)(k ? k : 1), sizeof(term_hits));
    term_table *table = PyMem_Calloc(1, sizeof(term_table));
    if (scores == NULL || first_hit == NULL || lines == NULL || found == NULL || table == NULL) {
        if (scores != NULL && first_hit != NULL)
            PyErr_NoMemory();
        goto done;
    }
    if (build_table(terms, k, table) < 0)
        goto done;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(pieces); i++)
        if (piece_hits(PyList_GET_ITEM(pieces, i), terms, k, table, found, lines, first_hit) < 0)
            goto done;
    for (Py_ssize_t t = 0; t < k; t++) {
        double weight = PyFloat_AsDouble(PyList_GET_ITEM(weights, t));
        if ((weight == -1.0 && PyErr_Occurred()) || add_scores(scores, &lines[t], weight) < 0)
            goto done;
    }
    out = PyTuple_Pack(2, scores, first_hit);
done:
    for (Py_ssize_t t = 0; t < k; t++) {
        if (lines != NULL)
            PyMem_RawFree(lines[t].at);
        if (found != NULL) {
            PyMem_RawFree(found[t].lines.at);
            PyMem_RawFree(found[t].at.at);
        }
    }
    PyMem_Free(lines);
    PyMem_Free(found);
    if (table != NULL)
        PyMem_Free(table->next);
    PyMem_Free(table);
    Py_XDECREF(scores);
    Py_XDECREF(first_hit);
    Py_DECREF(pieces);
    Py_DECREF(tuple);
    Py_DECREF(weights);
    return out;
}

/* relevant_lines(text, scores, first_hit, start, end, max_chars, width) -> list[str]:
   relevance.python_relevant_lines on a LineHits (its text, scores and first_hit): the lines
   starting in [start, end) heaviest first (ties in text order), each up to its line break
   (at most 4 * width on), stripped, the part around its first hit if longer than width,
   taken while they fit max_chars (a repeat of a body taken is skipped), back in text order. */
typedef struct {
    Py_ssize_t line;
    double score;
    PyObject *body; /* the line's body once taken (a new reference), else NULL */
} scored_line;

static int heaviest_first(const void *a, const void *b) {
    const scored_line *x = a, *y = b;
    if (x->score != y->score)
        return x->score < y->score ? 1 : -1;
    return (x->line > y->line) - (x->line < y->line);
}

static int by_line(const void *a, const void *b) {
    const scored_line *x = a, *y = b;
    return (x->line > y->line) - (x->line < y->line);
}

/* text[lo:hi].strip() (a slice past the end is cut at it, as in Python). */
static PyObject *stripped(PyObject *text, Py_ssize_t lo, Py_ssize_t hi) {
    PyObject *part = PyUnicode_Substring(text, lo, hi < lo ? lo : hi);
    if (part == NULL)
        return NULL;
    PyObject *body = PyObject_CallMethod(part, "strip", NULL);
    Py_DECREF(part);
    return body;
}

static PyObject *relevant_lines(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 7 || !PyUnicode_Check(args[0]) || !PyDict_CheckExact(args[1]) ||
        !PyDict_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError,
                        "relevant_lines() wants a str, two dicts and four ints");
        return NULL;
    }
    PyObject *text = args[0], *scores = args[1], *first_hit = args[2];
    Py_ssize_t bounds[4];
    for (int k = 0; k < 4; k++) {
        bounds[k] = PyLong_AsSsize_t(args[3 + k]);
        if (bounds[k] == -1 && PyErr_Occurred())
            return NULL;
    }
    Py_ssize_t start = bounds[0], end = bounds[1], max_chars = bounds[2], width = bounds[3];
    Py_ssize_t n = 0, key_pos = 0, used = 0;
    PyObject *key, *value, *seen = NULL, *out = NULL;
    scored_line *inside = PyMem_Calloc((size_t)(PyDict_GET_SIZE(scores) + 1), sizeof(scored_line));
    if (inside == NULL)
        return PyErr_NoMemory();
    while (PyDict_Next(scores, &key_pos, &key, &value)) {
        Py_ssize_t line = PyLong_AsSsize_t(key);
        double score = PyFloat_AsDouble(value);
        if ((line == -1 || score == -1.0) && PyErr_Occurred())
            goto done;
        if (start <= line && line < end) {
            inside[n].line = line;
            inside[n++].score = score;
        }
    }
    qsort(inside, (size_t)n, sizeof(scored_line), heaviest_first);
    if ((seen = PySet_New(NULL)) == NULL)
        goto done;
    for (Py_ssize_t k = 0; k < n && used < max_chars - 1; k++) {
        Py_ssize_t line = inside[k].line;
        Py_ssize_t limit = end < line + 4 * width ? end : line + 4 * width;
        Py_ssize_t stop = PyUnicode_FindChar(text, '\n', line, limit, 1);
        if (stop == -2)
            goto done;
        PyObject *body = stripped(text, line, stop < 0 ? limit : stop);
        if (body != NULL && PyUnicode_GET_LENGTH(body) > width) {
            Py_DECREF(body);
            PyObject *where = PyLong_FromSsize_t(line);
            PyObject *at = where == NULL ? NULL : PyDict_GetItemWithError(first_hit, where);
            Py_XDECREF(where);
            Py_ssize_t hit = at == NULL ? -1 : PyLong_AsSsize_t(at);
            if (at == NULL && !PyErr_Occurred())
                PyErr_SetString(PyExc_KeyError, "relevant_lines(): a line without a first hit");
            if (PyErr_Occurred())
                goto done;
            Py_ssize_t lo = hit - line - width / 3 > 0 ? hit - line - width / 3 : 0;
            body = stripped(text, line + lo, line + lo + width);
        }
        if (body == NULL)
            goto done;
        Py_ssize_t size = PyUnicode_GET_LENGTH(body);
        int known = size ? PySet_Contains(seen, body) : 1;
        if (known == 0 && used + size + 1 <= max_chars) {
            if (PySet_Add(seen, body) < 0)
                known = -1;
            inside[k].body = body;
            used += size + 1;
        } else {
            Py_DECREF(body);
        }
        if (known < 0)
            goto done;
    }
    /* The lines taken, back in text order. */
    Py_ssize_t kept = 0;
    for (Py_ssize_t k = 0; k < n; k++)
        if (inside[k].body != NULL)
            inside[kept++] = inside[k];
    n = kept;
    qsort(inside, (size_t)n, sizeof(scored_line), by_line);
    if ((out = PyList_New(n)) == NULL)
        goto done;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyList_SET_ITEM(out, k, inside[k].body);
        inside[k].body = NULL;
    }
done:
    for (Py_ssize_t k = 0; k < n; k++)
        Py_XDECREF(inside[k].body);
    PyMem_Free(inside);
    Py_XDECREF(seen);
    return out;
}

/* ---- text_index / occurs: whether many strs occur in one text (`needle in text`) ----

   A stub asks, for each of hundreds of candidate facts, whether the text of the messages every
   rung keeps holds it. text_index(text) indexes that text once by its character pairs: for each
   bucket of pairs, the positions (ascending) where such a pair starts. occurs(index, needle)
   then reads the needle's pairs, takes the one whose bucket is smallest and compares the needle
   only at the positions that bucket gives. A needle shorter than two characters, or one whose
   smallest bucket would cost more than a plain search, is answered by PyUnicode_Find, as is
   `in`. Answers are `needle in text`'s for any str kinds: a needle of a wider kind than the
   text holds a character the text cannot hold (strs are canonical), so it does not occur. */

static const char INDEX_CAPSULE[] = "proxy.providers._factscan.text_index";

typedef uint32_t ix_pos; /* a text of 2**32 characters or more is not indexed (searched) */

typedef struct {
    PyObject *text;  /* a strong reference: the index reads its data */
    Py_ssize_t mask; /* buckets - 1 (a power of two) */
    ix_pos *start;   /* buckets + 1 offsets into pos; NULL: not indexed */
    ix_pos *pos;     /* the starts of the text's pairs, grouped by bucket, ascending in each */
} text_index_t;

static inline Py_ssize_t pair_bucket(Py_UCS4 a, Py_UCS4 b, Py_ssize_t mask) {
    return (Py_ssize_t)((a * 0x9E3779B1u) ^ (b * 0x85EBCA77u) ^ ((a ^ b) >> 7)) & mask;
}

static void index_release(text_index_t *ix) {
    Py_XDECREF(ix->text);
    PyMem_Free(ix->start);
    PyMem_Free(ix->pos);
    PyMem_Free(ix);
}

static void index_free(PyObject *capsule) {
    text_index_t *ix = PyCapsule_GetPointer(capsule, INDEX_CAPSULE);
    if (ix != NULL)
        index_release(ix);
}

/* A counting sort of the text's pairs into buckets (touches only the immutable text and the
   index's own memory: run without the GIL for a long text). */
static void sort_pairs(text_index_t *ix, ix_pos *fill, Py_ssize_t buckets, Py_ssize_t pairs) {
    int kind = PyUnicode_KIND(ix->text);
    const void *data = PyUnicode_DATA(ix->text);
    for (Py_ssize_t p = 0; p < pairs; p++) {
        Py_UCS4 a = PyUnicode_READ(kind, data, p), b = PyUnicode_READ(kind, data, p + 1);
        ix->start[pair_bucket(a, b, ix->mask) + 1]++;
    }
    for (Py_ssize_t h = 0; h < buckets; h++)
        ix->start[h + 1] += ix->start[h];
    memcpy(fill, ix->start, (size_t)buckets * sizeof(ix_pos));
    for (Py_ssize_t p = 0; p < pairs; p++) {
        Py_UCS4 a = PyUnicode_READ(kind, data, p), b = PyUnicode_READ(kind, data, p + 1);
        ix->pos[fill[pair_bucket(a, b, ix->mask)]++] = (ix_pos)p;
    }
}

static PyObject *text_index(PyObject *module, PyObject *text) {
    if (!PyUnicode_Check(text)) {
        PyErr_Format(PyExc_TypeError, "text_index() argument must be str, not %.200s",
                     Py_TYPE(text)->tp_name);
        return NULL;
    }
    text_index_t *ix = PyMem_Calloc(1, sizeof(text_index_t));
    if (ix == NULL)
        return PyErr_NoMemory();
    Py_INCREF(text);
    ix->text = text;
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    Py_ssize_t pairs = n > 1 ? n - 1 : 0;
    Py_ssize_t buckets = 64; /* about two pairs a bucket, at most 65536 buckets */
    while (buckets * 2 < pairs && buckets < ((Py_ssize_t)1 << 16))
        buckets <<= 1;
    ix->mask = buckets - 1;
    if ((uint64_t)n < ((uint64_t)1 << 32)) {
        ix->start = PyMem_Calloc((size_t)buckets + 1, sizeof(ix_pos));
        ix->pos = PyMem_Malloc((size_t)(pairs ? pairs : 1) * sizeof(ix_pos));
        ix_pos *fill = PyMem_Malloc((size_t)buckets * sizeof(ix_pos));
        if (ix->start == NULL || ix->pos == NULL || fill == NULL) {
            PyMem_Free(fill);
            index_release(ix);
            return PyErr_NoMemory();
        }
        if (pairs >= (1 << 16)) {
            Py_BEGIN_ALLOW_THREADS
            sort_pairs(ix, fill, buckets, pairs);
            Py_END_ALLOW_THREADS
        } else {
            sort_pairs(ix, fill, buckets, pairs);
        }
        PyMem_Free(fill);
    }
    PyObject *capsule = PyCapsule_New(ix, INDEX_CAPSULE, index_free);
    if (capsule == NULL)
        index_release(ix);
    return capsule;
}

/* Whether needle (of a kind no wider than the text's) is text[s : s + m]. */
static inline int same_at(int kind, const void *data, Py_ssize_t s, int nkind,
                          const void *ndata, Py_ssize_t m) {
    if (kind == nkind)
        return memcmp((const char *)data + s * kind, ndata, (size_t)(m * kind)) == 0;
    for (Py_ssize_t j = 0; j < m; j++)
        if (PyUnicode_READ(kind, data, s + j) != PyUnicode_READ(nkind, ndata, j))
            return 0;
    return 1;
}

/* `needle in text` by str.find's search. */
static PyObject *found_by_search(PyObject *text, PyObject *needle) {
    Py_ssize_t at = PyUnicode_Find(text, needle, 0, PyUnicode_GET_LENGTH(text), 1);
    return at == -2 ? NULL : PyBool_FromLong(at >= 0);
}

static PyObject *occurs(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "occurs() takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    text_index_t *ix = PyCapsule_GetPointer(args[0], INDEX_CAPSULE);
    if (ix == NULL)
        return NULL;
    PyObject *needle = args[1];
    if (!PyUnicode_Check(needle)) {
        PyErr_Format(PyExc_TypeError, "'in <string>' requires string as left operand, not %.100s",
                     Py_TYPE(needle)->tp_name);
        return NULL;
    }
    PyObject *text = ix->text;
    Py_ssize_t n = PyUnicode_GET_LENGTH(text), m = PyUnicode_GET_LENGTH(needle);
    int kind = PyUnicode_KIND(text), nkind = PyUnicode_KIND(needle);
    if (m > n || nkind > kind)
        Py_RETURN_FALSE;
    if (m < 2 || ix->start == NULL) {
        return found_by_search(text, needle);
    }
    const void *data = PyUnicode_DATA(text), *ndata = PyUnicode_DATA(needle);
    Py_ssize_t best = 0, best_count = PY_SSIZE_T_MAX, best_bucket = 0;
    for (Py_ssize_t j = 0; j + 1 < m; j++) {
        Py_ssize_t h = pair_bucket(PyUnicode_READ(nkind, ndata, j),
                                   PyUnicode_READ(nkind, ndata, j + 1), ix->mask);
        Py_ssize_t count = ix->start[h + 1] - ix->start[h];
        if (count < best_count) {
            best = j, best_count = count, best_bucket = h;
            if (count == 0)
                Py_RETURN_FALSE;
        }
    }
    if (best_count > 8 && best_count > n / m) { /* comparing there costs more than a search */
        return found_by_search(text, needle);
    }
    const ix_pos *p = ix->pos + ix->start[best_bucket], *end = p + best_count;
    for (; p < end; p++) {
        Py_ssize_t s = (Py_ssize_t)*p - best;
        if (s < 0)
            continue;
        if (s + m > n)
            break; /* positions ascend */
        if (same_at(kind, data, s, nkind, ndata, m))
            Py_RETURN_TRUE;
    }
    Py_RETURN_FALSE;
}

/* salient(groups, max_chars, structural, shapes, fact_shape) -> str: facts.pack_salient once
   `structural` is known: the unique facts of the groups of (rank, fact) pairs ranked (at most
   STRUCTURAL_KEEP of each structural shape, at STRUCTURAL_RANK; within a rank, what more of
   the groups mention first), packed into max_chars like facts.pack_ranked, the facts a longer
   chosen one contains left out (facts._without_contained), joined by ", ". `shapes` memoizes
   `fact_shape` (called only when `structural` is not empty), as the Python version does. */
static const char SALIENT[] = "9,2,3"; /* _STRUCTURAL_RANK, _STRUCTURAL_KEEP, _MENTION_TIERS */
enum { STRUCTURAL_RANK = 9, STRUCTURAL_KEEP = 2, MENTION_TIERS = 3 };

typedef struct {
    PyObject *fact; /* borrowed from the groups, which the call holds */
    long long rank;
    Py_ssize_t pos;
    Py_ssize_t mentions;
} salient_entry;

static salient_entry *salient_entries; /* sorted by salient_order */

static int salient_order(const void *a, const void *b) {
    const salient_entry *x = &salient_entries[*(const Py_ssize_t *)a];
    const salient_entry *y = &salient_entries[*(const Py_ssize_t *)b];
    if (x->rank != y->rank)
        return x->rank < y->rank ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

static int by_position(const void *a, const void *b) {
    Py_ssize_t x = *(const Py_ssize_t *)a, y = *(const Py_ssize_t *)b;
    return x < y ? -1 : x > y;
}

static int ends_with(PyObject *s, const char *tail) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(s), k = (Py_ssize_t)strlen(tail);
    if (n < k)
        return 0;
    for (Py_ssize_t j = 0; j < k; j++)
        if (PyUnicode_READ_CHAR(s, n - k + j) != (Py_UCS4)(unsigned char)tail[j])
            return 0;
    return 1;
}

/* facts._without_contained of `facts` (a list of str): a new list. */
static PyObject *without_contained(PyObject *facts) {
    Py_ssize_t n = PyList_GET_SIZE(facts);
    PyObject *owners = PySet_New(NULL), *longer = PyList_New(0), *out = NULL;
    if (owners == NULL || longer == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *f = PyList_GET_ITEM(facts, i);
        Py_ssize_t len = PyUnicode_GET_LENGTH(f);
        if ((PyUnicode_FindChar(f, ' ', 0, len, 1) >= 0 ||
             PyUnicode_FindChar(f, ',', 0, len, 1) >= 0) &&
            PyList_Append(longer, f) < 0)
            goto done;
        for (int cut = 2; cut >= 1; cut--) {
            int owner = cut == 2 ? ends_with(f, "'s") || ends_with(f, "es")
                                 : (ends_with(f, "s") || ends_with(f, "?")) && len > 2;
            if (!owner)
                continue;
            PyObject *stem = PyUnicode_Substring(f, 0, len - cut);
            int failed = stem == NULL || PySet_Add(owners, stem) < 0;
            Py_XDECREF(stem);
            if (failed)
                goto done;
        }
    }
    if (PyList_GET_SIZE(longer) == 0 && PySet_GET_SIZE(owners) == 0) {
        out = PyList_GetSlice(facts, 0, n);
        goto done;
    }
    out = PyList_New(0);
    if (out == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *f = PyList_GET_ITEM(facts, i);
        int drop = PySet_Contains(owners, f);
        for (Py_ssize_t j = 0; drop == 0 && j < PyList_GET_SIZE(longer); j++) {
            PyObject *g = PyList_GET_ITEM(longer, j);
            int same = PyUnicode_Compare(f, g);
            if (same == -1 && PyErr_Occurred())
                drop = -1;
            else if (same != 0)
                drop = PyUnicode_Contains(g, f);
        }
        if (drop < 0 || (drop == 0 && PyList_Append(out, f) < 0)) {
            Py_CLEAR(out);
            goto done;
        }
    }
done:
    Py_XDECREF(owners);
    Py_XDECREF(longer);
    return out;
}

static PyObject *salient(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 5 || !PyDict_CheckExact(args[3]) || !PyLong_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError,
                        "salient() wants groups, max_chars, structural, shapes, fact_shape");
        return NULL;
    }
    Py_ssize_t max_chars = PyLong_AsSsize_t(args[1]);
    if (max_chars == -1 && PyErr_Occurred())
        return NULL;
    PyObject *structural = args[2], *shapes = args[3], *shape_of = args[4];
    int any_structural = PyObject_IsTrue(structural);
    if (any_structural < 0)
        return NULL;
    PyObject *groups = PySequence_Fast(args[0], "salient() wants a sequence of groups");
    if (groups == NULL)
        return NULL;
    PyObject *index = PyDict_New(), *kept = PyDict_New(), *held = PyList_New(0);
    PyObject *chosen = NULL, *result = NULL;
    salient_entry *entries = NULL;
    Py_ssize_t *order = NULL, count = 0, size = 0, pos = 0;
    if (index == NULL || kept == NULL || held == NULL)
        goto fail;
    for (Py_ssize_t g = 0; g < PySequence_Fast_GET_SIZE(groups); g++) {
        PyObject *group = PySequence_Fast(PySequence_Fast_GET_ITEM(groups, g),
                                          "salient() wants sequences of (rank, fact)");
        if (group == NULL || PyList_Append(held, group) < 0) {
            Py_XDECREF(group);
            goto fail;
        }
        Py_DECREF(group); /* `held` keeps it (and its items) alive */
        for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(group); k++) {
            PyObject *item = PySequence_Fast_GET_ITEM(group, k);
            if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2 ||
                !PyLong_Check(PyTuple_GET_ITEM(item, 0)) ||
                !PyUnicode_Check(PyTuple_GET_ITEM(item, 1))) {
                PyErr_SetString(PyExc_TypeError, "salient() wants (int, str) pairs");
                goto fail;
            }
            PyObject *fact = PyTuple_GET_ITEM(item, 1);
            pos++;
            PyObject *at = PyDict_GetItemWithError(index, fact);
            if (at != NULL) {
                entries[PyLong_AsSsize_t(at)].mentions++;
                continue;
            }
            if (PyErr_Occurred())
                goto fail;
            long long rank = PyLong_AsLongLong(PyTuple_GET_ITEM(item, 0));
            if (rank == -1 && PyErr_Occurred())
                goto fail;
            if (any_structural) {
                PyObject *shape = PyDict_GetItemWithError(shapes, fact);
                if (shape == NULL) {
                    if (PyErr_Occurred())
                        goto fail;
                    shape = PyObject_CallOneArg(shape_of, fact);
                    if (shape == NULL)
                        goto fail;
                    int failed = PyDict_SetItem(shapes, fact, shape);
                    Py_DECREF(shape);
                    if (failed < 0)
                        goto fail;
                    shape = PyDict_GetItemWithError(shapes, fact);
                    if (shape == NULL)
                        goto fail;
                }
                Py_INCREF(shape);
                int is = PySequence_Contains(structural, shape);
                if (is > 0) {
                    PyObject *had = PyDict_GetItemWithError(kept, shape);
                    Py_ssize_t times = had == NULL ? 0 : PyLong_AsSsize_t(had);
                    PyObject *now = NULL;
                    if ((had == NULL && PyErr_Occurred()) || times == -1 ||
                        times >= STRUCTURAL_KEEP || (now = PyLong_FromSsize_t(times + 1)) == NULL ||
                        PyDict_SetItem(kept, shape, now) < 0) {
                        Py_XDECREF(now);
                        Py_DECREF(shape);
                        if (PyErr_Occurred())
                            goto fail;
                        continue; /* enough of this shape listed */
                    }
                    Py_DECREF(now);
                    rank = STRUCTURAL_RANK;
                }
                Py_DECREF(shape);
                if (is < 0)
                    goto fail;
            }
            if (count == size) {
                size = size ? 2 * size : 64;
                salient_entry *grown = PyMem_Realloc(entries, (size_t)size * sizeof *entries);
                if (grown == NULL) {
                    PyErr_NoMemory();
                    goto fail;
                }
                entries = grown;
            }
            PyObject *number = PyLong_FromSsize_t(count);
            int failed = number == NULL || PyDict_SetItem(index, fact, number) < 0;
            Py_XDECREF(number);
            if (failed)
                goto fail;
            entries[count++] = (salient_entry){fact, rank, pos, 1};
        }
    }
    order = PyMem_Malloc((size_t)(count ? count : 1) * sizeof *order);
    if (order == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        salient_entry *e = &entries[i];
        Py_ssize_t m = e->mentions < MENTION_TIERS ? e->mentions : MENTION_TIERS;
        e->rank = e->rank * MENTION_TIERS + MENTION_TIERS - m;
        order[i] = i;
    }
    salient_entries = entries; /* the GIL is held: no other call sorts meanwhile */
    qsort(order, (size_t)count, sizeof *order, salient_order);
    /* facts.pack_ranked with sep ", " */
    Py_ssize_t used = 0, floor = max_chars - 2, taken = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (used > floor)
            break;
        Py_ssize_t cost = PyUnicode_GET_LENGTH(entries[order[i]].fact) + 2;
        if (used + cost > max_chars)
            continue;
        order[taken++] = order[i]; /* entries are numbered in position order */
        used += cost;
    }
    qsort(order, (size_t)taken, sizeof *order, by_position);
    chosen = PyList_New(taken);
    if (chosen == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < taken; i++) {
        PyObject *fact = entries[order[i]].fact;
        Py_INCREF(fact);
        PyList_SET_ITEM(chosen, i, fact);
    }
    PyObject *listed = without_contained(chosen);
    if (listed != NULL) {
        PyObject *sep = PyUnicode_FromString(", ");
        result = sep == NULL ? NULL : PyUnicode_Join(sep, listed);
        Py_XDECREF(sep);
        Py_DECREF(listed);
    }
fail:
    Py_XDECREF(chosen);
    PyMem_Free(order);
    PyMem_Free(entries);
    Py_XDECREF(index);
    Py_XDECREF(kept);
    Py_XDECREF(held);
    Py_DECREF(groups);
    return result;
}

/* term_set(text) -> (set, int): the set of relevance.terms(text) and how many there are, for
   an ASCII text (the terms added in order, as set() adds a list's items: the same set); None
   for any other text (relevance.py then splits it itself). TERM_SEPARATORS is the separator
   characters relevance.py blanks; ASCII whitespace (str.split's) separates terms too. */
static const char TERM_SEPARATORS[] = "\t\n\r\"'`()[]{}<>,;:=|!?*#&^%$+~\\/.@";
static unsigned char term_char[128];

static void init_terms(void) {
    for (int ch = 0; ch < 128; ch++)
        term_char[ch] = !(ch && strchr(TERM_SEPARATORS, ch)) && !Py_UNICODE_ISSPACE(ch);
}

/* The terms of the ASCII str `text` added to the set `found` in order; how many there are
   (repeats included), or -1 on an error. A term already added by this call is not made into
   a str again: an output repeats its identifiers, and adding an element a set holds changes
   nothing, so the set is the one adding every occurrence makes (the first occurrences in the
   same order). Seen terms are kept in an open-addressed table of (start, length) in `text`,
   hashed by FNV-1a of the lowered bytes. */
typedef struct {
    Py_ssize_t start, len;
    uint32_t hash;
} seen_term;

static inline unsigned char lowered(unsigned char ch) {
    return ch >= 'A' && ch <= 'Z' ? (unsigned char)(ch + 32) : ch;
}

static Py_ssize_t add_terms(PyObject *found, PyObject *text) {
    const unsigned char *data = PyUnicode_1BYTE_DATA(text);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text), count = 0;
    /* At most (n + 1) / 2 distinct terms: a table of at least twice that stays half empty. */
    size_t size = 64;
    while (size < (size_t)n + 2)
        size <<= 1;
    seen_term local[64];
    seen_term *table = size <= 64 ? local : PyMem_Malloc(size * sizeof(seen_term));
    if (table == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t k = 0; k < size; k++)
        table[k].len = 0;
    size_t mask = size - 1;
    for (Py_ssize_t at = 0; at < n;) {
        if (!term_char[data[at]]) {
            at++;
            continue;
        }
        Py_ssize_t end = at;
        uint32_t hash = 2166136261u;
        while (end < n && term_char[data[end]]) {
            hash = (hash ^ lowered(data[end])) * 16777619u;
            end++;
        }
        Py_ssize_t len = end - at;
        count++;
        size_t slot = hash & mask;
        int seen = 0;
        while (table[slot].len) {
            const seen_term *e = &table[slot];
            if (e->hash == hash && e->len == len) {
                Py_ssize_t k = 0;
                while (k < len && lowered(data[e->start + k]) == lowered(data[at + k]))
                    k++;
                if (k == len) {
                    seen = 1;
                    break;
                }
            }
            slot = (slot + 1) & mask;
        }
        if (!seen) {
            table[slot].start = at;
            table[slot].len = len;
            table[slot].hash = hash;
            PyObject *term = PyUnicode_New(len, 127);
            if (term == NULL)
                goto error;
            Py_UCS1 *out = PyUnicode_1BYTE_DATA(term);
            for (Py_ssize_t k = 0; k < len; k++)
                out[k] = lowered(data[at + k]);
            int failed = PySet_Add(found, term);
            Py_DECREF(term);
            if (failed < 0)
                goto error;
        }
        at = end;
    }
    if (table != local)
        PyMem_Free(table);
    return count;
error:
    if (table != local)
        PyMem_Free(table);
    return -1;
}

/* terms_into(found, text) -> int | None: found.update(relevance.terms(text)) for an ASCII
   text (the terms added in order, as update() adds a list's items: the same set), and how
   many terms there are; None, `found` untouched, for any other text. */
static PyObject *terms_into(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 2 || !PySet_CheckExact(args[0]) || !PyUnicode_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "terms_into() wants a set and a str");
        return NULL;
    }
    if (!PyUnicode_IS_ASCII(args[1]))
        Py_RETURN_NONE;
    Py_ssize_t count = add_terms(args[0], args[1]);
    return count < 0 ? NULL : PyLong_FromSsize_t(count);
}

static PyObject *term_set(PyObject *module, PyObject *text) {
    PyObject *found = PySet_New(NULL);
    if (found == NULL)
        return NULL;
    PyObject *const args[2] = {found, text};
    PyObject *count = terms_into(module, args, 2);
    if (count == NULL || count == Py_None) {
        Py_DECREF(found);
        return count;
    }
    return Py_BuildValue("(NN)", found, count);
}

/* plain(value) -> bool: canonical._plain (whether orjson writes `value` as canonical_json
   does: str, bool, None, ints of at most 64 bits, lists and str-keyed dicts of those; exact
   types only). */
static int is_plain(PyObject *value) {
    if (PyUnicode_CheckExact(value) || PyBool_Check(value) || value == Py_None)
        return 1;
    if (PyLong_CheckExact(value)) {
        int overflow;
        long long small = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (small == -1 && PyErr_Occurred())
            return -1;
        if (overflow == 0)
            return 1;
        if (overflow < 0)
            return 0; /* below -2**63 */
        (void)PyLong_AsUnsignedLongLong(value);
        if (PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_OverflowError))
                return -1;
            PyErr_Clear();
            return 0;
        }
        return 1;
    }
    int dict = PyDict_CheckExact(value);
    if (!dict && !PyList_CheckExact(value))
        return 0;
    if (Py_EnterRecursiveCall(" in plain()"))
        return -1;
    int found = 1;
    if (dict) {
        Py_ssize_t at = 0;
        PyObject *key, *item;
        while (found == 1 && PyDict_Next(value, &at, &key, &item))
            found = PyUnicode_CheckExact(key) ? is_plain(item) : 0;
    } else {
        for (Py_ssize_t i = 0; found == 1 && i < PyList_GET_SIZE(value); i++)
            found = is_plain(PyList_GET_ITEM(value, i));
    }
    Py_LeaveRecursiveCall();
    return found;
}

static PyObject *plain(PyObject *module, PyObject *value) {
    (void)module;
    int found = is_plain(value);
    if (found < 0)
        return NULL;
    return PyBool_FromLong(found);
}

/* shape_counts(group, shapes, fact_shape) -> dict: facts.shape_counts(group, shapes), an ASCII
   fact's shape (lowered, digit runs as 0: facts.fact_shape) made here, any other's by
   `fact_shape`; each shape remembered in `shapes` as the Python version does. */
static PyObject *ascii_shape(PyObject *fact) {
    const unsigned char *data = PyUnicode_1BYTE_DATA(fact);
    Py_ssize_t n = PyUnicode_GET_LENGTH(fact), size = 0;
    for (Py_ssize_t k = 0; k < n; k++)
        size += !(data[k] >= '0' && data[k] <= '9' && k > 0 && data[k - 1] >= '0' &&
                  data[k - 1] <= '9');
    PyObject *shape = PyUnicode_New(size, 127);
    if (shape == NULL)
        return NULL;
    Py_UCS1 *out = PyUnicode_1BYTE_DATA(shape);
    Py_ssize_t at = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        unsigned char ch = data[k];
        if (ch >= '0' && ch <= '9') {
            if (k == 0 || !(data[k - 1] >= '0' && data[k - 1] <= '9'))
                out[at++] = '0';
        } else {
            out[at++] = ch >= 'A' && ch <= 'Z' ? (Py_UCS1)(ch + 32) : ch;
        }
    }
    return shape;
}

static PyObject *shape_counts(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 3 || !PyDict_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "shape_counts() wants group, shapes, fact_shape");
        return NULL;
    }
    PyObject *group = PySequence_Fast(args[0], "shape_counts() wants a sequence of pairs");
    if (group == NULL)
        return NULL;
    PyObject *shapes = args[1], *out = PyDict_New();
    if (out == NULL)
        goto fail;
    for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(group); k++) {
        PyObject *item = PySequence_Fast_GET_ITEM(group, k);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2 ||
            !PyUnicode_Check(PyTuple_GET_ITEM(item, 1))) {
            PyErr_SetString(PyExc_TypeError, "shape_counts() wants (rank, str) pairs");
            goto fail;
        }
        PyObject *fact = PyTuple_GET_ITEM(item, 1);
        PyObject *shape = PyDict_GetItemWithError(shapes, fact);
        if (shape != NULL) {
            Py_INCREF(shape);
        } else {
            if (PyErr_Occurred())
                goto fail;
            shape = PyUnicode_IS_ASCII(fact) ? ascii_shape(fact)
                                             : PyObject_CallOneArg(args[2], fact);
            if (shape == NULL)
                goto fail;
            if (PyDict_SetItem(shapes, fact, shape) < 0) {
                Py_DECREF(shape);
                goto fail;
            }
        }
        if (!PyUnicode_Check(shape)) {
            Py_DECREF(shape);
            PyErr_SetString(PyExc_TypeError, "shape_counts() wants str shapes");
            goto fail;
        }
        int tagged = PyUnicode_FindChar(shape, '0', 0, PyUnicode_GET_LENGTH(shape), 1) >= 0;
        PyObject *values = NULL;
        if (tagged > 0) {
            values = PyDict_GetItemWithError(out, shape);
            if (values == NULL && !PyErr_Occurred()) {
                values = PySet_New(NULL);
                if (values != NULL && PyDict_SetItem(out, shape, values) < 0)
                    Py_CLEAR(values);
                Py_XDECREF(values); /* `out` holds it */
            }
            if (values == NULL || PySet_Add(values, fact) < 0)
                tagged = -1;
        }
        Py_DECREF(shape);
        if (tagged < 0)
            goto fail;
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    Py_DECREF(group);
    return out;
}

/* unshown(found, shown, occurs) -> list: facts.python_unshown, the (rank, fact) pairs of
   `found` whose fact `occurs` says is not in the text every rung keeps, each fact's answer
   remembered in `shown`. */
static PyObject *unshown(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 3 || !PyList_CheckExact(args[0]) || !PyDict_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "unshown() wants a list, a dict and occurs");
        return NULL;
    }
    PyObject *found = args[0], *shown = args[1], *occurs = args[2];
    PyObject *kept = PyList_New(0);
    if (kept == NULL)
        return NULL;
    Py_INCREF(found); /* `occurs` may run code; the list must outlive the loop */
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(found); k++) {
        PyObject *item = PyList_GET_ITEM(found, k);
        Py_INCREF(item);
        PyObject *fact = PySequence_GetItem(item, 1);
        PyObject *hit = fact == NULL ? NULL : PyDict_GetItemWithError(shown, fact);
        int failed = fact == NULL || (hit == NULL && PyErr_Occurred());
        if (!failed && hit == NULL) {
            hit = PyObject_CallOneArg(occurs, fact);
            failed = hit == NULL || PyDict_SetItem(shown, fact, hit) < 0;
            Py_XDECREF(hit); /* `shown` holds it (or the call failed) */
        }
        int is = failed ? -1 : PyObject_IsTrue(hit);
        if (is == 0 && PyList_Append(kept, item) < 0)
            is = -1;
        Py_XDECREF(fact);
        Py_DECREF(item);
        if (is < 0) {
            Py_DECREF(found);
            Py_DECREF(kept);
            return NULL;
        }
    }
    Py_DECREF(found);
    return kept;
}

/* json_items(value, id_like) -> dict: facts.python_json_items(value). `id_like` is
   facts._id_like, asked only about strings that are not ASCII: of an ASCII one it is decided
   here (a JSON output's keys and values are ASCII ids, codes and numbers nearly always). */
static int ascii_id_like(PyObject *text) {
    const unsigned char *data = PyUnicode_1BYTE_DATA(text);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text), digits = 0;
    int code = n >= 5 && n <= 8; /* _CODE: [A-Z0-9]{5,8} */
    if (n == 0)
        return 0;
    for (Py_ssize_t k = 0; k < n; k++) { /* _ID_SHAPE: [\w.@-]+ */
        unsigned char ch = data[k];
        int digit = ch >= '0' && ch <= '9', upper = ch >= 'A' && ch <= 'Z';
        if (!(digit || upper || (ch >= 'a' && ch <= 'z') || ch == '_' || ch == '.' || ch == '@' ||
              ch == '-'))
            return 0;
        digits += digit;
        code = code && (digit || upper);
    }
    return digits >= 3 || code; /* _THREE_DIGITS: three digits anywhere */
}

typedef struct {
    PyObject *items, *id_like, *skipped; /* skipped: the tuple (None, "", False) */
} json_walk;

static int json_like(json_walk *walk, PyObject *text) {
    if (PyUnicode_Check(text) && PyUnicode_IS_ASCII(text))
        return ascii_id_like(text);
    PyObject *found = PyObject_CallOneArg(walk->id_like, text);
    if (found == NULL)
        return -1;
    int like = PyObject_IsTrue(found);
    Py_DECREF(found);
    return like;
}

/* items.setdefault((key, text), (rank, len(items))) */
static int json_item(json_walk *walk, PyObject *key, PyObject *text, long rank) {
    PyObject *pair = PyTuple_Pack(2, key, text);
    if (pair == NULL)
        return -1;
    int has = PyDict_Contains(walk->items, pair);
    if (has == 0) {
        PyObject *place = Py_BuildValue("(ln)", rank, PyDict_GET_SIZE(walk->items));
        has = place == NULL ? -1 : PyDict_SetItem(walk->items, pair, place);
        Py_XDECREF(place);
    }
    Py_DECREF(pair);
    return has < 0 ? -1 : 0;
}

static int json_walk_node(json_walk *walk, PyObject *node, PyObject *key, long depth) {
    if (Py_EnterRecursiveCall(" in json_items()"))
        return -1;
    int failed = 0;
    if (PyDict_Check(node)) {
        Py_ssize_t at = 0;
        PyObject *k, *v;
        while (!failed && PyDict_Next(node, &at, &k, &v)) {
            Py_INCREF(v); /* `id_like` may run code */
            PyObject *name = PyObject_Str(k);
            int like = name == NULL ? -1 : json_like(walk, name);
            failed = like < 0 || (like && json_item(walk, key, name, 0) < 0) ||
                     json_walk_node(walk, v, name, depth + 1) < 0;
            Py_XDECREF(name);
            Py_DECREF(v);
        }
    } else if (PyList_Check(node)) {
        for (Py_ssize_t k = 0; !failed && k < PyList_GET_SIZE(node); k++) {
            PyObject *v = PyList_GET_ITEM(node, k);
            Py_INCREF(v);
            failed = json_walk_node(walk, v, key, depth + 1) < 0;
            Py_DECREF(v);
        }
    } else {
        int skip = PySequence_Contains(walk->skipped, node);
        if (skip == 0 && !PyBool_Check(node)) {
            PyObject *text = PyObject_Str(node);
            int like = text == NULL ? -1 : json_like(walk, text);
            long rank = like ? 0 : (PyLong_Check(node) || PyFloat_Check(node)) ? 1
                                                                                : 2 + (depth < 3 ? depth : 3);
            failed = like < 0 || json_item(walk, key, text, rank) < 0;
            Py_XDECREF(text);
        } else {
            failed = skip < 0;
        }
    }
    Py_LeaveRecursiveCall();
    return failed ? -1 : 0;
}

static PyObject *json_items(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "json_items() wants a value and id_like");
        return NULL;
    }
    json_walk walk = {PyDict_New(), args[1], NULL};
    PyObject *empty = PyUnicode_New(0, 0);
    if (walk.items != NULL && empty != NULL)
        walk.skipped = PyTuple_Pack(3, Py_None, empty, Py_False);
    int failed = walk.skipped == NULL || json_walk_node(&walk, args[0], empty, 0) < 0;
    Py_XDECREF(empty);
    Py_XDECREF(walk.skipped);
    if (failed) {
        Py_XDECREF(walk.items);
        return NULL;
    }
    return walk.items;
}

static PyMethodDef methods[] = {
    {"fact_matches", fact_matches, METH_O,
     "fact_matches(text) -> list[str]: facts._FACT.findall(text), at C speed."},
    {"grouped_amounts", (PyCFunction)(void (*)(void))grouped_amounts, METH_FASTCALL,
     "grouped_amounts(text, start, end) -> list[str]: facts._GROUPED.findall(text, start, end)."},
    {"quoted_spans", (PyCFunction)(void (*)(void))quoted_spans, METH_FASTCALL,
     "quoted_spans(text, start, end) -> list[tuple[int, int]]: the spans of"
     " facts._QUOTED_PHRASE.finditer(text, start, end)."},
    {"names", (PyCFunction)(void (*)(void))names, METH_FASTCALL,
     "names(text, start, end) -> list[str]: facts._NAME.findall(text, start, end)."},
    {"name_facts", (PyCFunction)(void (*)(void))name_facts, METH_FASTCALL,
     "name_facts(text, start, end, not_names) -> list[str]: the names facts.name_matches keeps."},
    {"fact_rank", fact_rank, METH_O, "fact_rank(value) -> int: facts._rank(value)."},
    {"ranked", ranked, METH_O,
     "ranked(distinct) -> list[tuple[int, int, str]]: the ranked facts of facts._distinct."},
    {"quote_into", (PyCFunction)(void (*)(void))quote_into, METH_FASTCALL,
     "quote_into(quoted, matches) -> None: facts._quote_into."},
    {"line_hits", (PyCFunction)(void (*)(void))line_hits, METH_FASTCALL,
     "line_hits(pieces, terms, weights) -> (scores, first_hit): relevance.line_hits's finds."},
    {"relevant_lines", (PyCFunction)(void (*)(void))relevant_lines, METH_FASTCALL,
     "relevant_lines(text, scores, first_hit, start, end, max_chars, width) -> list[str]:"
     " relevance.python_relevant_lines."},
    {"text_index", text_index, METH_O,
     "text_index(text) -> index: text indexed for occurs (the index holds the text)."},
    {"occurs", (PyCFunction)(void (*)(void))occurs, METH_FASTCALL,
     "occurs(index, needle) -> bool: needle in text, for the text of text_index(text)."},
    {"salient", (PyCFunction)(void (*)(void))salient, METH_FASTCALL,
     "salient(groups, max_chars, structural, shapes, fact_shape) -> str: facts.pack_salient."},
    {"term_set", term_set, METH_O,
     "term_set(text) -> (set[str], int) | None: set(relevance.terms(text)) and len of it, for"
     " an ASCII text."},
    {"terms_into", (PyCFunction)(void (*)(void))terms_into, METH_FASTCALL,
     "terms_into(found, text) -> int | None: found.update(relevance.terms(text)) and how many"
     " terms, for an ASCII text."},
    {"plain", plain, METH_O,
     "plain(value) -> bool: canonical._plain(value) (orjson writes it as canonical_json)."},
    {"shape_counts", (PyCFunction)(void (*)(void))shape_counts, METH_FASTCALL,
     "shape_counts(group, shapes, fact_shape) -> dict[str, set[str]]: facts.shape_counts."},
    {"unshown", (PyCFunction)(void (*)(void))unshown, METH_FASTCALL,
     "unshown(found, shown, occurs) -> list: facts.python_unshown."},
    {"json_items", (PyCFunction)(void (*)(void))json_items, METH_FASTCALL,
     "json_items(value, id_like) -> dict: facts.python_json_items(value)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_factscan", "The fact pattern's matches at C speed.", -1, methods,
};

PyMODINIT_FUNC PyInit__factscan(void) {
    init_table();
    init_starts();
    init_terms();
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddStringConstant(m, "PATTERN", PATTERN) < 0 ||
        PyModule_AddStringConstant(m, "GROUPED", GROUPED) < 0 ||
        PyModule_AddStringConstant(m, "QUOTED", QUOTED) < 0 ||
        PyModule_AddStringConstant(m, "NAME", NAME) < 0 ||
        PyModule_AddStringConstant(m, "PATHLIKE", PATHLIKE) < 0 ||
        PyModule_AddStringConstant(m, "PUNCT_EDGES", PUNCT_EDGES) < 0 ||
        PyModule_AddStringConstant(m, "DIGIT", DIGIT_PATTERN) < 0 ||
        PyModule_AddStringConstant(m, "LETTER", LETTER) < 0 ||
        PyModule_AddStringConstant(m, "MIN_FACT_LEN", MIN_FACT_LEN) < 0 ||
        PyModule_AddStringConstant(m, "SALIENT", SALIENT) < 0 ||
        PyModule_AddStringConstant(m, "TERM_SEPARATORS", TERM_SEPARATORS) < 0 ||
        PyModule_AddStringConstant(m, "DIGIT_RUN", "\\d+") < 0 ||
        PyModule_AddStringConstant(m, "ID_SHAPE", "[\\w.@-]+") < 0 ||
        PyModule_AddStringConstant(m, "THREE_DIGITS", "\\d\\D*\\d\\D*\\d") < 0 ||
        PyModule_AddStringConstant(m, "CODE", "[A-Z0-9]{5,8}") < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
