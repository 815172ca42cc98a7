/* kvpool.tiers._hostprobe: a same-host reader's probe of a node's host index (tiers/host_index.py) in C.

The probe of a 32-key chain is ~20 numpy calls: ~55-90 us on a quiet core, but 150-200 us inside a get, whose
copies have just evicted the interpreter's and numpy's working set from the caches. This is the same probe as
HostIndex.find, key by key: the bucket of a key is the top bits of k0 * M0 ^ k1 * M1; each of its WAYS rows is
read into locals (a snapshot, as numpy's copy was) and taken only when its key words are the key's and its seal
(words 0-6 each times its own odd constant, summed mod 2^64, | 1) matches: a row torn by a concurrent write is a
miss. The probe stops at the first key not found. The GIL is held: it is a few hundred loads.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define WAYS 4
#define SLOT_WORDS 8
#define KEY_BYTES 16

static const uint64_t M0 = 0x9E3779B97F4A7C15ULL, M1 = 0xC2B2AE3D27D4EB4FULL;
static const uint64_t WORD_MUL[7] = {0x9E3779B97F4A7C15ULL, 0xC2B2AE3D27D4EB4FULL, 0x165667B19E3779F9ULL,
                                     0xD6E8FEB86659FD93ULL, 0x27D4EB2F165667C5ULL, 0x94D049BB133111EBULL,
                                     0xBF58476D1CE4E5B9ULL};

static inline uint64_t rd64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }  /* little-endian hosts */

static PyObject *py_find(PyObject *self, PyObject *args) {
    Py_buffer region, keys;
    int shift;
    if (!PyArg_ParseTuple(args, "y*y*i", &region, &keys, &shift)) return NULL;
    PyObject *out = NULL, *offsets = NULL, *sizes = NULL, *checksums = NULL, *places = NULL;
    Py_ssize_t buckets = region.len / (WAYS * SLOT_WORDS * 8);
    if (shift < 1 || shift > 63 || ((Py_ssize_t)1 << (64 - shift)) != buckets ||
        buckets * WAYS * SLOT_WORDS * 8 != region.len) {
        PyErr_Format(PyExc_ValueError, "shift %d does not match a region of %zd bytes", shift, region.len);
        goto done;
    }
    if (keys.len % KEY_BYTES) {
        PyErr_Format(PyExc_ValueError, "keys must be 16-byte keys joined, got %zd bytes", keys.len);
        goto done;
    }
    offsets = PyList_New(0);
    sizes = PyList_New(0);
    checksums = PyList_New(0);
    places = PyList_New(0);
    if (!offsets || !sizes || !checksums || !places) goto done;
    const volatile uint64_t *rows = (const volatile uint64_t *)region.buf;
    for (Py_ssize_t i = 0; i < keys.len / KEY_BYTES; i++) {
        const uint8_t *k = (const uint8_t *)keys.buf + i * KEY_BYTES;
        uint64_t k0 = rd64(k), k1 = rd64(k + 8);
        uint64_t bucket = (k0 * M0 ^ k1 * M1) >> shift;
        int found = 0;
        uint64_t w[SLOT_WORDS];
        for (int way = 0; way < WAYS && !found; way++) {
            const volatile uint64_t *row = rows + (bucket * WAYS + (uint64_t)way) * SLOT_WORDS;
            for (int j = 0; j < SLOT_WORDS; j++) w[j] = row[j];
            if (w[0] != k0 || w[1] != k1) continue;
            uint64_t seal = 0;
            for (int j = 0; j < 7; j++) seal += w[j] * WORD_MUL[j];
            found = w[7] == (seal | 1);
        }
        if (!found) break;
        PyObject *o = PyLong_FromUnsignedLongLong(w[2]), *s = PyLong_FromUnsignedLongLong(w[3]),
                 *c = PyLong_FromUnsignedLongLong(w[4]), *p = PyLong_FromUnsignedLongLong(w[6]);
        int bad = !o || !s || !c || !p || PyList_Append(offsets, o) < 0 || PyList_Append(sizes, s) < 0 ||
                  PyList_Append(checksums, c) < 0 || PyList_Append(places, p) < 0;
        Py_XDECREF(o);
        Py_XDECREF(s);
        Py_XDECREF(c);
        Py_XDECREF(p);
        if (bad) goto done;
    }
    out = PyTuple_Pack(4, offsets, sizes, checksums, places);
done:
    Py_XDECREF(offsets);
    Py_XDECREF(sizes);
    Py_XDECREF(checksums);
    Py_XDECREF(places);
    PyBuffer_Release(&region);
    PyBuffer_Release(&keys);
    return out;
}

static PyMethodDef methods[] = {
    {"find", py_find, METH_VARARGS,
     "find(region, joined_keys, shift) -> (offsets, sizes, checksums, places) of the leading keys found in the host "
     "index `region` (buckets = 2 ** (64 - shift)), in order; stops at the first key not found. places[i]: 0 = a "
     "DRAM extent, 1 = an SSD record (tiers/host_index.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "kvpool.tiers._hostprobe", NULL, -1, methods};

PyMODINIT_FUNC PyInit__hostprobe(void) { return PyModule_Create(&module); }
