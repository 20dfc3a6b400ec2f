/* Kineto event scanner: JSON trace events -> the columns of traceql's tables, without making a Python object per
 * event.
 *
 * A Scanner is made once per file: Scanner(classify, buckets). buckets is a list of (name, [field, ...]): the tables
 * an event can go to, each with the fields it keeps ("id" is the event's index in the file). classify(ph, cat) -> the
 * index of an event's bucket, called once per distinct (ph, cat) pair of the file (str or None each).
 *
 * feed(buffer, end, start, bare, i0) reads buffer[start:end], a JSON array of event objects (bare: the events and
 * the commas between them, as cut out of an array without copying), numbering its events from i0. Each event's
 * fields go straight to its bucket's columns. It returns the number of events, or None when anything in the slice
 * is outside what this scanner takes on (a value of an unexpected type, a key with escapes, an int beyond int64,
 * invalid JSON, raw control characters, invalid UTF-8...): the slice is then rolled back as if never fed. None is
 * not an error: the caller then decodes the slice with its general (msgspec) path, which turns every such case into
 * the same tables or into its own error. So this file only has to be exact on what it accepts, and it accepts the
 * shapes every profiler writes.
 *
 * take() -> (strings, {bucket: (n, {field: (data, validity or None, null count)})}, colls) hands over the rows fed
 * since the last take (the buffers are given away, not copied) and starts new ones:
 * - strings: the distinct string values of the file so far (ph, cat, name, non-numeric pid/tid, cuda_sync_kind),
 *   decoded; string fields are uint32 codes into it. Codes stay valid for the whole file.
 * - numbers are int64. ts and dur are converted from microseconds to int64 nanoseconds the way kineto._ns does
 *   (floats: floor, then the fraction rounded half to even); external_id is "External id", else "external id";
 *   event is "wait_on_cuda_event_id", else "event"; pid/tid strings of digits are numbers, other pid/tid strings go
 *   to pid_s/tid_s.
 * - colls: [(id, args bytes)] for the events whose args hold a collective key ("Collective name", "Process Group
 *   Name", ...), and for collective calls (record_param_comms, nccl:/gloo:... annotations) whose args hold "Input
 *   Dims" (record_shapes: a gloo call's only size), so that the caller can parse those few args objects in full.
 *
 * Nothing here trusts the input: every read is bounds-checked against length, nesting depth is capped, and the
 * output only ever grows by appends with checked sizes. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 512

typedef struct {
    const unsigned char *p;
    const unsigned char *end;
    const unsigned char *base;
} Cur;

static inline uint64_t load64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL
/* bytes of x that are '"', '\\' or below 0x20 have their high bit set in the result (exact for bytes < 0x80;
 * bytes >= 0x80 may be flagged too and are then looked at one by one) */
static inline uint64_t special8(uint64_t x) {
    uint64_t q = x ^ (ONES * '"'), b = x ^ (ONES * '\\');
    return ((q - ONES) | (b - ONES) | (x - ONES * 0x20)) & HIGHS;
}

/* ---- output columns ------------------------------------------------------------------------------------------ */
/* ---- lexing -------------------------------------------------------------------------------------------------- */

static inline void skip_ws(Cur *c) {
    const unsigned char *p = c->p, *end = c->end;
    if (p < end && *p > ' ') return; /* the common case: no whitespace */
    if (end - p >= 2 && *p == ' ' && p[1] > ' ') { /* the next: one space (", " and ": " between members) */
        c->p = p + 1;
        return;
    }
    /* runs of spaces (indentation) eight at a time */
    for (;;) {
        while (end - p >= 8) {
            uint64_t x = load64(p) ^ (ONES * ' ');
            if (x) {
                p += __builtin_ctzll(x) >> 3;
                break;
            }
            p += 8;
        }
        if (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) {
            p++;
            continue;
        }
        break;
    }
    c->p = p;
}

/* A string starting at c->p (which is '"'): sets its raw span (without quotes) and whether it holds escapes.
 * Rejects raw control characters and bytes >= 0x80 are left for the UTF-8 decoder. Returns 0, or -1 to bail. */
static int lex_string(Cur *c, const unsigned char **start, Py_ssize_t *len, int *esc) {
    const unsigned char *p = c->p + 1;
    const unsigned char *end = c->end;
    int e = 0;
    *start = p;
    for (;;) {
        /* jump to the first byte that may be special: exact for ASCII, bytes >= 0x80 may be flagged too */
        while (end - p >= 8) {
            uint64_t m = special8(load64(p));
            if (m) {
                p += __builtin_ctzll(m) >> 3;
                break;
            }
            p += 8;
        }
        if (p >= end) return -1;
        unsigned char ch = *p;
        if (ch == '"') {
            *len = p - *start;
            *esc = e;
            c->p = p + 1;
            return 0;
        }
        if (ch == '\\') {
            e = 1;
            p += 2; /* the escaped character is validated when decoding */
            continue;
        }
        if (ch < 0x20) return -1;
        p++;
    }
}

static int hexval(unsigned char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

static int read_hex4(const unsigned char *p, const unsigned char *end, unsigned *out) {
    if (end - p < 4) return -1;
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(p[i]);
        if (h < 0) return -1;
        v = (v << 4) | (unsigned)h;
    }
    *out = v;
    return 0;
}

/* Validates the escapes of a raw string span and, when out is not NULL, writes the decoded UTF-8 there (out must
 * hold len bytes: decoding never grows a JSON string). Returns the decoded length, or -1 (bail). Lone surrogates
 * are refused. */
static Py_ssize_t unescape(const unsigned char *s, Py_ssize_t len, char *out) {
    const unsigned char *p = s, *end = s + len;
    Py_ssize_t o = 0;
    while (p < end) {
        unsigned char ch = *p;
        if (ch != '\\') {
            if (out) out[o] = (char)ch;
            o++;
            p++;
            continue;
        }
        if (p + 1 >= end) return -1;
        unsigned char e = p[1];
        char r;
        switch (e) {
        case '"': r = '"'; break;
        case '\\': r = '\\'; break;
        case '/': r = '/'; break;
        case 'b': r = '\b'; break;
        case 'f': r = '\f'; break;
        case 'n': r = '\n'; break;
        case 'r': r = '\r'; break;
        case 't': r = '\t'; break;
        case 'u': {
            unsigned cp;
            if (read_hex4(p + 2, end, &cp) < 0) return -1;
            p += 6;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                unsigned lo;
                if (end - p < 6 || p[0] != '\\' || p[1] != 'u' || read_hex4(p + 2, end, &lo) < 0) return -1;
                if (lo < 0xDC00 || lo > 0xDFFF) return -1;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                p += 6;
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                return -1;
            }
            unsigned char b[4];
            int nb;
            if (cp < 0x80) { b[0] = (unsigned char)cp; nb = 1; }
            else if (cp < 0x800) { b[0] = 0xC0 | (cp >> 6); b[1] = 0x80 | (cp & 0x3F); nb = 2; }
            else if (cp < 0x10000) { b[0] = 0xE0 | (cp >> 12); b[1] = 0x80 | ((cp >> 6) & 0x3F); b[2] = 0x80 | (cp & 0x3F); nb = 3; }
            else { b[0] = 0xF0 | (cp >> 18); b[1] = 0x80 | ((cp >> 12) & 0x3F); b[2] = 0x80 | ((cp >> 6) & 0x3F); b[3] = 0x80 | (cp & 0x3F); nb = 4; }
            if (out) memcpy(out + o, b, (size_t)nb);
            o += nb;
            continue;
        }
        default: return -1;
        }
        if (out) out[o] = r;
        o++;
        p += 2;
    }
    return o;
}


/* ---- column storage ------------------------------------------------------------------------------------------- */

/* A growable byte buffer that Python reads through the buffer protocol, or whose memory moves into an Arrow array
 * (arrow()), without a copy either way. From 64 KB on its memory is mapped from the system directly (anonymous mmap, grown with mremap where there is one), so that it goes
 * back to the system the moment the last table using it is dropped: malloc'd buffers of a few MB stay in the allocator's
 * heap after they are freed (glibc raises its mmap threshold as such blocks come and go), which at 1 GB of trace
 * kept ~40 MB more resident at the peak. */

#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#define HAVE_MMAP 1
#endif

typedef struct {
    PyObject_HEAD
    char *data;
    Py_ssize_t len; /* bytes exposed */
    Py_ssize_t cap; /* bytes held */
    int mapped;     /* data is a mapping (else malloc'd) */
    Py_ssize_t exports; /* buffer views open on it: its memory cannot move to an Arrow array (arrow()) meanwhile */
} MBuf;

/* Below this a buffer is malloc'd: the columns of rare tables would each take a mapping of their own, and a process
 * has a bounded number of those (vm.max_map_count, 65530 by default). Measured: a 1 GB trace's tables hold ~170
 * mappings (adjacent ones merge), so the limit is far beyond any trace a machine can hold in memory. */
#define MAP_MIN ((Py_ssize_t)1 << 16)

static void mbuf_dealloc(MBuf *b) {
#ifdef HAVE_MMAP
    if (b->data && b->mapped) munmap(b->data, (size_t)b->cap);
    else
#endif
        free(b->data);
    Py_TYPE(b)->tp_free((PyObject *)b);
}

static int mbuf_getbuffer(MBuf *b, Py_buffer *view, int flags) {
    int r = PyBuffer_FillInfo(view, (PyObject *)b, b->data ? b->data : (char *)"", b->len, 1, flags);
    if (r == 0) b->exports++;
    return r;
}

static void mbuf_releasebuffer(MBuf *b, Py_buffer *view) { b->exports--; }

static PyBufferProcs mbuf_as_buffer = {(getbufferproc)mbuf_getbuffer, (releasebufferproc)mbuf_releasebuffer};

static PyTypeObject MBufType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "traceql.ingest._kscan.MBuf",
    .tp_basicsize = sizeof(MBuf),
    .tp_dealloc = (destructor)mbuf_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A column's bytes, read-only (see _kscan.c).",
    .tp_as_buffer = &mbuf_as_buffer,
};

static MBuf *mbuf_new(void) {
    MBuf *b = PyObject_New(MBuf, &MBufType);
    if (b) {
        b->data = NULL;
        b->len = b->cap = 0;
        b->mapped = 0;
        b->exports = 0;
    }
    return b;
}

/* Room for cap bytes, keeping the first len. Only called before the buffer is handed out (no exports yet). */
static int mbuf_reserve(MBuf *b, Py_ssize_t cap) {
    if (cap <= b->cap) return 0;
#ifdef HAVE_MMAP
    if (cap >= MAP_MIN) {
        Py_ssize_t page = 1 << 16;
        cap = (cap + page - 1) / page * page;
        void *p = MAP_FAILED;
#ifdef MREMAP_MAYMOVE
        if (b->mapped) p = mremap(b->data, (size_t)b->cap, (size_t)cap, MREMAP_MAYMOVE);
        else
#endif
        {
            p = mmap(NULL, (size_t)cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (p != MAP_FAILED && b->data) {
                memcpy(p, b->data, (size_t)b->len);
                if (b->mapped) munmap(b->data, (size_t)b->cap);
                else free(b->data);
            }
        }
        if (p == MAP_FAILED) return -1;
        b->data = p;
        b->cap = cap;
        b->mapped = 1;
        return 0;
    }
#endif
    void *p = realloc(b->data, (size_t)cap);
    if (!p) return -1;
    b->data = p;
    b->cap = cap;
    return 0;
}

/* ---- fields, buckets and the scanner ------------------------------------------------------------------------- */

enum {
    F_PH, F_CAT, F_NAME, F_PID_S, F_TID_S, F_SYNC_KIND, /* uint32 string codes */
    F_PID, F_TID, F_TS, F_DUR, F_FLOW_ID, F_DEVICE, F_STREAM, F_CORRELATION, F_EXTERNAL_ID, F_BYTES, F_EVENT,
    F_ID, /* the event's index in the file */
    N_FIELDS
};
#define N_STR_FIELDS 6
static const char *FIELD_NAMES[N_FIELDS] = {
    "ph", "cat", "name", "pid_s", "tid_s", "sync_kind",
    "pid", "tid", "ts", "dur", "flow_id", "device", "stream", "correlation", "external_id", "bytes", "event", "id",
};
#define BIT(f) (1u << (f))
/* the args fields: a repeated "args" key replaces the first one whole */
#define ARGS_FIELDS (BIT(F_SYNC_KIND) | BIT(F_DEVICE) | BIT(F_STREAM) | BIT(F_CORRELATION) | BIT(F_EXTERNAL_ID) | \
                     BIT(F_BYTES) | BIT(F_EVENT))

typedef struct {
    MBuf *data_obj;       /* handed to Python without a copy */
    MBuf *valid_obj;
    unsigned char *data;  /* int64 or uint32 values */
    unsigned char *valid; /* validity bitmap, LSB first (Arrow) */
    int field;
    Py_ssize_t width;     /* bytes per value */
} Col;

#define MAX_BUCKETS 32
typedef struct {
    PyObject *name;
    int ncols;
    Col cols[N_FIELDS];
    Py_ssize_t n, cap; /* rows since the last take, and room */
} Bucket;

typedef struct {
    uint64_t hash;
    Py_ssize_t off; /* raw (escaped) bytes in the arena */
    Py_ssize_t len;
    uint32_t code;
    int used;
} Slot;

typedef struct {
    uint64_t key; /* (ph code + 1) << 32 | (cat code + 1); 0: null */
    int bucket;
    int used;
} Kind;

typedef struct {
    PyObject_HEAD
    PyObject *classify;
    PyObject *strings; /* decoded str objects, by code */
    Slot *slots;       /* interned strings, by their raw bytes */
    Py_ssize_t scap, scount;
    char *arena;
    Py_ssize_t arena_len, arena_cap;
    Kind *kinds;       /* (ph, cat) -> bucket */
    Py_ssize_t kcap, kcount;
    Bucket buckets[MAX_BUCKETS];
    int nb;
    PyObject *colls;   /* [(id, args bytes)] */
    char *tmp;         /* scratch for unescaping */
    Py_ssize_t tmp_cap;
    /* the codes of short values (up to eight raw bytes: "X", "ac2g", "kernel"...), by their bytes as one number (a raw
     * string holds no NUL, so zero padding keeps the lengths apart): most string fields of most events, found
     * without hashing and comparing them. A cache: a colliding value replaces the one there. */
    struct { uint64_t key; uint32_t code; uint32_t used; } shorts[256];
} Scanner;

/* One feed: the cursor, and the event being read (its fields, staged until its bucket is known). */
typedef struct {
    Cur c;
    Scanner *sc;
    int64_t row[N_FIELDS];
    uint32_t has;
    const unsigned char *args_lo, *args_hi; /* the args object, when it holds a collective key */
    const unsigned char *shapes_lo, *shapes_hi; /* the args object, when it holds Input Dims (and no such key) */
    int64_t i0, idx;
    int oom;
    int err; /* a Python exception is set (classify failed) */
} Feed;

/* Two lanes over 16 bytes at a time (half the chain of dependent multiplies of one lane: kernel names run to
 * hundreds of bytes), the tail as the last eight bytes, overlapping, where there are eight: equal bytes, equal hash. */
static uint64_t hash_bytes(const unsigned char *s, Py_ssize_t n) {
    uint64_t a = 0x9E3779B97F4A7C15ULL ^ (uint64_t)n, b = 0xD6E8FEB86659FD93ULL;
    Py_ssize_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a = (a ^ load64(s + i)) * 0xFF51AFD7ED558CCDULL;
        b = (b ^ load64(s + i + 8)) * 0xC4CEB9FE1A85EC53ULL;
        a ^= a >> 32;
        b ^= b >> 32;
    }
    uint64_t t = 0;
    if (n >= 8) {
        if (n - i > 8) {
            a = (a ^ load64(s + i)) * 0xFF51AFD7ED558CCDULL;
            a ^= a >> 32;
        }
        if (i < n) t = load64(s + n - 8);
    } else {
        memcpy(&t, s, (size_t)n);
    }
    uint64_t h = (a ^ t) * 0xC4CEB9FE1A85EC53ULL ^ b;
    h *= 0xFF51AFD7ED558CCDULL;
    return h ^ (h >> 29);
}

static inline void set_f(Feed *f, int field, int64_t v) {
    f->row[field] = v;
    f->has |= BIT(field);
}

static inline void clear_f(Feed *f, int field) { f->has &= ~BIT(field); }

static int bucket_grow(Bucket *b) {
    Py_ssize_t ncap = b->cap ? b->cap * 2 : 4096;
    if (ncap > (PY_SSIZE_T_MAX / 16)) return -1;
    for (int i = 0; i < b->ncols; i++) {
        Col *c = &b->cols[i];
        if (!c->data_obj) {
            c->data_obj = mbuf_new();
            c->valid_obj = mbuf_new();
            if (!c->data_obj || !c->valid_obj) return -1;
        }
        c->data_obj->len = b->n * c->width; /* the rows so far move with a remap */
        c->valid_obj->len = (b->n + 7) / 8;
        if (mbuf_reserve(c->data_obj, ncap * c->width) < 0 || mbuf_reserve(c->valid_obj, (ncap + 7) / 8) < 0) {
            PyErr_NoMemory();
            return -1;
        }
        c->data = (unsigned char *)c->data_obj->data;
        c->valid = (unsigned char *)c->valid_obj->data;
    }
    b->cap = ncap;
    return 0;
}

/* ---- string interning (per file) ----------------------------------------------------------------------------- */

/* The code of a string value, interned by its raw bytes. -1: bail (bad escape, bad UTF-8, out of memory). */
static int64_t intern_slow(Feed *f, const unsigned char *raw, Py_ssize_t len, int esc);

static int64_t intern(Feed *f, const unsigned char *raw, Py_ssize_t len, int esc) {
    if (len > 8) return intern_slow(f, raw, len, esc);
    uint64_t key = 0;
    if (f->c.end - raw >= 8) key = len ? load64(raw) & (~0ULL >> (64 - 8 * len)) : 0;
    else memcpy(&key, raw, (size_t)len);
    Scanner *in = f->sc;
    unsigned i = (unsigned)((key * 0x9E3779B97F4A7C15ULL) >> 56);
    if (in->shorts[i].used && in->shorts[i].key == key) return in->shorts[i].code;
    int64_t code = intern_slow(f, raw, len, esc);
    if (code >= 0) {
        in->shorts[i].key = key;
        in->shorts[i].code = (uint32_t)code;
        in->shorts[i].used = 1;
    }
    return code;
}

static int64_t intern_slow(Feed *f, const unsigned char *raw, Py_ssize_t len, int esc) {
    Scanner *in = f->sc;
    if (in->scount * 2 >= in->scap) {
        Py_ssize_t ncap = in->scap ? in->scap * 2 : 1024;
        Slot *ns = calloc((size_t)ncap, sizeof(Slot));
        if (!ns) { f->oom = 1; return -1; }
        for (Py_ssize_t i = 0; i < in->scap; i++) {
            if (!in->slots[i].used) continue;
            Py_ssize_t j = (Py_ssize_t)(in->slots[i].hash & (uint64_t)(ncap - 1));
            while (ns[j].used) j = (j + 1) & (ncap - 1);
            ns[j] = in->slots[i];
        }
        free(in->slots);
        in->slots = ns;
        in->scap = ncap;
    }
    uint64_t h = hash_bytes(raw, len);
    Py_ssize_t j = (Py_ssize_t)(h & (uint64_t)(in->scap - 1));
    while (in->slots[j].used) {
        Slot *sl = &in->slots[j];
        if (sl->hash == h && sl->len == len && memcmp(in->arena + sl->off, raw, (size_t)len) == 0) return sl->code;
        j = (j + 1) & (in->scap - 1);
    }
    PyObject *str;
    if (esc) {
        if (len > in->tmp_cap) {
            char *t = realloc(in->tmp, (size_t)len + 1);
            if (!t) { f->oom = 1; return -1; }
            in->tmp = t;
            in->tmp_cap = len;
        }
        Py_ssize_t n = unescape(raw, len, in->tmp);
        if (n < 0) return -1;
        str = PyUnicode_DecodeUTF8(in->tmp, n, "strict");
    } else {
        str = PyUnicode_DecodeUTF8((const char *)raw, len, "strict");
    }
    if (!str) {
        PyErr_Clear(); /* invalid UTF-8: the general path decides */
        return -1;
    }
    if (in->arena_len + len > in->arena_cap) {
        Py_ssize_t ncap = in->arena_cap ? in->arena_cap : 1 << 16;
        while (ncap < in->arena_len + len) ncap *= 2;
        char *a = realloc(in->arena, (size_t)ncap);
        if (!a) { Py_DECREF(str); f->oom = 1; return -1; }
        in->arena = a;
        in->arena_cap = ncap;
    }
    if (in->scount >= UINT32_MAX - 1 || PyList_Append(in->strings, str) < 0) {
        Py_DECREF(str);
        PyErr_Clear();
        f->oom = 1;
        return -1;
    }
    Py_DECREF(str);
    memcpy(in->arena + in->arena_len, raw, (size_t)len);
    Slot *sl = &in->slots[j];
    sl->used = 1;
    sl->hash = h;
    sl->off = in->arena_len;
    sl->len = len;
    sl->code = (uint32_t)in->scount;
    in->arena_len += len;
    in->scount++;
    return sl->code;
}


/* ---- numbers ------------------------------------------------------------------------------------------------- */

typedef struct {
    int is_int;     /* no fraction, no exponent, and fits int64 */
    int64_t i;
    double d;
} Num;

static const double POW10[23] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                                 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* The value of eight ASCII digits (first in the lowest byte), by pairs, then fours, then the eight. */
static inline uint64_t eight_digits(uint64_t x) {
    x -= 0x3030303030303030ULL;
    x = x * 10 + (x >> 8);                                   /* byte 2k: the pair 2k, 2k+1 (0..99) */
    uint64_t pairs = x & 0x00FF00FF00FF00FFULL;              /* the four pairs, in 16-bit lanes */
    pairs = (pairs * 100 + (pairs >> 16)) & 0x0000FFFF0000FFFFULL; /* the two fours, in 32-bit lanes */
    return (pairs & 0xFFFFFFFFULL) * 10000 + (pairs >> 32);
}

/* How many of x's bytes, from the first (lowest), are ASCII digits before one that is not (8: all of them). A byte
 * gets its high bit in nd where it is below '0' (0xAF - y borrows into the high bit), above '9' (y + 0x46 carries
 * into it) or not ASCII (its own high bit); y is the byte without its high bit, so neither sum crosses a lane. */
static inline int digit_run8(uint64_t x) {
    uint64_t y = x & 0x7F7F7F7F7F7F7F7FULL;
    uint64_t nd = ((y + 0x4646464646464646ULL) | (0xAFAFAFAFAFAFAFAFULL - y) | x) & HIGHS;
    return nd ? __builtin_ctzll(nd) >> 3 : 8;
}

/* The value of the first k (1..7) digits of x: moved up to the top bytes of eight, '0's before them. */
static inline uint64_t first_digits(uint64_t x, int k) {
    return eight_digits((x << (64 - 8 * k)) | (0x3030303030303030ULL >> (8 * k)));
}

static const uint64_t POW10_INT[8] = {1, 10, 100, 1000, 10000, 100000, 1000000, 10000000};

/* A JSON number at c->p, validated against the grammar. Integers that overflow int64 bail (the general path keeps
 * them as Python ints and nulls them later; they never occur in real traces). Doubles are correctly rounded: the
 * exact fast path (mantissa < 2^53, |exponent| <= 22: one IEEE operation on exact operands), else strtod. */
static inline __attribute__((always_inline)) int lex_number(Cur *c, Num *out) {
    const unsigned char *p = c->p, *end = c->end, *start = p;
    int neg = 0;
    if (p < end && *p == '-') { neg = 1; p++; }
    if (p >= end) return -1;
    uint64_t mant = 0;
    int digits = 0, overflow = 0;
    if (*p == '0') {
        p++;
        digits = 1;
    } else if (*p >= '1' && *p <= '9') {
        /* eight digits at a time while they fit (timestamps have 16): 99999999 * 10^8 + ... stays below 10^18 */
        while (end - p >= 8 && digits <= 10) {
            uint64_t x = load64(p);
            int k = digit_run8(x);
            if (k == 8) {
                mant = mant * 100000000ULL + eight_digits(x);
                digits += 8;
                p += 8;
                continue;
            }
            /* the last few digits (pid, dur, ids: most numbers are shorter than eight) at once, while the value
             * stays below 10^18; past that the loop below, which sees overflow */
            if (k && digits + k <= 18) {
                mant = mant * POW10_INT[k] + first_digits(x, k);
                digits += k;
                p += k;
            }
            break;
        }
        while (p < end && *p >= '0' && *p <= '9') {
            if (mant > (UINT64_MAX - 9) / 10) overflow = 1;
            else mant = mant * 10 + (uint64_t)(*p - '0');
            digits++;
            p++;
        }
    } else {
        return -1;
    }
    int frac_digits = 0, is_int = 1;
    if (p < end && *p == '.') {
        is_int = 0;
        p++;
        if (p >= end || *p < '0' || *p > '9') return -1;
        while (p < end && *p >= '0' && *p <= '9') {
            if (mant > (UINT64_MAX - 9) / 10) overflow = 1;
            else { mant = mant * 10 + (uint64_t)(*p - '0'); frac_digits++; }
            p++;
        }
    }
    int exp10 = 0;
    if (p < end && (*p == 'e' || *p == 'E')) {
        is_int = 0;
        p++;
        int eneg = 0;
        if (p < end && (*p == '+' || *p == '-')) { eneg = *p == '-'; p++; }
        if (p >= end || *p < '0' || *p > '9') return -1;
        int e = 0;
        while (p < end && *p >= '0' && *p <= '9') {
            if (e < 100000) e = e * 10 + (*p - '0');
            p++;
        }
        exp10 = eneg ? -e : e;
    }
    c->p = p;
    out->is_int = is_int;
    if (is_int) {
        if (overflow || mant > (uint64_t)INT64_MAX + (uint64_t)neg) return -1;
        out->i = neg ? (int64_t)(0 - mant) : (int64_t)mant;
        out->d = (double)out->i;
        return 0;
    }
    int e10 = exp10 - frac_digits;
    if (!overflow && mant < (1ULL << 53) && e10 >= -22 && e10 <= 22) {
        double v = (double)mant;
        v = e10 < 0 ? v / POW10[-e10] : v * POW10[e10];
        out->d = neg ? -v : v;
        return 0;
    }
    char buf[128];
    Py_ssize_t n = p - start;
    if (n >= (Py_ssize_t)sizeof(buf)) return -1;
    memcpy(buf, start, (size_t)n);
    buf[n] = 0;
    out->d = strtod(buf, NULL);
    return isfinite(out->d) ? 0 : -1; /* beyond double: the general path decides */
}

/* microseconds -> int64 nanoseconds, as kineto._ns: ints exactly, floats by whole and rounded fraction. 0: null. */
static int us_to_ns(const Num *v, int64_t *ns) {
    if (v->is_int) {
        if (v->i >= 9223372036854775LL || v->i <= -9223372036854775LL) return 0;
        *ns = v->i * 1000;
        return 1;
    }
    double d = v->d;
    if (!(fabs(d) < 9.2e15)) return 0;
    double w = floor(d);
    *ns = (int64_t)w * 1000 + (int64_t)nearbyint((d - w) * 1000.0);
    return 1;
}

/* ---- values -------------------------------------------------------------------------------------------------- */

static int skip_value(Cur *c, int depth);

/* Past the run of digits at p, eight bytes at a time. */
static inline const unsigned char *skip_digits(const unsigned char *p, const unsigned char *end) {
    while (end - p >= 8) {
        int k = digit_run8(load64(p));
        p += k;
        if (k < 8) return p;
    }
    while (p < end && *p >= '0' && *p <= '9') p++;
    return p;
}

/* A number whose value is not needed: the grammar only. */
static int skip_number(Cur *c) {
    const unsigned char *p = c->p, *end = c->end;
    if (p < end && *p == '-') p++;
    if (p >= end) return -1;
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9') p = skip_digits(p, end);
    else return -1;
    if (p < end && *p == '.') {
        p++;
        if (p >= end || *p < '0' || *p > '9') return -1;
        p = skip_digits(p, end);
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        if (p >= end || *p < '0' || *p > '9') return -1;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    c->p = p;
    return 0;
}

static int lit(Cur *c, const char *word, Py_ssize_t n) {
    if (c->end - c->p < n || memcmp(c->p, word, (size_t)n) != 0) return -1;
    c->p += n;
    return 0;
}

static int skip_value(Cur *c, int depth) {
    if (depth > MAX_DEPTH) return -1;
    skip_ws(c);
    if (c->p >= c->end) return -1;
    const unsigned char *s;
    Py_ssize_t n;
    int esc;
    switch (*c->p) {
    case '"':
        if (lex_string(c, &s, &n, &esc) < 0) return -1;
        if (esc && unescape(s, n, NULL) < 0) return -1;
        return 0;
    case '{':
        c->p++;
        skip_ws(c);
        if (c->p < c->end && *c->p == '}') { c->p++; return 0; }
        for (;;) {
            skip_ws(c);
            if (c->p >= c->end || *c->p != '"') return -1;
            if (lex_string(c, &s, &n, &esc) < 0) return -1;
            if (esc && unescape(s, n, NULL) < 0) return -1;
            skip_ws(c);
            if (c->p >= c->end || *c->p != ':') return -1;
            c->p++;
            if (skip_value(c, depth + 1) < 0) return -1;
            skip_ws(c);
            if (c->p >= c->end) return -1;
            if (*c->p == ',') { c->p++; continue; }
            if (*c->p == '}') { c->p++; return 0; }
            return -1;
        }
    case '[':
        c->p++;
        skip_ws(c);
        if (c->p < c->end && *c->p == ']') { c->p++; return 0; }
        for (;;) {
            if (skip_value(c, depth + 1) < 0) return -1;
            skip_ws(c);
            if (c->p >= c->end) return -1;
            if (*c->p == ',') { c->p++; continue; }
            if (*c->p == ']') { c->p++; return 0; }
            return -1;
        }
    case 't': return lit(c, "true", 4);
    case 'f': return lit(c, "false", 5);
    case 'n': return lit(c, "null", 4);
    default:
        return skip_number(c);
    }
}

static inline int is_null(Cur *c) {
    return c->end - c->p >= 4 && memcmp(c->p, "null", 4) == 0;
}


/* A string field -> its code; null -> null; anything else bails. */
static int field_str(Feed *f, int field) {
    Cur *c = &f->c;
    if (c->p < c->end && *c->p == '"') {
        const unsigned char *raw;
        Py_ssize_t n;
        int esc;
        if (lex_string(c, &raw, &n, &esc) < 0) return -1;
        int64_t code = intern(f, raw, n, esc);
        if (code < 0) return -1;
        set_f(f, field, code);
        return 0;
    }
    if (is_null(c)) { c->p += 4; clear_f(f, field); return 0; }
    return -1;
}

/* An integer or null at c->p: *present says which. Floats, strings, bools... bail. */
/* A non-negative integer of 1..16 digits at c->p, as profilers write ids, sizes and timestamps: its value, with c->p
 * past it; -1 (c->p unmoved) for anything else (a sign, a leading zero, a fraction or exponent, more digits, the
 * last 17 bytes of the buffer), which lex_number then reads. Two loads of eight bytes at most. */
static inline __attribute__((always_inline)) int64_t short_uint(Cur *c) {
    const unsigned char *p = c->p;
    if (c->end - p < 17) return -1;
    uint64_t x = load64(p);
    int k = digit_run8(x);
    if (k == 0 || (*p == '0' && k > 1)) return -1;
    uint64_t v;
    if (k < 8) {
        v = first_digits(x, k);
    } else {
        uint64_t y = load64(p + 8);
        int k2 = digit_run8(y);
        v = eight_digits(x);
        if (k2 == 8) {
            if (p[16] >= '0' && p[16] <= '9') return -1;
            v = v * 100000000ULL + eight_digits(y);
        } else if (k2) {
            v = v * POW10_INT[k2] + first_digits(y, k2);
        }
        k += k2;
    }
    unsigned char after = p[k];
    if (after == '.' || after == 'e' || after == 'E') return -1;
    c->p = p + k;
    return (int64_t)v;
}

static __attribute__((noinline)) int read_int_slow(Cur *c, int *present, int64_t *v);

/* An integer or null at c->p: *present says which. Floats, strings, bools... bail. The common integers inline, the
 * rest out of line (lex_number's registers would otherwise be saved and restored on every call). */
static inline __attribute__((always_inline)) int read_int(Cur *c, int *present, int64_t *v) {
    int64_t u = short_uint(c);
    if (u >= 0) { *present = 1; *v = u; return 0; }
    return read_int_slow(c, present, v);
}

static int read_int_slow(Cur *c, int *present, int64_t *v) {
    if (is_null(c)) { c->p += 4; *present = 0; return 0; }
    if (c->p < c->end && (*c->p == '-' || (*c->p >= '0' && *c->p <= '9'))) {
        Num num;
        if (lex_number(c, &num) < 0 || !num.is_int) return -1;
        *present = 1;
        *v = num.i;
        return 0;
    }
    return -1;
}

/* An integer field; null -> null. */
static inline __attribute__((always_inline)) int field_int(Feed *f, int field) {
    int present;
    int64_t v;
    if (read_int(&f->c, &present, &v) < 0) return -1;
    if (present) set_f(f, field, v);
    else clear_f(f, field);
    return 0;
}

/* A time field (microseconds) -> nanoseconds. */
static __attribute__((noinline)) int field_time_slow(Feed *f, int field);

static inline __attribute__((always_inline)) int field_time(Feed *f, int field) {
    int64_t u = short_uint(&f->c);
    if (u < 0) return field_time_slow(f, field);
    if (u < 9223372036854775LL) set_f(f, field, u * 1000); /* an integer: us_to_ns's */
    else clear_f(f, field);
    return 0;
}

static int field_time_slow(Feed *f, int field) {
    Cur *c = &f->c;
    if (is_null(c)) { c->p += 4; clear_f(f, field); return 0; }
    if (c->p < c->end && (*c->p == '-' || (*c->p >= '0' && *c->p <= '9'))) {
        Num v;
        int64_t ns;
        if (lex_number(c, &v) < 0) return -1;
        if (us_to_ns(&v, &ns)) set_f(f, field, ns);
        else clear_f(f, field);
        return 0;
    }
    return -1;
}

/* pid / tid: an int; a string of ASCII digits (one optional leading '-', no leading zero) is that number; another
 * string is a name (the _s field). Anything else bails. */
static int field_id(Feed *f, int field, int name_field) {
    Cur *c = &f->c;
    if (c->p < c->end && *c->p == '"') {
        const unsigned char *raw;
        Py_ssize_t n;
        int esc;
        if (lex_string(c, &raw, &n, &esc) < 0) return -1;
        if (esc) return -1;
        Py_ssize_t i = 0;
        while (i < n && raw[i] == '-') i++;
        int all_digits = i < n;
        for (Py_ssize_t k = i; k < n; k++) {
            if (raw[k] >= 0x80) return -1; /* non-ASCII: str.isdigit knows other digits */
            if (raw[k] < '0' || raw[k] > '9') all_digits = 0;
        }
        if (all_digits) {
            if (i > 1 || (raw[i] == '0' && n - i > 1) || n - i > 18) return -1;
            int64_t v = 0;
            for (Py_ssize_t k = i; k < n; k++) v = v * 10 + (raw[k] - '0');
            set_f(f, field, i ? -v : v);
            clear_f(f, name_field);
            return 0;
        }
        int64_t code = intern(f, raw, n, 0);
        if (code < 0) return -1;
        clear_f(f, field);
        set_f(f, name_field, code);
        return 0;
    }
    clear_f(f, name_field);
    return field_int(f, field);
}

/* ---- events -------------------------------------------------------------------------------------------------- */

/* A member's key and the colon after it: `"key" :`, whitespace around. Keys with escapes bail (no profiler writes
 * them; the general path unescapes them). */
static inline __attribute__((always_inline)) int read_key(Cur *c, const unsigned char **k, Py_ssize_t *n) {
    int esc;
    skip_ws(c);
    if (c->p >= c->end || *c->p != '"') return -1;
    if (lex_string(c, k, n, &esc) < 0 || esc) return -1;
    const unsigned char *p = c->p;
    if (c->end - p >= 3 && p[0] == ':' && p[1] == ' ' && p[2] > ' ') { /* `": v`, as profilers write members */
        c->p = p + 2;
        return 0;
    }
    skip_ws(c);
    if (c->p >= c->end || *c->p != ':') return -1;
    c->p++;
    skip_ws(c);
    return 0;
}

/* After a member's value: 0 when a comma follows (another member), 1 at the closing brace, -1 otherwise. */
static int after_member(Cur *c) {
    const unsigned char *p = c->p;
    if (c->end - p >= 3 && memcmp(p, ", \"", 3) == 0) { /* `, "` before the next key */
        c->p = p + 2;
        return 0;
    }
    skip_ws(c);
    if (c->p >= c->end) return -1;
    if (*c->p == ',') { c->p++; return 0; }
    if (*c->p == '}') { c->p++; return 1; }
    return -1;
}

#define KEY(lit_) (n == (Py_ssize_t)(sizeof(lit_) - 1) && memcmp(k, lit_, sizeof(lit_) - 1) == 0)

/* The keys of ours, at the top of an event and in its args. */
enum {
    K_OTHER, K_PH, K_TS, K_ID, K_CAT, K_PID, K_TID, K_DUR, K_NAME, K_ARGS, /* top level */
    K_BYTES, K_EVENT, K_DEVICE, K_STREAM, K_CORRELATION, K_EXTERNAL_ID, K_EXTERNAL_ID2, K_SYNC_KIND, K_WAIT_EVENT,
    K_COLL, K_SHAPES, /* args keys that are not fields: a collective key, "Input Dims" */
};

/* A key at c->p written as profilers write it (`"key": ` and the value right after) that is one of ours: its K_ id,
 * with c->p moved to the value, as read_key leaves it; -1 (c->p unmoved) for any other key or any other spelling,
 * which read_key then reads. One compare of the key's bytes with its quote, colon and space, instead of finding the
 * string's end, then the colon, then comparing the key. */
static inline __attribute__((always_inline)) int fast_key(Cur *c, int args) {
    const unsigned char *q = c->p + 1;
    Py_ssize_t avail = c->end - q;
#define AT(lit_, id_) \
    if (avail >= (Py_ssize_t)sizeof(lit_) && memcmp(q, lit_, sizeof(lit_) - 1) == 0) { \
        n = sizeof(lit_) - 1; id = id_; break; }
    int id = -1;
    Py_ssize_t n = 0;
    if (c->p >= c->end || *c->p != '"') return -1;
    if (!args) {
        switch (*q) {
        case 'p': AT("ph\": ", K_PH) AT("pid\": ", K_PID) break;
        case 't': AT("ts\": ", K_TS) AT("tid\": ", K_TID) break;
        case 'i': AT("id\": ", K_ID) break;
        case 'c': AT("cat\": ", K_CAT) break;
        case 'd': AT("dur\": ", K_DUR) break;
        case 'n': AT("name\": ", K_NAME) break;
        case 'a': AT("args\": ", K_ARGS) break;
        }
    } else {
        switch (*q) {
        case 'E': AT("External id\": ", K_EXTERNAL_ID) break;
        case 'c': AT("correlation\": ", K_CORRELATION) AT("cuda_sync_kind\": ", K_SYNC_KIND) break;
        case 'd': AT("device\": ", K_DEVICE) break;
        case 's': AT("stream\": ", K_STREAM) break;
        case 'b': AT("bytes\": ", K_BYTES) break;
        case 'e': AT("event\": ", K_EVENT) AT("external id\": ", K_EXTERNAL_ID2) break;
        case 'w': AT("wait_on_cuda_event_id\": ", K_WAIT_EVENT) break;
        }
    }
#undef AT
    if (id < 0 || q[n] <= ' ') return -1;
    c->p = q + n;
    return id;
}

/* The K_ id of a key read by read_key (K_OTHER: not one of ours). */
static int key_id(const unsigned char *k, Py_ssize_t n, int args) {
    if (!args) {
        switch (n) { /* by length, then bytes */
        case 2: return KEY("ph") ? K_PH : KEY("ts") ? K_TS : KEY("id") ? K_ID : K_OTHER;
        case 3: return KEY("cat") ? K_CAT : KEY("pid") ? K_PID : KEY("tid") ? K_TID : KEY("dur") ? K_DUR : K_OTHER;
        case 4: return KEY("name") ? K_NAME : KEY("args") ? K_ARGS : K_OTHER;
        }
        return K_OTHER;
    }
    switch (n) { /* the fields; the collective keys ("Collective name", "Process Group Name", ...); "Input Dims" */
    case 3: return KEY("Seq") || KEY("seq") ? K_COLL : K_OTHER;
    case 5: return KEY("bytes") ? K_BYTES : KEY("event") ? K_EVENT : KEY("dtype") ? K_COLL : K_OTHER;
    case 6: return KEY("device") ? K_DEVICE : KEY("stream") ? K_STREAM : K_OTHER;
    case 7: return KEY("seq_num") || KEY("Seq num") ? K_COLL : K_OTHER;
    case 10: return KEY("Group size") ? K_COLL : KEY("Input Dims") ? K_SHAPES : K_OTHER;
    case 11:
        return KEY("correlation") ? K_CORRELATION : KEY("External id") ? K_EXTERNAL_ID
               : KEY("external id") ? K_EXTERNAL_ID2 : K_OTHER;
    case 13: return KEY("In msg nelems") ? K_COLL : K_OTHER;
    case 14: return KEY("cuda_sync_kind") ? K_SYNC_KIND : KEY("Out msg nelems") ? K_COLL : K_OTHER;
    case 15: return KEY("Collective name") || KEY("sequence_number") ? K_COLL : K_OTHER;
    case 18: return KEY("Process Group Name") ? K_COLL : K_OTHER;
    case 19: return KEY("Process Group Ranks") ? K_COLL : K_OTHER;
    case 21: return KEY("wait_on_cuda_event_id") ? K_WAIT_EVENT : K_OTHER;
    case 25: return KEY("Process Group Description") ? K_COLL : K_OTHER;
    }
    return K_OTHER;
}

/* The args object at c->p. ext2 / ev2 hold the second choices until the event is done. */
static int parse_args(Feed *f, int *ext2_set, int64_t *ext2, int *ev2_set, int64_t *ev2) {
    Cur *c = &f->c;
    const unsigned char *start = c->p;
    int coll = 0, shapes = 0;
    c->p++;
    skip_ws(c);
    if (c->p < c->end && *c->p == '}') {
        c->p++;
        return 0;
    }
    for (;;) {
        const unsigned char *k = NULL;
        Py_ssize_t n = 0;
        int id = fast_key(c, 1);
        if (id < 0) {
            if (read_key(c, &k, &n) < 0) return -1;
            id = key_id(k, n, 1);
        }
        int r;
        switch (id) {
        case K_BYTES: r = field_int(f, F_BYTES); break;
        case K_EVENT: r = read_int(c, ev2_set, ev2); break; /* second choices, applied at the end */
        case K_DEVICE: r = field_int(f, F_DEVICE); break;
        case K_STREAM: r = field_int(f, F_STREAM); break;
        case K_CORRELATION: r = field_int(f, F_CORRELATION); break;
        case K_EXTERNAL_ID: r = field_int(f, F_EXTERNAL_ID); break;
        case K_EXTERNAL_ID2: r = read_int(c, ext2_set, ext2); break;
        case K_SYNC_KIND: r = field_str(f, F_SYNC_KIND); break;
        case K_WAIT_EVENT: r = field_int(f, F_EVENT); break;
        case K_COLL: coll = 1; r = skip_value(c, 1); break;
        case K_SHAPES: shapes = 1; r = skip_value(c, 1); break;
        default: /* not a key of ours; most such values are numbers */
            r = c->p < c->end && ((*c->p >= '0' && *c->p <= '9') || *c->p == '-') ? skip_number(c) : skip_value(c, 1);
        }
        if (r < 0 || (r = after_member(c)) < 0) return -1;
        if (r == 1) break;
    }
    if (coll) {
        f->args_lo = start;
        f->args_hi = c->p;
    } else if (shapes) {
        f->shapes_lo = start;
        f->shapes_hi = c->p;
    }
    return 0;
}

/* Whether the event is a collective call: a record_param_comms op, or an annotation ("gloo:all_reduce", the
 * prefixes of collective_names.ANNOTATION). With record_shapes their args hold the tensors' shapes: a gloo call's
 * only record of its message size (gloo calls have no record_param_comms op), an older record_param_comms op's too. */
static int is_coll_call(Feed *f) {
    static const char *const prefixes[] = {"nccl", "gloo", "mpi", "ucc", "hccl", "xccl", "rccl", "mtia", "custom"};
    if (!(f->has & BIT(F_NAME))) return 0;
    PyObject *s = PyList_GET_ITEM(f->sc->strings, (Py_ssize_t)f->row[F_NAME]);
    Py_ssize_t n;
    const char *u = PyUnicode_AsUTF8AndSize(s, &n);
    if (!u) { PyErr_Clear(); return 0; }
    if (n == 18 && memcmp(u, "record_param_comms", 18) == 0) return 1; /* older ones: shapes, no size keys */
    for (size_t i = 0; i < sizeof(prefixes) / sizeof(prefixes[0]); i++) {
        size_t k = strlen(prefixes[i]);
        if ((size_t)n <= k || u[k] != ':') continue;
        size_t j = 0;
        while (j < k && (u[j] | 0x20) == prefixes[i][j]) j++;
        if (j == k) return 1;
    }
    return 0;
}

/* The bucket of a (ph, cat) pair: looked up, or asked of classify once. -1: a Python exception is set. */
static int kind_of(Feed *f, uint64_t key) {
    Scanner *sc = f->sc;
    if (sc->kcount * 2 >= sc->kcap) {
        Py_ssize_t ncap = sc->kcap ? sc->kcap * 2 : 64;
        Kind *nk = calloc((size_t)ncap, sizeof(Kind));
        if (!nk) { PyErr_NoMemory(); return -1; }
        for (Py_ssize_t i = 0; i < sc->kcap; i++) {
            if (!sc->kinds[i].used) continue;
            Py_ssize_t j = (Py_ssize_t)((sc->kinds[i].key * 0x9E3779B97F4A7C15ULL) >> 40) & (ncap - 1);
            while (nk[j].used) j = (j + 1) & (ncap - 1);
            nk[j] = sc->kinds[i];
        }
        free(sc->kinds);
        sc->kinds = nk;
        sc->kcap = ncap;
    }
    Py_ssize_t j = (Py_ssize_t)((key * 0x9E3779B97F4A7C15ULL) >> 40) & (sc->kcap - 1);
    while (sc->kinds[j].used) {
        if (sc->kinds[j].key == key) return sc->kinds[j].bucket;
        j = (j + 1) & (sc->kcap - 1);
    }
    uint32_t ph = (uint32_t)(key >> 32), cat = (uint32_t)key;
    PyObject *a = ph ? PyList_GET_ITEM(sc->strings, ph - 1) : Py_None;
    PyObject *b = cat ? PyList_GET_ITEM(sc->strings, cat - 1) : Py_None;
    PyObject *got = PyObject_CallFunctionObjArgs(sc->classify, a, b, NULL);
    if (!got) return -1;
    long v = PyLong_AsLong(got);
    Py_DECREF(got);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < 0 || v >= sc->nb) {
        PyErr_Format(PyExc_ValueError, "classify returned %ld, not a bucket index", v);
        return -1;
    }
    sc->kinds[j].used = 1;
    sc->kinds[j].key = key;
    sc->kinds[j].bucket = (int)v;
    sc->kcount++;
    return (int)v;
}

/* The event read: appended to its bucket's columns. */
static int commit(Feed *f) {
    uint64_t key = ((f->has & BIT(F_PH)) ? ((uint64_t)f->row[F_PH] + 1) << 32 : 0) |
                   ((f->has & BIT(F_CAT)) ? (uint64_t)f->row[F_CAT] + 1 : 0);
    int bi = kind_of(f, key);
    if (bi < 0) { f->err = 1; return -1; }
    Bucket *b = &f->sc->buckets[bi];
    int64_t id = f->i0 + f->idx;
    if (b->ncols) {
        if (b->n >= b->cap && bucket_grow(b) < 0) { f->oom = 1; return -1; }
        f->row[F_ID] = id;
        f->has |= BIT(F_ID);
        Py_ssize_t r = b->n;
        unsigned char bit = (unsigned char)(1u << (r & 7));
        for (int i = 0; i < b->ncols; i++) {
            Col *c = &b->cols[i];
            int fl = c->field;
            int on = (f->has >> fl) & 1;
            int64_t v = on ? f->row[fl] : 0;
            if (c->width == 8) ((int64_t *)c->data)[r] = v;
            else ((uint32_t *)c->data)[r] = (uint32_t)v;
            if (on) c->valid[r >> 3] |= bit;
            else c->valid[r >> 3] &= (unsigned char)~bit;
        }
    }
    b->n++;
    if (!f->args_lo && f->shapes_lo && is_coll_call(f)) {
        f->args_lo = f->shapes_lo;
        f->args_hi = f->shapes_hi;
    }
    if (f->args_lo) {
        PyObject *t = Py_BuildValue("(Ly#)", (long long)id, (const char *)f->args_lo,
                                    (Py_ssize_t)(f->args_hi - f->args_lo));
        if (!t || PyList_Append(f->sc->colls, t) < 0) {
            Py_XDECREF(t);
            PyErr_Clear();
            f->oom = 1;
            return -1;
        }
        Py_DECREF(t);
    }
    return 0;
}

static int parse_event(Feed *f) {
    Cur *c = &f->c;
    f->has = BIT(F_DUR); /* dur defaults to 0 when absent */
    f->row[F_DUR] = 0;
    f->args_lo = f->args_hi = f->shapes_lo = f->shapes_hi = NULL;
    int ext2_set = 0, ev2_set = 0, seen_args = 0;
    int64_t ext2 = 0, ev2 = 0;
    if (c->p >= c->end || *c->p != '{') return -1;
    c->p++;
    skip_ws(c);
    if (c->p < c->end && *c->p == '}') {
        c->p++;
    } else {
        for (;;) {
            int id = fast_key(c, 0);
            if (id < 0) {
                const unsigned char *k;
                Py_ssize_t n;
                if (read_key(c, &k, &n) < 0) return -1;
                id = key_id(k, n, 0);
            }
            int r;
            switch (id) {
            case K_PH: r = field_str(f, F_PH); break;
            case K_TS: r = field_time(f, F_TS); break;
            case K_ID: r = field_int(f, F_FLOW_ID); break;
            case K_CAT: r = field_str(f, F_CAT); break;
            case K_PID: r = field_id(f, F_PID, F_PID_S); break;
            case K_TID: r = field_id(f, F_TID, F_TID_S); break;
            case K_DUR: r = field_time(f, F_DUR); break;
            case K_NAME: r = field_str(f, F_NAME); break;
            case K_ARGS:
                if (seen_args) { /* a repeated args key replaces the first one whole */
                    f->has &= ~ARGS_FIELDS;
                    f->args_lo = f->args_hi = f->shapes_lo = f->shapes_hi = NULL;
                    ext2_set = ev2_set = 0;
                }
                seen_args = 1;
                if (is_null(c)) {
                    c->p += 4;
                    r = 0;
                } else if (c->p < c->end && *c->p == '{') {
                    r = parse_args(f, &ext2_set, &ext2, &ev2_set, &ev2);
                } else {
                    r = -1;
                }
                break;
            default: r = skip_value(c, 1);
            }
            if (r < 0 || (r = after_member(c)) < 0) return -1;
            if (r == 1) break;
        }
    }
    if (ext2_set && !(f->has & BIT(F_EXTERNAL_ID))) set_f(f, F_EXTERNAL_ID, ext2);
    if (ev2_set && !(f->has & BIT(F_EVENT))) set_f(f, F_EVENT, ev2);
    if (commit(f) < 0) return -1;
    f->idx++;
    return 0;
}

static int scan_array(Feed *f) {
    Cur *c = &f->c;
    skip_ws(c);
    if (c->p >= c->end || *c->p != '[') return -1;
    c->p++;
    skip_ws(c);
    if (c->p < c->end && *c->p == ']') {
        c->p++;
    } else {
        for (;;) {
            skip_ws(c);
            if (parse_event(f) < 0) return -1;
            skip_ws(c);
            if (c->p >= c->end) return -1;
            if (*c->p == ',') { c->p++; continue; }
            if (*c->p == ']') { c->p++; break; }
            return -1;
        }
    }
    skip_ws(c);
    return c->p == c->end ? 0 : -1;
}

/* Bare: events separated by commas, no brackets (a slice of the array, cut between two events). */
static int scan_bare(Feed *f) {
    Cur *c = &f->c;
    skip_ws(c);
    if (c->p >= c->end) return 0;
    for (;;) {
        if (parse_event(f) < 0) return -1;
        skip_ws(c);
        if (c->p >= c->end) return 0;
        if (*c->p != ',') return -1;
        c->p++;
        skip_ws(c);
    }
}


/* ---- the Scanner type ---------------------------------------------------------------------------------------- */

static void bucket_release(Bucket *b) {
    for (int i = 0; i < b->ncols; i++) {
        Py_CLEAR(b->cols[i].data_obj);
        Py_CLEAR(b->cols[i].valid_obj);
        b->cols[i].data = b->cols[i].valid = NULL;
    }
    b->n = b->cap = 0;
}

static void scanner_dealloc(Scanner *sc) {
    for (int i = 0; i < sc->nb; i++) {
        bucket_release(&sc->buckets[i]);
        Py_XDECREF(sc->buckets[i].name);
    }
    Py_XDECREF(sc->classify);
    Py_XDECREF(sc->strings);
    Py_XDECREF(sc->colls);
    free(sc->slots);
    free(sc->arena);
    free(sc->kinds);
    free(sc->tmp);
    Py_TYPE(sc)->tp_free((PyObject *)sc);
}

static int scanner_init(Scanner *sc, PyObject *args, PyObject *kw) {
    PyObject *classify, *buckets;
    if (!PyArg_ParseTuple(args, "OO!", &classify, &PyList_Type, &buckets)) return -1;
    if (sc->strings) {
        PyErr_SetString(PyExc_TypeError, "Scanner is initialised once");
        return -1;
    }
    if (!PyCallable_Check(classify)) {
        PyErr_SetString(PyExc_TypeError, "classify must be callable");
        return -1;
    }
    Py_ssize_t nb = PyList_GET_SIZE(buckets);
    if (nb < 1 || nb > MAX_BUCKETS) {
        PyErr_Format(PyExc_ValueError, "1 to %d buckets", MAX_BUCKETS);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nb; i++) {
        PyObject *name, *fields;
        PyObject *item = PyList_GET_ITEM(buckets, i);
        if (!PyArg_ParseTuple(item, "UO!", &name, &PyList_Type, &fields)) return -1;
        Bucket *b = &sc->buckets[i];
        Py_ssize_t nf = PyList_GET_SIZE(fields);
        if (nf > N_FIELDS) {
            PyErr_SetString(PyExc_ValueError, "too many fields");
            return -1;
        }
        for (Py_ssize_t j = 0; j < nf; j++) {
            const char *fname = PyUnicode_AsUTF8(PyList_GET_ITEM(fields, j));
            if (!fname) return -1;
            int fl = -1;
            for (int k = 0; k < N_FIELDS; k++)
                if (strcmp(fname, FIELD_NAMES[k]) == 0) fl = k;
            if (fl < 0) {
                PyErr_Format(PyExc_ValueError, "unknown field %s", fname);
                return -1;
            }
            b->cols[j].field = fl;
            b->cols[j].width = fl < N_STR_FIELDS ? 4 : 8;
        }
        b->ncols = (int)nf;
        b->name = Py_NewRef(name);
        sc->nb = (int)i + 1;
    }
    sc->classify = Py_NewRef(classify);
    sc->strings = PyList_New(0);
    sc->colls = PyList_New(0);
    return sc->strings && sc->colls ? 0 : -1;
}

static PyObject *scanner_feed(Scanner *sc, PyObject *args) {
    Py_buffer view;
    Py_ssize_t length, start = 0;
    long long i0 = 0;
    int bare = 0;
    if (!sc->strings) {
        PyErr_SetString(PyExc_TypeError, "Scanner not initialised");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "y*n|npL", &view, &length, &start, &bare, &i0)) return NULL;
    if (length < 0 || length > view.len || start < 0 || start > length) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "length out of range");
        return NULL;
    }
    Py_ssize_t was[MAX_BUCKETS];
    for (int i = 0; i < sc->nb; i++) was[i] = sc->buckets[i].n;
    Py_ssize_t colls_was = PyList_GET_SIZE(sc->colls);
    Feed f;
    memset(&f, 0, sizeof(f));
    f.sc = sc;
    f.c.base = (const unsigned char *)view.buf;
    f.c.p = f.c.base + start;
    f.c.end = f.c.base + length;
    f.i0 = i0;
    int r = bare ? scan_bare(&f) : scan_array(&f);
    PyBuffer_Release(&view);
    if (r < 0) { /* roll back: as if never fed (interned strings stay: unused codes are harmless) */
        for (int i = 0; i < sc->nb; i++) sc->buckets[i].n = was[i];
        if (PyList_SetSlice(sc->colls, colls_was, PyList_GET_SIZE(sc->colls), NULL) < 0) return NULL;
        if (f.err) return NULL;
        if (f.oom) return PyErr_NoMemory();
        Py_RETURN_NONE;
    }
    return PyLong_FromLongLong((long long)f.idx);
}

static PyObject *col_tuple(Col *c, Py_ssize_t n) {
    Py_ssize_t set = 0, nb = n / 8;
    for (Py_ssize_t b = 0; b < nb; b++) set += __builtin_popcount(c->valid[b]);
    for (Py_ssize_t r = nb * 8; r < n; r++) set += (c->valid[r >> 3] >> (r & 7)) & 1;
    Py_ssize_t nulls = n - set;
    c->data_obj->len = n * c->width;
    c->valid_obj->len = (n + 7) / 8;
    PyObject *valid = nulls ? (PyObject *)c->valid_obj : Py_None;
    return Py_BuildValue("(OOn)", c->data_obj, valid, nulls);
}

static PyObject *scanner_take(Scanner *sc, PyObject *unused) {
    if (!sc->strings) {
        PyErr_SetString(PyExc_TypeError, "Scanner not initialised");
        return NULL;
    }
    PyObject *out = PyDict_New();
    if (!out) return NULL;
    for (int i = 0; i < sc->nb; i++) {
        Bucket *b = &sc->buckets[i];
        PyObject *cols = PyDict_New();
        if (!cols) goto fail;
        for (int j = 0; j < b->ncols && b->n; j++) {
            PyObject *t = col_tuple(&b->cols[j], b->n);
            if (!t || PyDict_SetItemString(cols, FIELD_NAMES[b->cols[j].field], t) < 0) {
                Py_XDECREF(t);
                Py_DECREF(cols);
                goto fail;
            }
            Py_DECREF(t);
        }
        PyObject *entry = Py_BuildValue("(nN)", b->n, cols);
        if (!entry || PyDict_SetItem(out, b->name, entry) < 0) {
            Py_XDECREF(entry);
            goto fail;
        }
        Py_DECREF(entry);
        bucket_release(b); /* the buffers now belong to the caller; the next rows get new ones */
    }
    PyObject *colls = sc->colls;
    sc->colls = PyList_New(0);
    if (!sc->colls) {
        sc->colls = colls;
        goto fail;
    }
    return Py_BuildValue("(ONN)", sc->strings, out, colls);
fail:
    Py_DECREF(out);
    return NULL;
}

static PyObject *scanner_pending(Scanner *sc, void *closure) {
    Py_ssize_t n = 0;
    for (int i = 0; i < sc->nb; i++) n += sc->buckets[i].n;
    return PyLong_FromSsize_t(n);
}

static PyMethodDef scanner_methods[] = {
    {"feed", (PyCFunction)scanner_feed, METH_VARARGS,
     "feed(buffer, end, start=0, bare=False, i0=0) -> events read, or None (declined, rolled back)."},
    {"take", (PyCFunction)scanner_take, METH_NOARGS,
     "take() -> (strings, {bucket: (n, {field: (data, validity, nulls)})}, [(id, args bytes)]): the rows since the\n"
     "last take."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef scanner_getset[] = {
    {"pending", (getter)scanner_pending, NULL, "rows fed since the last take", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ScannerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "traceql.ingest._kscan.Scanner",
    .tp_basicsize = sizeof(Scanner),
    .tp_dealloc = (destructor)scanner_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Scanner(classify, buckets): Kineto events -> per-bucket columns (see _kscan.c).",
    .tp_methods = scanner_methods,
    .tp_getset = scanner_getset,
    .tp_init = (initproc)scanner_init,
    .tp_new = PyType_GenericNew,
};


/* ---- the Arrow C Data Interface (https://arrow.apache.org/docs/format/CDataInterface.html) ----------------------
 * arrow(n, [(name, format, data, validity or None, null count), ...]) -> (schema capsule, array capsule): the columns
 * as one Arrow struct array of n rows, in the PyCapsule form ("arrow_schema", "arrow_array") that polars takes
 * (pl.DataFrame(obj) where obj.__arrow_c_array__() returns the pair), so that no pyarrow is needed. format is "l"
 * (int64), "i" (int32) or "I" (uint32). The MBufs' memory moves into the array without a copy (they are left
 * empty): the array's release callback frees it with munmap/free alone, which needs no Python object and so no GIL,
 * whichever thread of the consumer drops the last reference. */

struct ArrowSchema {
    const char *format;
    const char *name;
    const char *metadata;
    int64_t flags;
    int64_t n_children;
    struct ArrowSchema **children;
    struct ArrowSchema *dictionary;
    void (*release)(struct ArrowSchema *);
    void *private_data;
};

struct ArrowArray {
    int64_t length;
    int64_t null_count;
    int64_t offset;
    int64_t n_buffers;
    int64_t n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

struct ArrowArrayStream {
    int (*get_schema)(struct ArrowArrayStream *, struct ArrowSchema *out);
    int (*get_next)(struct ArrowArrayStream *, struct ArrowArray *out);
    const char *(*get_last_error)(struct ArrowArrayStream *);
    void (*release)(struct ArrowArrayStream *);
    void *private_data;
};

#define ARROW_FLAG_NULLABLE 2

/* Memory taken over from an MBuf. */
typedef struct {
    char *data;
    Py_ssize_t cap;
    int mapped;
} Owned;

static void owned_free(Owned *o) {
#ifdef HAVE_MMAP
    if (o->data && o->mapped) munmap(o->data, (size_t)o->cap);
    else
#endif
        free(o->data);
    o->data = NULL;
}

/* A child column's private data: its two buffers and the pointers Arrow reads them through. */
typedef struct {
    Owned data, valid;
    const void *bufs[2];
} ChildData;

static void child_array_release(struct ArrowArray *a) {
    ChildData *cd = a->private_data;
    owned_free(&cd->data);
    owned_free(&cd->valid);
    free(cd);
    a->release = NULL;
}

static void struct_array_release(struct ArrowArray *a) {
    for (int64_t i = 0; i < a->n_children; i++) {
        struct ArrowArray *c = a->children[i];
        if (c->release) c->release(c); /* not moved out by the consumer */
        free(c);
    }
    free(a->children);
    free(a->buffers);
    a->release = NULL;
}

static void child_schema_release(struct ArrowSchema *s) {
    free((void *)s->name);
    s->release = NULL;
}

static void struct_schema_release(struct ArrowSchema *s) {
    for (int64_t i = 0; i < s->n_children; i++) {
        struct ArrowSchema *c = s->children[i];
        if (c->release) c->release(c);
        free(c);
    }
    free(s->children);
    s->release = NULL;
}

static void schema_capsule_free(PyObject *cap) {
    struct ArrowSchema *s = PyCapsule_GetPointer(cap, "arrow_schema");
    if (!s) {
        PyErr_Clear();
        return;
    }
    if (s->release) s->release(s);
    free(s);
}

static void array_capsule_free(PyObject *cap) {
    struct ArrowArray *a = PyCapsule_GetPointer(cap, "arrow_array");
    if (!a) {
        PyErr_Clear();
        return;
    }
    if (a->release) a->release(a);
    free(a);
}

static Py_ssize_t fmt_width(const char *fmt) {
    if (!strcmp(fmt, "l")) return 8;
    if (!strcmp(fmt, "i") || !strcmp(fmt, "I")) return 4;
    return 0;
}

static const char *fmt_static(const char *fmt) {
    return !strcmp(fmt, "l") ? "l" : !strcmp(fmt, "i") ? "i" : "I";
}

/* The memory of b moves to o (b is left empty). A buffer that never grew gets a few bytes of its own: Arrow's data
 * buffer must be a valid pointer even for no rows. */
static int mbuf_move(MBuf *b, Owned *o) {
    o->data = b->data;
    o->cap = b->cap;
    o->mapped = b->mapped;
    b->data = NULL;
    b->len = b->cap = 0;
    b->mapped = 0;
    if (!o->data) {
        o->data = malloc(8);
        o->cap = 8;
        o->mapped = 0;
        if (!o->data) return -1;
    }
    return 0;
}

static PyObject *kscan_arrow(PyObject *self, PyObject *args) {
    Py_ssize_t n;
    PyObject *cols;
    if (!PyArg_ParseTuple(args, "nO!", &n, &PyList_Type, &cols)) return NULL;
    Py_ssize_t k = PyList_GET_SIZE(cols);
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "n must be >= 0");
        return NULL;
    }
    /* Check everything before moving anything: a bad argument leaves the MBufs as they were (running out of memory
       part-way leaves the columns moved so far empty). */
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *t = PyList_GET_ITEM(cols, i), *name, *data, *valid;
        const char *fmt;
        Py_ssize_t nulls;
        if (!PyArg_ParseTuple(t, "UsOOn", &name, &fmt, &data, &valid, &nulls)) return NULL;
        if (!PyUnicode_AsUTF8(name)) return NULL; /* (a lone surrogate) here, not once memory has moved */
        Py_ssize_t w = fmt_width(fmt);
        if (!w) {
            PyErr_Format(PyExc_ValueError, "format %s: expected l, i or I", fmt);
            return NULL;
        }
        if (!PyObject_TypeCheck(data, &MBufType) || (valid != Py_None && !PyObject_TypeCheck(valid, &MBufType))) {
            PyErr_SetString(PyExc_TypeError, "columns are MBufs (from take() or nest())");
            return NULL;
        }
        MBuf *d = (MBuf *)data, *v = valid == Py_None ? NULL : (MBuf *)valid;
        if (d->len < n * w || (v && v->len < (n + 7) / 8)) {
            PyErr_SetString(PyExc_ValueError, "buffers shorter than n");
            return NULL;
        }
        if (nulls < 0 || nulls > n || (nulls && !v)) {
            PyErr_SetString(PyExc_ValueError, "null count out of range, or nulls without a validity buffer");
            return NULL;
        }
        if (d->exports || (v && v->exports)) {
            PyErr_SetString(PyExc_BufferError, "a buffer view is open on a column: its memory cannot move");
            return NULL;
        }
        for (Py_ssize_t j = 0; j < i; j++) { /* one buffer in two places would be freed twice */
            PyObject *u = PyList_GET_ITEM(cols, j);
            PyObject *ud = PyTuple_GET_ITEM(u, 2), *uv = PyTuple_GET_ITEM(u, 3);
            if (ud == data || (valid != Py_None && (uv == valid || ud == valid)) || uv == data) {
                PyErr_SetString(PyExc_ValueError, "a buffer appears twice");
                return NULL;
            }
        }
        if (valid == data) {
            PyErr_SetString(PyExc_ValueError, "a buffer appears twice");
            return NULL;
        }
    }
    struct ArrowSchema *sch = calloc(1, sizeof *sch);
    struct ArrowArray *arr = calloc(1, sizeof *arr);
    if (!sch || !arr) goto nomem;
    sch->format = "+s";
    sch->name = "";
    sch->release = struct_schema_release;
    sch->children = calloc((size_t)(k ? k : 1), sizeof *sch->children);
    arr->length = n;
    arr->n_buffers = 1;
    arr->release = struct_array_release;
    arr->buffers = calloc(1, sizeof *arr->buffers); /* the struct's validity: none, every row is there */
    arr->children = calloc((size_t)(k ? k : 1), sizeof *arr->children);
    if (!sch->children || !arr->buffers || !arr->children) goto nomem;
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *t = PyList_GET_ITEM(cols, i);
        const char *fmt = PyUnicode_AsUTF8(PyTuple_GET_ITEM(t, 1));
        const char *name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(t, 0));
        if (!fmt || !name) goto fail;
        PyObject *valid = PyTuple_GET_ITEM(t, 3);
        Py_ssize_t nulls = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, 4));
        struct ArrowSchema *cs = calloc(1, sizeof *cs);
        if (!cs) goto nomem;
        sch->children[i] = cs;
        sch->n_children = i + 1;
        cs->format = fmt_static(fmt);
        cs->name = strdup(name);
        cs->flags = ARROW_FLAG_NULLABLE;
        cs->release = child_schema_release;
        if (!cs->name) goto nomem;
        struct ArrowArray *ca = calloc(1, sizeof *ca);
        ChildData *cd = calloc(1, sizeof *cd);
        if (!ca || !cd) {
            free(ca);
            free(cd);
            goto nomem;
        }
        arr->children[i] = ca;
        arr->n_children = i + 1;
        ca->private_data = cd;
        ca->release = child_array_release;
        ca->length = n;
        ca->null_count = nulls;
        ca->n_buffers = 2;
        ca->buffers = cd->bufs;
        if (mbuf_move((MBuf *)PyTuple_GET_ITEM(t, 2), &cd->data) < 0) goto nomem;
        if (nulls) {
            if (mbuf_move((MBuf *)valid, &cd->valid) < 0) goto nomem;
            cd->bufs[0] = cd->valid.data;
        }
        cd->bufs[1] = cd->data.data;
    }
    PyObject *s_cap = PyCapsule_New(sch, "arrow_schema", schema_capsule_free);
    if (!s_cap) goto fail;
    sch = NULL;
    PyObject *a_cap = PyCapsule_New(arr, "arrow_array", array_capsule_free);
    if (!a_cap) {
        Py_DECREF(s_cap);
        goto fail;
    }
    return Py_BuildValue("(NN)", s_cap, a_cap);
nomem:
    PyErr_NoMemory();
fail:
    if (sch) {
        if (sch->release) sch->release(sch);
        free(sch);
    }
    if (arr) {
        if (arr->release) arr->release(arr);
        free(arr);
    }
    return NULL;
}

/* A column the nesting sweep reads: a buffer (bytes, MBuf...) or an Arrow array of one chunk without nulls from
 * obj.__arrow_c_stream__() (a polars Series), read where it lies. */
typedef struct {
    const char *data;
    Py_buffer view;
    int has_view;
    PyObject *capsule;
    struct ArrowArray arr;
} InCol;

static int incol_open(InCol *c, PyObject *obj, const char *fmt, Py_ssize_t width, Py_ssize_t n) {
    memset(c, 0, sizeof *c);
    if (PyObject_CheckBuffer(obj)) {
        if (PyObject_GetBuffer(obj, &c->view, PyBUF_SIMPLE) < 0) return -1;
        c->has_view = 1;
        if (c->view.len < n * width) {
            PyErr_SetString(PyExc_ValueError, "buffers shorter than n");
            return -1;
        }
        c->data = c->view.buf;
        return 0;
    }
    c->capsule = PyObject_CallMethod(obj, "__arrow_c_stream__", NULL);
    if (!c->capsule) return -1;
    struct ArrowArrayStream *st = PyCapsule_GetPointer(c->capsule, "arrow_array_stream");
    if (!st || !st->release) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a released Arrow stream");
        return -1;
    }
    struct ArrowSchema sch;
    memset(&sch, 0, sizeof sch);
    if (st->get_schema(st, &sch) != 0) {
        PyErr_SetString(PyExc_ValueError, "the Arrow stream gave no schema");
        return -1;
    }
    int same = sch.format && !strcmp(sch.format, fmt);
    if (sch.release) sch.release(&sch);
    if (!same) {
        PyErr_Format(PyExc_TypeError, "expected an Arrow column of format %s", fmt);
        return -1;
    }
    if (st->get_next(st, &c->arr) != 0) {
        PyErr_SetString(PyExc_ValueError, "the Arrow stream failed");
        return -1;
    }
    if (!c->arr.release) { /* no chunk at all: only right for no rows */
        if (n) {
            PyErr_SetString(PyExc_ValueError, "buffers shorter than n");
            return -1;
        }
        c->data = "";
        return 0;
    }
    struct ArrowArray more;
    memset(&more, 0, sizeof more);
    if (st->get_next(st, &more) != 0) {
        PyErr_SetString(PyExc_ValueError, "the Arrow stream failed");
        return -1;
    }
    if (more.release) {
        more.release(&more);
        PyErr_SetString(PyExc_ValueError, "an Arrow column of more than one chunk (rechunk it)");
        return -1;
    }
    if (c->arr.length != n || c->arr.n_buffers != 2 || c->arr.offset < 0 ||
        (c->arr.null_count != 0 && c->arr.buffers[0] != NULL) || (n && !c->arr.buffers[1])) {
        PyErr_SetString(PyExc_ValueError, "an Arrow column of another length, or with nulls");
        return -1;
    }
    c->data = n ? (const char *)c->arr.buffers[1] + c->arr.offset * width : "";
    return 0;
}

static void incol_close(InCol *c) {
    if (c->has_view) PyBuffer_Release(&c->view);
    if (c->arr.release) c->arr.release(&c->arr);
    Py_XDECREF(c->capsule);
    c->has_view = 0;
    c->capsule = NULL;
}

/* nest(ts, end, flags, rows, n) -> (parent, depth): the host-op nesting sweep of kineto._nest over intervals sorted
 * by (pid, tid, ts, -end). ts/end: int64; flags: uint8 (1: first row of a thread, 2: ts is null); rows: uint32, the
 * original row of each sorted one; each a buffer or an Arrow column (a polars Series of one chunk, no nulls). parent:
 * int64 per original row, -1 for none; depth: int32; both MBufs, for arrow(). */
static PyObject *kscan_nest(PyObject *self, PyObject *args) {
    PyObject *ots, *oend, *oflags, *orows;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "OOOOn", &ots, &oend, &oflags, &orows, &n)) return NULL;
    PyObject *result = NULL;
    MBuf *parent = NULL, *depth = NULL;
    int64_t *stack = NULL; /* triples: end, start, row */
    InCol cts, cend, cflags, crows;
    memset(&cend, 0, sizeof cend);
    memset(&cflags, 0, sizeof cflags);
    memset(&crows, 0, sizeof crows);
    if (n < 0) {
        memset(&cts, 0, sizeof cts);
        PyErr_SetString(PyExc_ValueError, "buffers shorter than n");
        goto out;
    }
    if (incol_open(&cts, ots, "l", 8, n) < 0 || incol_open(&cend, oend, "l", 8, n) < 0 ||
        incol_open(&cflags, oflags, "C", 1, n) < 0 || incol_open(&crows, orows, "I", 4, n) < 0)
        goto out;
    parent = mbuf_new();
    depth = mbuf_new();
    if (!parent || !depth) goto out;
    if (mbuf_reserve(parent, n ? n * 8 : 8) < 0 || mbuf_reserve(depth, n ? n * 4 : 8) < 0) {
        PyErr_NoMemory();
        goto out;
    }
    parent->len = n * 8;
    depth->len = n * 4;
    int64_t *par = (int64_t *)parent->data;
    int32_t *dep = (int32_t *)depth->data;
    const int64_t *ts = (const int64_t *)cts.data, *end = (const int64_t *)cend.data;
    const uint8_t *flags = (const uint8_t *)cflags.data;
    const uint32_t *rows = (const uint32_t *)crows.data;
    for (Py_ssize_t i = 0; i < n; i++) {
        par[i] = -1;
        dep[i] = 0;
    }
    Py_ssize_t top = 0, cap = 0;
    int bad = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        if (flags[k] & 1) top = 0;
        if (flags[k] & 2) continue;
        int64_t t = ts[k];
        while (top && stack[3 * (top - 1)] <= t && stack[3 * (top - 1) + 1] != t) top--;
        uint32_t r = rows[k];
        if (r >= (uint64_t)n) { bad = 1; break; }
        if (top) {
            par[r] = stack[3 * (top - 1) + 2];
            dep[r] = (int32_t)(top > INT32_MAX ? INT32_MAX : top);
        }
        if (top == cap) {
            Py_ssize_t ncap = cap ? cap * 2 : 256;
            int64_t *ns = realloc(stack, (size_t)ncap * 3 * sizeof(int64_t));
            if (!ns) { bad = 2; break; }
            stack = ns;
            cap = ncap;
        }
        stack[3 * top] = end[k];
        stack[3 * top + 1] = t;
        stack[3 * top + 2] = r;
        top++;
    }
    if (bad) {
        if (bad == 2) PyErr_NoMemory();
        else PyErr_SetString(PyExc_ValueError, "row index out of range");
        goto out;
    }
    result = Py_BuildValue("(OO)", parent, depth);
out:
    free(stack);
    Py_XDECREF(parent);
    Py_XDECREF(depth);
    incol_close(&cts);
    incol_close(&cend);
    incol_close(&cflags);
    incol_close(&crows);
    return result;
}

static PyMethodDef methods[] = {
    {"nest", kscan_nest, METH_VARARGS,
     "nest(ts, end, flags, rows, n) -> (parent, depth): the per-thread nesting sweep over sorted intervals."},
    {"arrow", kscan_arrow, METH_VARARGS,
     "arrow(n, [(name, format, data, validity or None, nulls)]) -> (schema, array) capsules of one struct array;\n"
     "the MBufs' memory moves into it."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kscan", "Kineto event scanner (see _kscan.c).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__kscan(void) {
    if (PyType_Ready(&ScannerType) < 0 || PyType_Ready(&MBufType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    if (PyModule_AddObjectRef(m, "Scanner", (PyObject *)&ScannerType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
