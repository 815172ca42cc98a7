/* kvpool._copyhash: copy a buffer and return the XXH3-64 (seed 0) of the bytes that landed, in one pass.

The read fence (kvpool/fence.py) keeps a copied object only if its bytes hash to the committed checksum. Copying
and then hashing reads the object twice; here each 64-byte stripe is loaded once, stored to the destination and
folded into the hash from the same registers, so the check costs arithmetic the core does while it waits for
memory, not a second pass. The digest is the one xxhash.xxh3_64_intdigest gives for the stored bytes (tests compare
them over thousands of lengths and alignments), computed with XXH3's long-input algorithm (inputs over 240 bytes):
8 64-bit accumulators, 16 stripes of 64 bytes per 1 KiB block, a scramble after each block, a last stripe ending at
the input's end, then the accumulators merged and avalanched. Inputs of 240 bytes or fewer are refused
(ValueError): XXH3 hashes those with other formulas, and the caller hashes them itself (fence.copy_verified).

What is hashed is what was stored: every stripe's digest input is the register that was written to the
destination, and the last stripe is read back from the destination. A peer that changes the source during the
copy therefore makes a mismatch, never a match over bytes other than those returned.

AVX2 where the CPU has it (checked at run time), portable C elsewhere; the GIL is released during the copy.

The SSD tier's verified record reads live here too (read_records), because they are XXH3 work: tiers/ssd.py owns
the record format and its Python reader; this is that reader's native twin, used where every payload is over 240
bytes (the short-input formulas are not here), and tests run both over the same good and damaged records. The
Python reader spent ~4 us of interpreter time per 64 KiB record (iovecs built, header unpacked and hashed, the
arguments checked), a fifth of an SSD get's time from the page cache; here a whole call is one C loop with the
GIL released: arguments checked, records sorted by offset, adjacent ones read with one preadv per run, each header
(its XXH3 over 56 or 72 bytes) and payload verified.
*/
#include <errno.h>
#include <stdlib.h>
#include <sys/uio.h>
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define KV_X86 1
#else
#define KV_X86 0
#endif

#define STRIPE 64
#define BLOCK 1024          /* 16 stripes: (secret size 192 - 64) / 8 bytes of secret consumed per stripe */
#define MIN_LEN 241

/* XXH3's default secret and primes (the xxHash specification, version 0.8) */
static const uint8_t SECRET[192] = {
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};
#define P32_1 0x9E3779B1U
#define P32_2 0x85EBCA77U
#define P32_3 0xC2B2AE3DU
#define P64_1 0x9E3779B185EBCA87ULL
#define P64_2 0xC2B2AE3D27D4EB4FULL
#define P64_3 0x165667B19E3779F9ULL
#define P64_4 0x85EBCA77C2B2AE63ULL
#define P64_5 0x27D4EB2F165667C5ULL
#define SCRAMBLE_AT (192 - STRIPE)          /* secret offset of the scramble after each block */
#define LAST_STRIPE_AT (192 - STRIPE - 7)   /* secret offset of the last stripe */
#define MERGE_AT 11                         /* secret offset of the final merge */

static const uint64_t INIT_ACC[8] = {P32_3, P64_1, P64_2, P64_3, P64_4, P32_2, P64_5, P32_1};

static inline uint64_t rd64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }  /* little-endian hosts */

static inline uint64_t mul_fold(uint64_t a, uint64_t b) {
    __uint128_t r = (__uint128_t)a * b;
    return (uint64_t)r ^ (uint64_t)(r >> 64);
}

static uint64_t finish(const uint64_t acc[8], size_t n) {
    uint64_t r = (uint64_t)n * P64_1;
    const uint8_t *s = SECRET + MERGE_AT;
    for (int i = 0; i < 4; i++) r += mul_fold(acc[2 * i] ^ rd64(s + 16 * i), acc[2 * i + 1] ^ rd64(s + 16 * i + 8));
    r ^= r >> 37;
    r *= 0x165667919E3779F9ULL;
    return r ^ (r >> 32);
}

/* ---- portable: copy a stripe, then fold the stored stripe (it is in L1) ---- */

static inline void stripe_portable(uint64_t acc[8], const uint8_t *in, const uint8_t *sec) {
    for (int i = 0; i < 8; i++) {
        uint64_t d = rd64(in + 8 * i), k = d ^ rd64(sec + 8 * i);
        acc[i ^ 1] += d;
        acc[i] += (k & 0xFFFFFFFFULL) * (k >> 32);
    }
}

static inline void scramble_portable(uint64_t acc[8]) {
    for (int i = 0; i < 8; i++) {
        uint64_t a = acc[i];
        a ^= a >> 47;
        a ^= rd64(SECRET + SCRAMBLE_AT + 8 * i);
        acc[i] = a * P32_1;
    }
}

static uint64_t copy_hash_portable(uint8_t *dst, const uint8_t *src, size_t n) {
    uint64_t acc[8];
    memcpy(acc, INIT_ACC, sizeof acc);
    size_t off = 0, blocks = (n - 1) / BLOCK;
    for (size_t b = 0; b < blocks; b++) {
        for (int s = 0; s < 16; s++, off += STRIPE) {
            memcpy(dst + off, src + off, STRIPE);
            stripe_portable(acc, dst + off, SECRET + 8 * s);
        }
        scramble_portable(acc);
    }
    size_t stripes = ((n - 1) - off) / STRIPE;
    for (size_t s = 0; s < stripes; s++, off += STRIPE) {
        memcpy(dst + off, src + off, STRIPE);
        stripe_portable(acc, dst + off, SECRET + 8 * s);
    }
    memcpy(dst + off, src + off, n - off);
    stripe_portable(acc, dst + n - STRIPE, SECRET + LAST_STRIPE_AT);
    return finish(acc, n);
}

/* ---- AVX2: one load per 32 bytes, stored and folded from the same register ---- */

#if KV_X86
#define AVX2 __attribute__((target("avx2")))
/* Each stripe asks for the line 1 KiB ahead of it: the hardware prefetcher alone left a cold 64 KiB source at
 * ~0.75x of glibc's memcpy here (it restarts at every 4 KiB page); 1 KiB ahead matched memcpy at 64 KiB and beat it
 * at 512 KiB (256 B and 2-4 KiB ahead, or into L2 only, were slower; 2026-11-27, AMD EPYC, 2 cores). */
#define PREFETCH 1024

static inline AVX2 __m256i fold_avx2(__m256i acc, __m256i data, const uint8_t *sec) {
    __m256i dk = _mm256_xor_si256(data, _mm256_loadu_si256((const __m256i *)sec));
    __m256i product = _mm256_mul_epu32(dk, _mm256_srli_epi64(dk, 32));
    __m256i swapped = _mm256_shuffle_epi32(data, _MM_SHUFFLE(1, 0, 3, 2));
    return _mm256_add_epi64(product, _mm256_add_epi64(acc, swapped));
}

static inline AVX2 __m256i scramble_avx2(__m256i acc, const uint8_t *sec) {
    const __m256i prime = _mm256_set1_epi32((int)P32_1);
    __m256i d = _mm256_xor_si256(_mm256_xor_si256(acc, _mm256_srli_epi64(acc, 47)),
                                 _mm256_loadu_si256((const __m256i *)sec));
    __m256i lo = _mm256_mul_epu32(d, prime);
    __m256i hi = _mm256_mul_epu32(_mm256_srli_epi64(d, 32), prime);
    return _mm256_add_epi64(lo, _mm256_slli_epi64(hi, 32));
}

#define COPY_FOLD(off, s)                                                          \
    do {                                                                           \
        __m256i d0 = _mm256_loadu_si256((const __m256i *)(src + (off)));           \
        __m256i d1 = _mm256_loadu_si256((const __m256i *)(src + (off) + 32));      \
        if (nt) {                                                                  \
            _mm256_stream_si256((__m256i *)(dst + (off)), d0);                     \
            _mm256_stream_si256((__m256i *)(dst + (off) + 32), d1);                \
        } else {                                                                   \
            _mm256_storeu_si256((__m256i *)(dst + (off)), d0);                     \
            _mm256_storeu_si256((__m256i *)(dst + (off) + 32), d1);                \
        }                                                                          \
        a0 = fold_avx2(a0, d0, SECRET + 8 * (s));                                  \
        a1 = fold_avx2(a1, d1, SECRET + 8 * (s) + 32);                             \
    } while (0)

static AVX2 uint64_t copy_hash_avx2(uint8_t *dst, const uint8_t *src, size_t n, int nt) {
    nt = nt && ((uintptr_t)dst & 31) == 0;
    __m256i a0 = _mm256_loadu_si256((const __m256i *)INIT_ACC);
    __m256i a1 = _mm256_loadu_si256((const __m256i *)(INIT_ACC + 4));
    size_t off = 0, blocks = (n - 1) / BLOCK;
    for (size_t b = 0; b < blocks; b++) {
        for (int s = 0; s < 16; s++, off += STRIPE) {
            _mm_prefetch((const char *)(src + off + PREFETCH), _MM_HINT_T0);
            COPY_FOLD(off, s);
        }
        a0 = scramble_avx2(a0, SECRET + SCRAMBLE_AT);
        a1 = scramble_avx2(a1, SECRET + SCRAMBLE_AT + 32);
    }
    size_t stripes = ((n - 1) - off) / STRIPE;
    for (size_t s = 0; s < stripes; s++, off += STRIPE) COPY_FOLD(off, s);
    if (nt) _mm_sfence();
    memcpy(dst + off, src + off, n - off);
    {
        __m256i d0 = _mm256_loadu_si256((const __m256i *)(dst + n - STRIPE));
        __m256i d1 = _mm256_loadu_si256((const __m256i *)(dst + n - 32));
        a0 = fold_avx2(a0, d0, SECRET + LAST_STRIPE_AT);
        a1 = fold_avx2(a1, d1, SECRET + LAST_STRIPE_AT + 32);
    }
    uint64_t acc[8];
    _mm256_storeu_si256((__m256i *)acc, a0);
    _mm256_storeu_si256((__m256i *)(acc + 4), a1);
    return finish(acc, n);
}
#endif

/* ---- scatter: src (n bytes) copied in runs, run k (lens[k] bytes, a multiple of 64) to to_runs[k] ----
 * The digest is over src's byte order (the object's), folded from the registers stored. With n a multiple of 64
 * the long-input loop folds stripes 0 .. n/64 - 2 (a scramble after every 16th) and the last stripe is stripe
 * n/64 - 1 with its own secret offset, so runs that are whole stripes never split one. */
static uint64_t scatter_hash(uint8_t *const *to_runs, const size_t *lens, const uint8_t *src, size_t n, int portable,
                             int stream);

static uint64_t scatter_hash_portable(uint8_t *const *to_runs, const size_t *lens, const uint8_t *src, size_t n) {
    uint64_t acc[8];
    memcpy(acc, INIT_ACC, sizeof acc);
    size_t last = n / STRIPE - 1, g = 0;
    const uint8_t *from = src;
    for (size_t k = 0;; from += lens[k], k++) {
        uint8_t *to = to_runs[k];
        for (size_t off = 0; off < lens[k]; off += STRIPE, g++) {
            memcpy(to + off, from + off, STRIPE);
            if (g == last) {
                stripe_portable(acc, to + off, SECRET + LAST_STRIPE_AT);
                return finish(acc, n);
            }
            stripe_portable(acc, to + off, SECRET + 8 * (g % 16));
            if (g % 16 == 15)
                for (int i = 0; i < 8; i++) {
                    uint64_t a = acc[i];
                    a ^= a >> 47;
                    a ^= rd64(SECRET + SCRAMBLE_AT + 8 * i);
                    acc[i] = a * P32_1;
                }
        }
    }
}

#if KV_X86
static AVX2 uint64_t scatter_hash_avx2(uint8_t *const *to_runs, const size_t *lens, const uint8_t *src, size_t n,
                                       int nt) {
    __m256i a0 = _mm256_loadu_si256((const __m256i *)INIT_ACC);
    __m256i a1 = _mm256_loadu_si256((const __m256i *)(INIT_ACC + 4));
    size_t last = n / STRIPE - 1, g = 0;
    const uint8_t *from = src;
    for (size_t k = 0;; from += lens[k], k++) {
        uint8_t *to = to_runs[k];
        int nt_run = nt && ((uintptr_t)to & 31) == 0;
        for (size_t off = 0; off < lens[k]; off += STRIPE, g++) {
            _mm_prefetch((const char *)(from + off + PREFETCH), _MM_HINT_T0);
            __m256i d0 = _mm256_loadu_si256((const __m256i *)(from + off));
            __m256i d1 = _mm256_loadu_si256((const __m256i *)(from + off + 32));
            if (nt_run) {
                _mm256_stream_si256((__m256i *)(to + off), d0);
                _mm256_stream_si256((__m256i *)(to + off + 32), d1);
            } else {
                _mm256_storeu_si256((__m256i *)(to + off), d0);
                _mm256_storeu_si256((__m256i *)(to + off + 32), d1);
            }
            if (g == last) {
                a0 = fold_avx2(a0, d0, SECRET + LAST_STRIPE_AT);
                a1 = fold_avx2(a1, d1, SECRET + LAST_STRIPE_AT + 32);
                if (nt) _mm_sfence();
                goto merge;
            }
            a0 = fold_avx2(a0, d0, SECRET + 8 * (g % 16));
            a1 = fold_avx2(a1, d1, SECRET + 8 * (g % 16) + 32);
            if (g % 16 == 15) {
                a0 = scramble_avx2(a0, SECRET + SCRAMBLE_AT);
                a1 = scramble_avx2(a1, SECRET + SCRAMBLE_AT + 32);
            }
        }
    }
merge:;
    uint64_t acc[8];
    _mm256_storeu_si256((__m256i *)acc, a0);
    _mm256_storeu_si256((__m256i *)(acc + 4), a1);
    return finish(acc, n);
}
#endif

static int use_avx2 = 0;

static uint64_t scatter_hash(uint8_t *const *to_runs, const size_t *lens, const uint8_t *src, size_t n, int portable,
                             int stream) {
#if KV_X86
    if (use_avx2 && !portable) return scatter_hash_avx2(to_runs, lens, src, n, stream);
#endif
    (void)portable;
    (void)stream;
    return scatter_hash_portable(to_runs, lens, src, n);
}

static uint64_t copy_hash(uint8_t *dst, const uint8_t *src, size_t n, int portable, int stream) {
#if KV_X86
    if (use_avx2 && !portable) return copy_hash_avx2(dst, src, n, stream);
#endif
    (void)portable;
    (void)stream;
    return copy_hash_portable(dst, src, n);
}

/* ---- hash only (no copy): a record's payload, already read into its buffer by preadv ---- */

static uint64_t hash_portable(const uint8_t *src, size_t n) {
    uint64_t acc[8];
    memcpy(acc, INIT_ACC, sizeof acc);
    size_t off = 0, blocks = (n - 1) / BLOCK;
    for (size_t b = 0; b < blocks; b++) {
        for (int s = 0; s < 16; s++, off += STRIPE) stripe_portable(acc, src + off, SECRET + 8 * s);
        scramble_portable(acc);
    }
    size_t stripes = ((n - 1) - off) / STRIPE;
    for (size_t s = 0; s < stripes; s++, off += STRIPE) stripe_portable(acc, src + off, SECRET + 8 * s);
    stripe_portable(acc, src + n - STRIPE, SECRET + LAST_STRIPE_AT);
    return finish(acc, n);
}

#if KV_X86
static AVX2 uint64_t hash_avx2(const uint8_t *src, size_t n) {
    __m256i a0 = _mm256_loadu_si256((const __m256i *)INIT_ACC);
    __m256i a1 = _mm256_loadu_si256((const __m256i *)(INIT_ACC + 4));
    size_t off = 0, blocks = (n - 1) / BLOCK;
    for (size_t b = 0; b < blocks; b++) {
        for (int s = 0; s < 16; s++, off += STRIPE) {
            _mm_prefetch((const char *)(src + off + PREFETCH), _MM_HINT_T0);
            a0 = fold_avx2(a0, _mm256_loadu_si256((const __m256i *)(src + off)), SECRET + 8 * s);
            a1 = fold_avx2(a1, _mm256_loadu_si256((const __m256i *)(src + off + 32)), SECRET + 8 * s + 32);
        }
        a0 = scramble_avx2(a0, SECRET + SCRAMBLE_AT);
        a1 = scramble_avx2(a1, SECRET + SCRAMBLE_AT + 32);
    }
    size_t stripes = ((n - 1) - off) / STRIPE;
    for (size_t s = 0; s < stripes; s++, off += STRIPE) {
        a0 = fold_avx2(a0, _mm256_loadu_si256((const __m256i *)(src + off)), SECRET + 8 * s);
        a1 = fold_avx2(a1, _mm256_loadu_si256((const __m256i *)(src + off + 32)), SECRET + 8 * s + 32);
    }
    a0 = fold_avx2(a0, _mm256_loadu_si256((const __m256i *)(src + n - STRIPE)), SECRET + LAST_STRIPE_AT);
    a1 = fold_avx2(a1, _mm256_loadu_si256((const __m256i *)(src + n - 32)), SECRET + LAST_STRIPE_AT + 32);
    uint64_t acc[8];
    _mm256_storeu_si256((__m256i *)acc, a0);
    _mm256_storeu_si256((__m256i *)(acc + 4), a1);
    return finish(acc, n);
}
#endif

static uint64_t hash_long(const uint8_t *src, size_t n, int portable) {
#if KV_X86
    if (use_avx2 && !portable) return hash_avx2(src, n);
#endif
    (void)portable;
    return hash_portable(src, n);
}

/* XXH3-64 of 17 to 128 bytes (a record header's 56 or 72): pairs of 16-byte lanes from both ends, each mixed with
 * its 16 bytes of secret, summed and avalanched */
static inline uint64_t mix16(const uint8_t *in, const uint8_t *sec) {
    return mul_fold(rd64(in) ^ rd64(sec), rd64(in + 8) ^ rd64(sec + 8));
}

static uint64_t hash_mid(const uint8_t *in, size_t n) {
    uint64_t acc = (uint64_t)n * P64_1;
    if (n > 32) {
        if (n > 64) {
            if (n > 96) {
                acc += mix16(in + 48, SECRET + 96);
                acc += mix16(in + n - 64, SECRET + 112);
            }
            acc += mix16(in + 32, SECRET + 64);
            acc += mix16(in + n - 48, SECRET + 80);
        }
        acc += mix16(in + 16, SECRET + 32);
        acc += mix16(in + n - 32, SECRET + 48);
    }
    acc += mix16(in, SECRET);
    acc += mix16(in + n - 16, SECRET + 16);
    acc ^= acc >> 37;
    acc *= 0x165667919E3779F9ULL;
    return acc ^ (acc >> 32);
}

/* ---- SSD records (tiers/ssd.py owns the format; the layout below is its header, tested against it) ---- */

#define REC_HEADER 4096             /* a record's header page; the payload follows it */
#define REC_HEAD_LEN 80             /* the header's bytes: magic .. time_sum */
#define REC_KEY 16
#define REC_VERSION 1
#define REC_WRITTEN 1               /* flags bit: written_us and time_sum follow hdr_sum */
#define REC_IOV_CAP 1024            /* Linux's IOV_MAX */
#define REC_MAX_GAP (64 * 1024)     /* unallocated bytes between two records read along (into a scratch) */
#define REC_MAX_RUN (1 << 20)       /* bytes one preadv reads (unless one record is larger) */

static uint8_t rec_gap[REC_MAX_GAP];                    /* written by the kernel, never read */
static uint8_t rec_pad[REC_HEADER - REC_HEAD_LEN];

typedef struct {
    uint64_t offset;
    uint8_t *payload;
    size_t len;
    uint8_t key[REC_KEY];
    uint8_t head[REC_HEAD_LEN];
    uint64_t digest;
    int ok;
    int err;                        /* errno of a failed read of this record alone, else 0 */
} rec_t;

static int rec_by_offset(const void *a, const void *b) {
    uint64_t x = (*(rec_t *const *)a)->offset, y = (*(rec_t *const *)b)->offset;
    return x < y ? -1 : x > y;
}

static uint16_t rd16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }

static void rec_verify(rec_t *r, const uint8_t *ns, int portable) {
    const uint8_t *h = r->head;
    uint16_t flags = rd16(h + 6);
    if (memcmp(h, "KVPR", 4)) return;
    if (flags & REC_WRITTEN) {      /* time_sum covers bytes 0..72, hdr_sum and the flag included */
        if (hash_mid(h, 72) != rd64(h + 72)) return;
    } else if (hash_mid(h, 56) != rd64(h + 56)) {
        return;                     /* a record of a node from before: hdr_sum */
    }
    if (rd16(h + 4) != REC_VERSION || memcmp(h + 8, r->key, REC_KEY) || (ns && memcmp(h + 24, ns, REC_KEY)) ||
        rd64(h + 40) != (uint64_t)r->len)
        return;
    uint64_t digest = hash_long(r->payload, r->len, portable);
    if (digest == rd64(h + 48)) {
        r->digest = digest;
        r->ok = 1;
    }
}

typedef struct {                    /* the preadv calls one read_records made, when the caller asks (tests) */
    uint64_t *at;
    int *count;
    size_t len;
} rec_trace_t;

static ssize_t rec_preadv(int fd, struct iovec *iov, int count, uint64_t at, rec_trace_t *trace) {
    ssize_t got;
    if (trace) {
        trace->at[trace->len] = at;
        trace->count[trace->len++] = count;
    }
    do got = preadv(fd, iov, count, (off_t)at); while (got < 0 && errno == EINTR);
    return got;
}

static void rec_read_one(int fd, rec_t *r, const uint8_t *ns, int portable, rec_trace_t *trace) {
    struct iovec iov[3] = {{r->head, REC_HEAD_LEN}, {rec_pad, sizeof rec_pad}, {r->payload, r->len}};
    ssize_t got = rec_preadv(fd, iov, 3, r->offset, trace);
    if (got < 0)
        r->err = errno ? errno : EIO;
    else if ((uint64_t)got >= REC_HEADER + (uint64_t)r->len)
        rec_verify(r, ns, portable);
}

/* every record read and verified, runs of adjacent records with one preadv each (the Python reader's plan) */
static void rec_read_all(int fd, rec_t **order, size_t n, const uint8_t *ns, int portable, struct iovec *iov,
                         rec_trace_t *trace) {
    size_t at = 0;
    while (at < n) {
        rec_t *first = order[at];
        uint64_t start = first->offset, end = start + REC_HEADER + first->len;
        int count = 0;
        iov[count++] = (struct iovec){first->head, REC_HEAD_LEN};
        iov[count++] = (struct iovec){rec_pad, sizeof rec_pad};
        iov[count++] = (struct iovec){first->payload, first->len};
        size_t stop = at + 1;
        while (stop < n && count + 4 <= REC_IOV_CAP) {
            rec_t *r = order[stop];
            if (r->offset < end || r->offset - end > REC_MAX_GAP ||
                r->offset + REC_HEADER + r->len - start > REC_MAX_RUN)
                break;
            if (r->offset > end) iov[count++] = (struct iovec){rec_gap, (size_t)(r->offset - end)};
            iov[count++] = (struct iovec){r->head, REC_HEAD_LEN};
            iov[count++] = (struct iovec){rec_pad, sizeof rec_pad};
            iov[count++] = (struct iovec){r->payload, r->len};
            end = r->offset + REC_HEADER + r->len;
            stop++;
        }
        if (stop - at == 1) {
            rec_read_one(fd, first, ns, portable, trace);
        } else {
            ssize_t got = rec_preadv(fd, iov, count, start, trace);
            for (size_t k = at; k < stop; k++) {
                rec_t *r = order[k];
                if (got >= 0 && (uint64_t)got >= r->offset + REC_HEADER + r->len - start)
                    rec_verify(r, ns, portable);
                else        /* the run failed or came up short: this record alone decides */
                    rec_read_one(fd, r, ns, portable, trace);
            }
        }
        at = stop;
    }
}

/* ---- Python ---- */

static int get_pair(PyObject *dst_obj, PyObject *src_obj, Py_buffer *dst, Py_buffer *src, Py_ssize_t index) {
    if (PyObject_GetBuffer(dst_obj, dst, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (PyObject_GetBuffer(src_obj, src, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(dst);
        return -1;
    }
    if (dst->len != src->len || src->len < MIN_LEN) {
        if (dst->len != src->len && index < 0)
            PyErr_Format(PyExc_ValueError, "dst has %zd bytes for a src of %zd", dst->len, src->len);
        else if (dst->len != src->len)
            PyErr_Format(PyExc_ValueError, "dsts[%zd] has %zd bytes for a src of %zd", index, dst->len, src->len);
        else if (index < 0)
            PyErr_Format(PyExc_ValueError, "src has %zd bytes: copy_xxh3 needs at least %d", src->len, MIN_LEN);
        else
            PyErr_Format(PyExc_ValueError, "srcs[%zd] has %zd bytes: copy_xxh3 needs at least %d", index, src->len,
                         MIN_LEN);
        PyBuffer_Release(dst);
        PyBuffer_Release(src);
        return -1;
    }
    return 0;
}

static PyObject *py_copy_xxh3(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"dst", "src", "portable", "stream", NULL};
    PyObject *d, *s;
    int portable = 0, stream = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|$pp", kw, &d, &s, &portable, &stream)) return NULL;
    Py_buffer dst, src;
    if (get_pair(d, s, &dst, &src, -1) < 0) return NULL;
    uint64_t h;
    Py_BEGIN_ALLOW_THREADS
    h = copy_hash(dst.buf, src.buf, (size_t)src.len, portable, stream);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&dst);
    PyBuffer_Release(&src);
    return PyLong_FromUnsignedLongLong(h);
}

static PyObject *py_copy_xxh3_many(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"dsts", "srcs", "portable", "stream", NULL};
    PyObject *dseq, *sseq;
    int portable = 0, stream = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|$pp", kw, &dseq, &sseq, &portable, &stream)) return NULL;
    PyObject *dfast = PySequence_Fast(dseq, "dsts must be a sequence of writable buffers");
    if (!dfast) return NULL;
    PyObject *sfast = PySequence_Fast(sseq, "srcs must be a sequence of buffers");
    if (!sfast) { Py_DECREF(dfast); return NULL; }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(dfast), got = 0;
    PyObject *out = NULL;
    Py_buffer *bufs = NULL;
    uint64_t *digests = NULL;
    if (PySequence_Fast_GET_SIZE(sfast) != count) {
        PyErr_Format(PyExc_ValueError, "dsts and srcs differ in length (%zd, %zd)", count,
                     PySequence_Fast_GET_SIZE(sfast));
        goto done;
    }
    bufs = PyMem_Calloc(2 * (size_t)count + 1, sizeof(Py_buffer));
    digests = PyMem_Calloc((size_t)count + 1, sizeof(uint64_t));
    if (!bufs || !digests) { PyErr_NoMemory(); goto done; }
    /* every buffer checked before any byte moves: a bad entry copies nothing */
    for (; got < count; got++)
        if (get_pair(PySequence_Fast_GET_ITEM(dfast, got), PySequence_Fast_GET_ITEM(sfast, got),
                     &bufs[2 * got], &bufs[2 * got + 1], got) < 0) goto done;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++)
        digests[i] = copy_hash(bufs[2 * i].buf, bufs[2 * i + 1].buf, (size_t)bufs[2 * i + 1].len, portable, stream);
    Py_END_ALLOW_THREADS
    out = PyList_New(count);
    if (!out) goto done;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(digests[i]);
        if (!v) { Py_CLEAR(out); goto done; }
        PyList_SET_ITEM(out, i, v);
    }
done:
    for (Py_ssize_t i = 0; i < got; i++) {
        PyBuffer_Release(&bufs[2 * i]);
        PyBuffer_Release(&bufs[2 * i + 1]);
    }
    PyMem_Free(bufs);
    PyMem_Free(digests);
    Py_DECREF(dfast);
    Py_DECREF(sfast);
    return out;
}

static PyObject *py_scatter_xxh3(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"dst", "src", "starts", "run", "base", "portable", "stream", NULL};
    PyObject *d, *s, *st;
    Py_ssize_t run, base = 0;
    int portable = 0, stream = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOn|n$pp", kw, &d, &s, &st, &run, &base, &portable, &stream))
        return NULL;
    Py_buffer dst, src, starts;
    if (PyObject_GetBuffer(d, &dst, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(s, &src, PyBUF_C_CONTIGUOUS) < 0) { PyBuffer_Release(&dst); return NULL; }
    if (PyObject_GetBuffer(st, &starts, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&dst);
        PyBuffer_Release(&src);
        return NULL;
    }
    PyObject *out = NULL;
    Py_ssize_t count = starts.len / 8;
    const uint64_t *at = starts.buf;
    uint8_t **to_runs = NULL;
    size_t *lens = NULL;
    if (starts.itemsize != 8 || !starts.format || (strcmp(starts.format, "Q") && strcmp(starts.format, "L") &&
                                                   strcmp(starts.format, "<Q") && strcmp(starts.format, "=Q"))) {
        PyErr_SetString(PyExc_ValueError, "starts must be a buffer of uint64 (numpy dtype uint64)");
        goto done;
    }
    if (run <= 0 || run % STRIPE) {
        PyErr_Format(PyExc_ValueError, "run must be a positive multiple of %d bytes, got %zd", STRIPE, run);
        goto done;
    }
    if (base < 0) {
        PyErr_Format(PyExc_ValueError, "base must be >= 0, got %zd", base);
        goto done;
    }
    if (src.len < MIN_LEN || src.len != count * run) {
        PyErr_Format(PyExc_ValueError, "src has %zd bytes: it must be len(starts) x run = %zd x %zd bytes, at least %d",
                     src.len, count, run, MIN_LEN);
        goto done;
    }
    for (Py_ssize_t k = 0; k < count; k++)   /* every run inside dst before any byte moves */
        if (at[k] > (uint64_t)dst.len || (uint64_t)base + at[k] + (uint64_t)run > (uint64_t)dst.len) {
            PyErr_Format(PyExc_ValueError, "starts[%zd]: run [%llu, %llu) is outside dst (%zd bytes)", k,
                         (unsigned long long)(base + at[k]), (unsigned long long)(base + at[k] + run), dst.len);
            goto done;
        }
    to_runs = PyMem_Malloc(sizeof(uint8_t *) * (size_t)count + 1);
    lens = PyMem_Malloc(sizeof(size_t) * (size_t)count + 1);
    if (!to_runs || !lens) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < count; k++) {
        to_runs[k] = (uint8_t *)dst.buf + base + at[k];
        lens[k] = (size_t)run;
    }
    uint64_t h;
    Py_BEGIN_ALLOW_THREADS
    h = scatter_hash(to_runs, lens, src.buf, (size_t)src.len, portable, stream);
    Py_END_ALLOW_THREADS
    out = PyLong_FromUnsignedLongLong(h);
done:
    PyMem_Free(to_runs);
    PyMem_Free(lens);
    PyBuffer_Release(&dst);
    PyBuffer_Release(&src);
    PyBuffer_Release(&starts);
    return out;
}

static PyObject *py_copy_xxh3_into(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"dsts", "src", "portable", "stream", NULL};
    PyObject *dseq, *s;
    int portable = 0, stream = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|$pp", kw, &dseq, &s, &portable, &stream)) return NULL;
    PyObject *dfast = PySequence_Fast(dseq, "dsts must be a sequence of writable buffers");
    if (!dfast) return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(dfast), got = 0, total = 0;
    PyObject *out = NULL;
    Py_buffer src, *bufs = NULL;
    uint8_t **to_runs = NULL;
    size_t *lens = NULL;
    if (PyObject_GetBuffer(s, &src, PyBUF_C_CONTIGUOUS) < 0) {
        Py_DECREF(dfast);
        return NULL;
    }
    bufs = PyMem_Calloc((size_t)count + 1, sizeof(Py_buffer));
    to_runs = PyMem_Malloc(sizeof(uint8_t *) * (size_t)count + 1);
    lens = PyMem_Malloc(sizeof(size_t) * (size_t)count + 1);
    if (!bufs || !to_runs || !lens) {
        PyErr_NoMemory();
        goto done;
    }
    for (; got < count; got++) {    /* every destination checked before any byte moves */
        PyObject *item = PySequence_Fast_GET_ITEM(dfast, got);
        if (PyObject_GetBuffer(item, &bufs[got], PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) goto done;
        if (bufs[got].len <= 0 || bufs[got].len % STRIPE) {
            PyErr_Format(PyExc_ValueError, "dsts[%zd] has %zd bytes: each must be a positive multiple of %d", got,
                         bufs[got].len, STRIPE);
            got++;
            goto done;
        }
        to_runs[got] = bufs[got].buf;
        lens[got] = (size_t)bufs[got].len;
        total += bufs[got].len;
    }
    if (total != src.len || src.len < MIN_LEN) {
        PyErr_Format(PyExc_ValueError, "src has %zd bytes, dsts %zd in all: they must be equal and at least %d",
                     src.len, total, MIN_LEN);
        goto done;
    }
    uint64_t h;
    Py_BEGIN_ALLOW_THREADS
    h = scatter_hash(to_runs, lens, src.buf, (size_t)src.len, portable, stream);
    Py_END_ALLOW_THREADS
    out = PyLong_FromUnsignedLongLong(h);
done:
    for (Py_ssize_t i = 0; i < got; i++) PyBuffer_Release(&bufs[i]);
    PyMem_Free(bufs);
    PyMem_Free(to_runs);
    PyMem_Free(lens);
    PyBuffer_Release(&src);
    Py_DECREF(dfast);
    return out;
}

/* read_records(fd, offsets, keys, payloads, sizes, ns_digest, limit): None where an argument is outside what this
 * reader takes (tiers/ssd.py then reads with its Python path, which names the argument that is wrong), else
 * (results, failures): results[i] the payload's verified XXH3-64 or None (a miss), failures the (offset, errno) of
 * each record whose own read failed. Nothing is read before every argument has been checked. */
static PyObject *py_read_records(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"fd", "offsets", "keys", "payloads", "sizes", "ns_digest", "limit", "portable", "trace",
                         NULL};
    int fd, portable = 0;
    PyObject *oseq, *kseq, *pseq, *sseq = Py_None, *nsobj = Py_None, *traced = Py_None;
    unsigned long long limit = ~0ULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iOOO|OOK$pO", kw, &fd, &oseq, &kseq, &pseq, &sseq, &nsobj, &limit,
                                     &portable, &traced))
        return NULL;
    if (traced != Py_None && !PyList_Check(traced)) {
        PyErr_SetString(PyExc_TypeError, "trace must be a list or None");
        return NULL;
    }
    rec_trace_t trace = {NULL, NULL, 0};
    PyObject *ofast = NULL, *kfast = NULL, *pfast = NULL, *sfast = NULL, *out = NULL, *result = NULL;
    Py_buffer *bufs = NULL;
    rec_t *recs = NULL, **order = NULL;
    struct iovec *iov = NULL;
    Py_ssize_t n = 0, held = 0;
    uint8_t ns[REC_KEY];
    int refuse = 1;
    if (!(ofast = PySequence_Fast(oseq, "offsets")) || !(kfast = PySequence_Fast(kseq, "keys")) ||
        !(pfast = PySequence_Fast(pseq, "payloads")) || (sseq != Py_None && !(sfast = PySequence_Fast(sseq, "sizes")))) {
        PyErr_Clear();
        goto done;
    }
    n = PySequence_Fast_GET_SIZE(ofast);
    if (PySequence_Fast_GET_SIZE(kfast) != n || PySequence_Fast_GET_SIZE(pfast) != n ||
        (sfast && PySequence_Fast_GET_SIZE(sfast) != n))
        goto done;
    if (nsobj != Py_None) {
        if (!PyBytes_CheckExact(nsobj) || PyBytes_GET_SIZE(nsobj) != REC_KEY) goto done;
        memcpy(ns, PyBytes_AS_STRING(nsobj), REC_KEY);
    }
    bufs = PyMem_Calloc((size_t)n + 1, sizeof(Py_buffer));
    recs = PyMem_Calloc((size_t)n + 1, sizeof(rec_t));
    order = PyMem_Calloc((size_t)n + 1, sizeof(rec_t *));
    iov = PyMem_Malloc(REC_IOV_CAP * sizeof(struct iovec));
    if (traced != Py_None) {        /* a run per record at most, and each record of a failed run again alone */
        trace.at = PyMem_Calloc(2 * (size_t)n + 1, sizeof(uint64_t));
        trace.count = PyMem_Calloc(2 * (size_t)n + 1, sizeof(int));
    }
    if (!bufs || !recs || !order || !iov || (traced != Py_None && (!trace.at || !trace.count))) {
        refuse = 0;
        PyErr_NoMemory();
        goto done;
    }
    for (; held < n; held++) {
        rec_t *r = &recs[held];
        PyObject *o = PySequence_Fast_GET_ITEM(ofast, held), *k = PySequence_Fast_GET_ITEM(kfast, held);
        if (!PyLong_CheckExact(o) || !PyBytes_CheckExact(k) || PyBytes_GET_SIZE(k) != REC_KEY) goto done;
        r->offset = PyLong_AsUnsignedLongLong(o);
        if (PyErr_Occurred() || r->offset % REC_HEADER) {
            PyErr_Clear();
            goto done;
        }
        memcpy(r->key, PyBytes_AS_STRING(k), REC_KEY);
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(pfast, held), &bufs[held],
                               PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
            PyErr_Clear();
            goto done;
        }
        r->payload = bufs[held].buf;
        r->len = (size_t)bufs[held].len;
        if (sfast) {
            PyObject *z = PySequence_Fast_GET_ITEM(sfast, held);
            Py_ssize_t size = PyLong_CheckExact(z) ? PyLong_AsSsize_t(z) : -1;
            if (size < 0 || size > bufs[held].len) {
                PyErr_Clear();
                held++;
                goto done;
            }
            r->len = (size_t)size;
        }
        if (r->len < MIN_LEN || r->offset > limit || limit - r->offset < REC_HEADER + (unsigned long long)r->len) {
            held++;
            goto done;
        }
        order[held] = r;
    }
    refuse = 0;
    Py_BEGIN_ALLOW_THREADS
    if (n > 1) qsort(order, (size_t)n, sizeof(rec_t *), rec_by_offset);
    rec_read_all(fd, order, (size_t)n, nsobj != Py_None ? ns : NULL, portable, iov, trace.at ? &trace : NULL);
    Py_END_ALLOW_THREADS
    for (size_t t = 0; t < trace.len; t++) {
        PyObject *call = Py_BuildValue("(Ki)", (unsigned long long)trace.at[t], trace.count[t]);
        if (!call || PyList_Append(traced, call) < 0) {
            Py_XDECREF(call);
            goto done;
        }
        Py_DECREF(call);
    }
    out = PyList_New(n);
    PyObject *failures = out ? PyList_New(0) : NULL;
    if (!failures) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = recs[i].ok ? PyLong_FromUnsignedLongLong(recs[i].digest) : Py_NewRef(Py_None);
        if (!v) { Py_DECREF(failures); goto done; }
        PyList_SET_ITEM(out, i, v);
        if (recs[i].err) {
            PyObject *f = Py_BuildValue("(Ki)", (unsigned long long)recs[i].offset, recs[i].err);
            if (!f || PyList_Append(failures, f) < 0) { Py_XDECREF(f); Py_DECREF(failures); goto done; }
            Py_DECREF(f);
        }
    }
    result = PyTuple_Pack(2, out, failures);
    Py_DECREF(failures);
done:
    for (Py_ssize_t i = 0; i < held && i < n; i++)
        if (bufs[i].obj) PyBuffer_Release(&bufs[i]);
    PyMem_Free(bufs);
    PyMem_Free(recs);
    PyMem_Free(order);
    PyMem_Free(iov);
    PyMem_Free(trace.at);
    PyMem_Free(trace.count);
    Py_XDECREF(out);
    Py_XDECREF(ofast);
    Py_XDECREF(kfast);
    Py_XDECREF(pfast);
    Py_XDECREF(sfast);
    if (result) return result;
    if (refuse && !PyErr_Occurred()) Py_RETURN_NONE;
    return NULL;
}

static PyObject *py_xxh3_64(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"data", "portable", NULL};
    Py_buffer b;
    int portable = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*|$p", kw, &b, &portable)) return NULL;
    uint64_t h = 0;
    int ok = (b.len >= 17 && b.len <= 128) || b.len >= MIN_LEN;
    if (ok) h = b.len >= MIN_LEN ? hash_long(b.buf, (size_t)b.len, portable) : hash_mid(b.buf, (size_t)b.len);
    PyBuffer_Release(&b);
    if (!ok) return PyErr_Format(PyExc_ValueError, "data has %zd bytes: xxh3_64 hashes 17 to 128, or %d and more",
                                 b.len, MIN_LEN);
    return PyLong_FromUnsignedLongLong(h);
}

static PyMethodDef methods[] = {
    {"copy_xxh3", (PyCFunction)(void (*)(void))py_copy_xxh3, METH_VARARGS | METH_KEYWORDS,
     "copy_xxh3(dst, src, *, portable=False, stream=False) -> int: copy src into dst (equal lengths, over 240 "
     "bytes) and return the XXH3-64 of the bytes stored, in one pass; portable=True skips the AVX2 path (tests); "
     "stream=True stores with streaming (non-temporal) stores where dst is 32-byte aligned: no read of the "
     "destination's lines first, and they are not kept in cache (for copies larger than the cache)."},
    {"copy_xxh3_many", (PyCFunction)(void (*)(void))py_copy_xxh3_many, METH_VARARGS | METH_KEYWORDS,
     "copy_xxh3_many(dsts, srcs, *, portable=False) -> list[int]: copy_xxh3 of each pair, the GIL released once; "
     "every pair is checked before any byte is copied."},
    {"scatter_xxh3", (PyCFunction)(void (*)(void))py_scatter_xxh3, METH_VARARGS | METH_KEYWORDS,
     "scatter_xxh3(dst, src, starts, run, base=0, *, portable=False) -> int: copy src in runs of `run` bytes (a "
     "multiple of 64) to dst[base + starts[k]:][:run] (starts: uint64 buffer, len(src) = len(starts) * run) and "
     "return the XXH3-64 of the bytes stored, in src's order; every run is checked to lie inside dst first."},
    {"copy_xxh3_into", (PyCFunction)(void (*)(void))py_copy_xxh3_into, METH_VARARGS | METH_KEYWORDS,
     "copy_xxh3_into(dsts, src, *, portable=False) -> int: copy src into the destinations in turn (each a multiple "
     "of 64 bytes, together len(src)) and return the XXH3-64 of the bytes stored, in src's order; every "
     "destination is checked first."},
    {"read_records", (PyCFunction)(void (*)(void))py_read_records, METH_VARARGS | METH_KEYWORDS,
     "read_records(fd, offsets, keys, payloads, sizes=None, ns_digest=None, limit=2**64-1, *, portable=False, "
     "trace=None) -> "
     "(results, failures) | None: tiers/ssd.py read_records in one C call (see there); None when an argument is "
     "outside what it takes (every payload over 240 bytes, exact ints and 16-byte keys, records inside limit). "
     "trace: a list that gets (offset, buffers) of each preadv made (tests)."},
    {"xxh3_64", (PyCFunction)(void (*)(void))py_xxh3_64, METH_VARARGS | METH_KEYWORDS,
     "xxh3_64(data, *, portable=False) -> int: the XXH3-64 the record reader computes (17 to 128 bytes: a header; "
     "over 240: a payload); for tests."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "kvpool._copyhash", NULL, -1, methods};

PyMODINIT_FUNC PyInit__copyhash(void) {
#if KV_X86
    __builtin_cpu_init();
    use_avx2 = __builtin_cpu_supports("avx2");
#endif
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    if (PyModule_AddStringConstant(m, "SIMD", use_avx2 ? "avx2" : "portable") < 0 ||
        PyModule_AddIntConstant(m, "MIN_LEN", MIN_LEN) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
