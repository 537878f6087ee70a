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
static inline int req_at(int kind, const void *data, Py_ssize_t n, Py_ssize_t p, Py_UCS4 ch,
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

static PyObject *fact_matches(PyObject *module, PyObject *text) {
    (void)module;
    if (!PyUnicode_Check(text)) {
        PyErr_SetString(PyExc_TypeError, "fact_matches() wants a str");
        return NULL;
    }
    int kind = PyUnicode_KIND(text);
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

static PyMethodDef methods[] = {
    {"fact_matches", fact_matches, METH_O,
     "fact_matches(text) -> list[str]: facts._FACT.findall(text), at C speed."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_factscan", "The fact pattern's matches at C speed.", -1, methods,
};

PyMODINIT_FUNC PyInit__factscan(void) {
    init_table();
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddStringConstant(m, "PATTERN", PATTERN) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
