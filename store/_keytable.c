/* kvpool.store._keytable: the master index's key <-> slot map (store/keytable.py) without a Python object per key.

A dict from 16-byte bytes keys to int slots costs ~126 B per object: the key's bytes object (49 B), the slot's int
object (28 B), the dict's entry and index (~41 B), and the slot -> key list's pointer (8 B). This table keeps:

    keys   16 B per slot   the key stored at each slot (the slot -> key direction; kept while a DOOMED slot waits)
    flags   1 B per slot   HAS_KEY (the slot holds a key), LINKED (the key is findable: the table points at it)
    table   4 B per entry  open addressing, linear probing, slot + 1 or EMPTY (0), at most half full

so ~25-33 B per object.

Growth without a pause: when the table would pass half full, a table twice the size is allocated (calloc: zero
pages, nothing written) and the old one is moved into it a little at every link / unlink (MOVE_STEP entries), not
all at once (a rehash of 2M keys held the master's lock ~0.36 s). While both exist a key is in exactly one of them
and lookups probe the new one, then the old. The move goes round the old table from just after an empty entry and
stops only just after an empty entry, so it takes whole clusters: a key still in the old table has its whole probe
path there, and removing one shifts entries within its own cluster only. The old table never gets an insert.

A key's home entry is its hash, `_Py_HashBytes` (the hash of an equal bytes object: SipHash
with this process's random seed, so a client cannot choose keys that collide), masked to the table's size. Removal
shifts the entries after it back (no tombstones), so a miss stops at the first empty entry. A lookup compares the
probed slot's stored key with the query's 16 bytes. Memory comes from PyMem_Raw* (tracemalloc sees it). The GIL is
held throughout: the master calls under its lock, each call a few loads.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define KEY_BYTES 16
#define EMPTY 0          /* a table entry holds slot + 1 */
#define HAS_KEY 1
#define LINKED 2
#define MIN_TABLE 64
#define MOVE_STEP 64      /* old-table entries visited per link / unlink while the table grows */
#define MAX_SLOTS ((Py_ssize_t)1 << 31)

typedef struct {
    PyObject_HEAD
    uint8_t *keys;        /* cap * KEY_BYTES */
    uint8_t *flags;       /* cap */
    Py_ssize_t cap;       /* slots with room for a key */
    uint32_t *table;      /* size entries: slot + 1, or EMPTY */
    Py_ssize_t size;      /* a power of two */
    Py_ssize_t linked;    /* keys findable (in table or old) */
    uint32_t *old;        /* the table being moved into `table` while it grows, else NULL */
    Py_ssize_t old_size;
    Py_ssize_t old_start; /* the first old entry the move visits: just after an empty one */
    Py_ssize_t old_done;  /* old entries visited so far, from old_start on */
} KeyTable;

static inline uint64_t hash16(const uint8_t *key) {
#if PY_VERSION_HEX >= 0x030E0000
    return (uint64_t)Py_HashBuffer(key, KEY_BYTES);
#else
    return (uint64_t)_Py_HashBytes(key, KEY_BYTES);
#endif
}

/* The 16 bytes of `obj` (bytes, or any contiguous buffer) into out; 0 if it is not a 16-byte key (no buffer, or
   another length): a lookup of it finds nothing, as a dict's of a key of another type. */
static int key_bytes(PyObject *obj, uint8_t out[KEY_BYTES]) {
    if (PyBytes_Check(obj)) {
        if (PyBytes_GET_SIZE(obj) != KEY_BYTES) return 0;
        memcpy(out, PyBytes_AS_STRING(obj), KEY_BYTES);
        return 1;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        return 0;
    }
    int ok = view.len == KEY_BYTES;
    if (ok) memcpy(out, view.buf, KEY_BYTES);
    PyBuffer_Release(&view);
    return ok;
}

static inline const uint8_t *key_of(const KeyTable *t, uint32_t entry) {
    return t->keys + (Py_ssize_t)(entry - 1) * KEY_BYTES;
}

/* The entry of `table` (of `size` entries) holding the slot whose key is `key`, or -1. */
static Py_ssize_t probe(const KeyTable *t, const uint32_t *table, Py_ssize_t size, const uint8_t *key, uint64_t h) {
    Py_ssize_t mask = size - 1, i = (Py_ssize_t)(h & (uint64_t)mask);
    for (;;) {
        uint32_t entry = table[i];
        if (entry == EMPTY) return -1;
        if (memcmp(key_of(t, entry), key, KEY_BYTES) == 0) return i;
        i = (i + 1) & mask;
    }
}

/* Where the slot of `key` is: its entry, in the new table (*in_old 0) or the old one (*in_old 1); -1 if nowhere. */
static Py_ssize_t find_entry(const KeyTable *t, const uint8_t *key, uint64_t h, int *in_old) {
    Py_ssize_t i = probe(t, t->table, t->size, key, h);
    *in_old = 0;
    if (i < 0 && t->old) {
        i = probe(t, t->old, t->old_size, key, h);
        *in_old = i >= 0;
    }
    return i;
}

static void insert_entry(uint32_t *table, Py_ssize_t size, uint32_t entry, uint64_t h) {
    Py_ssize_t mask = size - 1, i = (Py_ssize_t)(h & (uint64_t)mask);
    while (table[i] != EMPTY) i = (i + 1) & mask;
    table[i] = entry;
}

/* Visit up to `budget` more old entries (going on past the budget to the end of a cluster), moving each key into
   the new table; the old table is freed once every entry was visited. */
static void move_some(KeyTable *t, Py_ssize_t budget) {
    if (!t->old) return;
    Py_ssize_t mask = t->old_size - 1;
    int in_cluster = 0;
    while (t->old_done < t->old_size && (budget > 0 || in_cluster)) {
        Py_ssize_t i = (t->old_start + t->old_done) & mask;
        uint32_t entry = t->old[i];
        in_cluster = entry != EMPTY;
        if (in_cluster) {
            insert_entry(t->table, t->size, entry, hash16(key_of(t, entry)));
            t->old[i] = EMPTY;
        }
        t->old_done++;
        budget--;
    }
    if (t->old_done == t->old_size) {
        PyMem_RawFree(t->old);
        t->old = NULL;
        t->old_size = t->old_start = t->old_done = 0;
    }
}

/* Start moving into a table twice the size (a move still going is finished first: never so at MOVE_STEP). */
static int grow_table(KeyTable *t) {
    move_some(t, PY_SSIZE_T_MAX);
    Py_ssize_t size = t->size * 2;
    uint32_t *table = PyMem_RawCalloc((size_t)size, sizeof(uint32_t));    /* every entry EMPTY */
    if (!table) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t start = 0;
    while (t->table[start] != EMPTY) start++;      /* at most half full: there is one */
    t->old = t->table;
    t->old_size = t->size;
    t->old_start = (start + 1) & (t->size - 1);
    t->old_done = 0;
    t->table = table;
    t->size = size;
    return 0;
}

static int reserve_slots(KeyTable *t, Py_ssize_t cap) {
    if (cap <= t->cap) return 0;
    if (cap > MAX_SLOTS) {
        PyErr_Format(PyExc_OverflowError, "slot: at most %zd slots", MAX_SLOTS);
        return -1;
    }
    uint8_t *keys = PyMem_RawRealloc(t->keys, (size_t)cap * KEY_BYTES);
    if (!keys) {
        PyErr_NoMemory();
        return -1;
    }
    t->keys = keys;
    uint8_t *flags = PyMem_RawRealloc(t->flags, (size_t)cap);
    if (!flags) {
        PyErr_NoMemory();
        return -1;
    }
    memset(flags + t->cap, 0, (size_t)(cap - t->cap));
    t->flags = flags;
    t->cap = cap;
    return 0;
}

/* Remove entry i of `table`, shifting back the entries of its cluster that may move (backward-shift deletion). */
static void remove_entry(const KeyTable *t, uint32_t *table, Py_ssize_t size, Py_ssize_t i) {
    Py_ssize_t mask = size - 1, j = i;
    for (;;) {
        j = (j + 1) & mask;
        uint32_t entry = table[j];
        if (entry == EMPTY) break;
        Py_ssize_t home = (Py_ssize_t)(hash16(key_of(t, entry)) & (uint64_t)mask);
        if (((j - home) & mask) >= ((j - i) & mask)) {    /* i lies on the probe path from its home to j */
            table[i] = entry;
            i = j;
        }
    }
    table[i] = EMPTY;
}

static int slot_arg(PyObject *obj, Py_ssize_t *slot) {
    *slot = PyNumber_AsSsize_t(obj, PyExc_OverflowError);
    if (*slot == -1 && PyErr_Occurred()) return -1;
    if (*slot < 0 || *slot >= MAX_SLOTS) {
        PyErr_Format(PyExc_ValueError, "slot: must be in [0, %zd), got %zd", MAX_SLOTS, *slot);
        return -1;
    }
    return 0;
}

static PyObject *kt_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"slots", NULL};
    Py_ssize_t slots = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|n", kwlist, &slots)) return NULL;
    KeyTable *t = (KeyTable *)type->tp_alloc(type, 0);
    if (!t) return NULL;
    t->table = PyMem_RawCalloc(MIN_TABLE, sizeof(uint32_t));
    if (!t->table) {
        Py_DECREF(t);
        return PyErr_NoMemory();
    }
    t->size = MIN_TABLE;
    if (slots < 0 || reserve_slots(t, slots) < 0) {
        if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "slots: must be >= 0, got %zd", slots);
        Py_DECREF(t);
        return NULL;
    }
    return (PyObject *)t;
}

static void kt_dealloc(KeyTable *t) {
    PyMem_RawFree(t->keys);
    PyMem_RawFree(t->flags);
    PyMem_RawFree(t->table);
    PyMem_RawFree(t->old);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

/* get(key, default=None): the slot `key` is linked to, else default. */
static PyObject *kt_get(KeyTable *t, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_Format(PyExc_TypeError, "get expected 1 or 2 arguments, got %zd", nargs);
        return NULL;
    }
    PyObject *fallback = nargs == 2 ? args[1] : Py_None;
    uint8_t key[KEY_BYTES];
    int in_old = 0;
    Py_ssize_t i = key_bytes(args[0], key) ? find_entry(t, key, hash16(key), &in_old) : -1;
    if (i < 0) {
        Py_INCREF(fallback);
        return fallback;
    }
    return PyLong_FromLong((long)(in_old ? t->old : t->table)[i] - 1);
}

static int kt_contains(KeyTable *t, PyObject *obj) {
    uint8_t key[KEY_BYTES];
    int in_old;
    if (!key_bytes(obj, key)) return 0;
    return find_entry(t, key, hash16(key), &in_old) >= 0;
}

static Py_ssize_t kt_len(KeyTable *t) { return t->linked; }

/* link(key, slot): store `key` at `slot` and make it findable. The key must be 16 bytes and not linked, the slot
   must hold no key; nothing changes otherwise. */
static PyObject *kt_link(KeyTable *t, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "link expected 2 arguments, got %zd", nargs);
        return NULL;
    }
    uint8_t key[KEY_BYTES];
    Py_ssize_t slot;
    if (!key_bytes(args[0], key)) {
        PyErr_Format(PyExc_ValueError, "key: must be %d bytes", KEY_BYTES);
        return NULL;
    }
    if (slot_arg(args[1], &slot) < 0) return NULL;
    uint64_t h = hash16(key);
    int in_old;
    if (find_entry(t, key, h, &in_old) >= 0) {
        PyErr_Format(PyExc_KeyError, "key %R already linked", args[0]);
        return NULL;
    }
    if (slot < t->cap && t->flags[slot]) {
        PyErr_Format(PyExc_ValueError, "slot: %zd already holds a key", slot);
        return NULL;
    }
    if (slot >= t->cap && reserve_slots(t, slot + 1 > 2 * t->cap ? slot + 1 : 2 * t->cap) < 0) return NULL;
    if ((t->linked + 1) * 2 > t->size && grow_table(t) < 0) return NULL;
    memcpy(t->keys + slot * KEY_BYTES, key, KEY_BYTES);
    t->flags[slot] = HAS_KEY | LINKED;
    insert_entry(t->table, t->size, (uint32_t)slot + 1, h);
    t->linked++;
    move_some(t, MOVE_STEP);
    Py_RETURN_NONE;
}

static int unlink_slot(KeyTable *t, Py_ssize_t slot) {
    if (slot >= t->cap || !(t->flags[slot] & LINKED)) return 0;
    const uint8_t *key = t->keys + slot * KEY_BYTES;
    int in_old;
    Py_ssize_t i = find_entry(t, key, hash16(key), &in_old);
    uint32_t *table = in_old ? t->old : t->table;
    if (i >= 0 && table[i] == (uint32_t)slot + 1) {    /* always so: a linked slot's key is linked to it */
        remove_entry(t, table, in_old ? t->old_size : t->size, i);
        t->linked--;
    }
    t->flags[slot] &= (uint8_t)~LINKED;
    move_some(t, MOVE_STEP);
    return 1;
}

/* unlink(slot) -> bool: the slot's key is no longer findable (the slot keeps it: key_at still answers). */
static PyObject *kt_unlink(KeyTable *t, PyObject *obj) {
    Py_ssize_t slot;
    if (slot_arg(obj, &slot) < 0) return NULL;
    return PyBool_FromLong(unlink_slot(t, slot));
}

/* clear(slot): unlink it and forget its key (a free slot). */
static PyObject *kt_clear(KeyTable *t, PyObject *obj) {
    Py_ssize_t slot;
    if (slot_arg(obj, &slot) < 0) return NULL;
    unlink_slot(t, slot);
    if (slot < t->cap) t->flags[slot] = 0;
    Py_RETURN_NONE;
}

static PyObject *key_object(const KeyTable *t, Py_ssize_t slot) {
    if (slot < 0 || slot >= t->cap || !(t->flags[slot] & HAS_KEY)) Py_RETURN_NONE;
    return PyBytes_FromStringAndSize((const char *)t->keys + slot * KEY_BYTES, KEY_BYTES);
}

/* key_at(slot): the key the slot holds (linked or not), or None. */
static PyObject *kt_key_at(KeyTable *t, PyObject *obj) {
    Py_ssize_t slot = PyNumber_AsSsize_t(obj, PyExc_OverflowError);
    if (slot == -1 && PyErr_Occurred()) return NULL;
    return key_object(t, slot);
}

/* keys_of(slots): [key_at(s) for s in slots]. */
static PyObject *kt_keys_of(KeyTable *t, PyObject *obj) {
    PyObject *seq = PySequence_Fast(obj, "slots: must be a sequence of ints");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out && i < n; i++) {
        Py_ssize_t slot = PyNumber_AsSsize_t(PySequence_Fast_GET_ITEM(seq, i), PyExc_OverflowError);
        PyObject *key = slot == -1 && PyErr_Occurred() ? NULL : key_object(t, slot);
        if (!key) Py_CLEAR(out);
        else PyList_SET_ITEM(out, i, key);
    }
    Py_DECREF(seq);
    return out;
}

/* linked(): [(key, slot)] of every findable key, in slot order. */
static PyObject *kt_linked(KeyTable *t, PyObject *Py_UNUSED(ignored)) {
    PyObject *out = PyList_New(0);
    for (Py_ssize_t slot = 0; out && slot < t->cap; slot++) {
        if (!(t->flags[slot] & LINKED)) continue;
        PyObject *pair = Py_BuildValue("(y#n)", (const char *)t->keys + slot * KEY_BYTES, (Py_ssize_t)KEY_BYTES,
                                       slot);
        if (!pair || PyList_Append(out, pair) < 0) Py_CLEAR(out);
        Py_XDECREF(pair);
    }
    return out;
}

/* reserve(slots): room for keys at slots [0, slots) without another allocation. */
static PyObject *kt_reserve(KeyTable *t, PyObject *obj) {
    Py_ssize_t cap = PyNumber_AsSsize_t(obj, PyExc_OverflowError);
    if (cap == -1 && PyErr_Occurred()) return NULL;
    if (reserve_slots(t, cap) < 0) return NULL;
    Py_RETURN_NONE;
}

/* stats(): (slots with room, table entries, linked keys, bytes held, old-table entries still to visit: 0 when the
   table is not growing) for tests and the memory figure. */
static PyObject *kt_stats(KeyTable *t, PyObject *Py_UNUSED(ignored)) {
    Py_ssize_t held = t->cap * (KEY_BYTES + 1) + (t->size + t->old_size) * (Py_ssize_t)sizeof(uint32_t);
    return Py_BuildValue("(nnnnn)", t->cap, t->size, t->linked, held, t->old_size - t->old_done);
}

/* settle(): finish a growth still under way now (tests; a bench's one-pause reference). */
static PyObject *kt_settle(KeyTable *t, PyObject *Py_UNUSED(ignored)) {
    move_some(t, PY_SSIZE_T_MAX);
    Py_RETURN_NONE;
}

static PyMethodDef kt_methods[] = {
    {"get", (PyCFunction)(void (*)(void))kt_get, METH_FASTCALL, "get(key, default=None): the key's slot, else default"},
    {"link", (PyCFunction)(void (*)(void))kt_link, METH_FASTCALL, "link(key, slot): store key at slot, findable"},
    {"unlink", (PyCFunction)kt_unlink, METH_O, "unlink(slot) -> bool: its key no longer findable, still held"},
    {"clear", (PyCFunction)kt_clear, METH_O, "clear(slot): unlink it and forget its key"},
    {"key_at", (PyCFunction)kt_key_at, METH_O, "key_at(slot): the key it holds, or None"},
    {"keys_of", (PyCFunction)kt_keys_of, METH_O, "keys_of(slots): [key_at(s) for s in slots]"},
    {"linked", (PyCFunction)kt_linked, METH_NOARGS, "linked(): [(key, slot)] of findable keys, in slot order"},
    {"reserve", (PyCFunction)kt_reserve, METH_O, "reserve(slots): room for keys at slots below `slots`"},
    {"stats", (PyCFunction)kt_stats, METH_NOARGS,
     "stats(): (slots, table entries, linked, bytes held, old entries still to move)"},
    {"settle", (PyCFunction)kt_settle, METH_NOARGS, "settle(): finish a growth under way now"},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods kt_as_sequence = {
    .sq_length = (lenfunc)kt_len,
    .sq_contains = (objobjproc)kt_contains,
};

static PyTypeObject KeyTableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvpool.store._keytable.KeyTable",
    .tp_basicsize = sizeof(KeyTable),
    .tp_dealloc = (destructor)kt_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "16-byte key <-> int slot map of the master's index (store/keytable.py)",
    .tp_new = kt_new,
    .tp_methods = kt_methods,
    .tp_as_sequence = &kt_as_sequence,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "kvpool.store._keytable", NULL, -1, NULL};

PyMODINIT_FUNC PyInit__keytable(void) {
    if (PyType_Ready(&KeyTableType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&KeyTableType);
    if (PyModule_AddObject(m, "KeyTable", (PyObject *)&KeyTableType) < 0) {
        Py_DECREF(&KeyTableType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
