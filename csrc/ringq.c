/* ringq.c - the C helper of ringq.  See ringq.h for the contract of every function.
 *
 * Theory of operation
 * -------------------
 * A ringq segment is a file mapped MAP_SHARED by every process that uses the queue.  Processes
 * coordinate through words in those mappings, never through a server:
 *
 *  - A writer holds the queue's flock while it appends.  It copies a record's bytes into free slots,
 *    fills in the CRC32C, marks continuation slots CONT, then *publishes* the record with a
 *    release-store of its READY state word.  A reader that acquire-loads a non-EMPTY state word is
 *    therefore guaranteed to see the complete record bytes (on a live system); after a power loss it
 *    may not be, which is why every read re-validates the CRC instead of trusting the state word.
 *  - Readers never take the lock.  They claim a job by compare-and-swap on its 8-byte state word,
 *    which packs state, fencing token (lease count) and the deadline, so a claim, an ack or a reclaim
 *    is one atomic step with no torn intermediate.  This is also why no 16-byte CAS is needed.
 *  - Sleeping consumers wait on a futex word in the shared control-file mapping; producers bump it
 *    and wake them.
 *
 * Rules this file keeps: every offset and length, including those read from the file, is checked
 * against the mapping length before use; nothing allocates; nothing decides policy.
 */
#define _GNU_SOURCE
#include "ringq.h"
#include "ringq_internal.h"

#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#define RINGQ_HAVE_FUTEX 1
#else
#define RINGQ_HAVE_FUTEX 0
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>
#define RINGQ_X86 1
#else
#define RINGQ_X86 0
#endif

/* ---- CRC32C ------------------------------------------------------------------------------------ */
/* Reflected Castagnoli polynomial (RFC 3720, appendix B.4). */
#define CRC32C_POLY 0x82F63B78u

static uint32_t crc_table[8][256];
static int crc_hw;

__attribute__((constructor)) static void ringq_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ CRC32C_POLY : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xff];
#if RINGQ_X86
    __builtin_cpu_init();
    crc_hw = __builtin_cpu_supports("sse4.2") ? 1 : 0;
#endif
}

uint32_t ringq_crc32c_sw(uint32_t crc, const uint8_t *buf, size_t len) {
    crc = ~crc;
    while (len && ((uintptr_t)buf & 7)) {
        crc = crc_table[0][(crc ^ *buf++) & 0xff] ^ (crc >> 8);
        len--;
    }
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, buf, 8);
        w ^= crc; /* little-endian: the running CRC folds into the low four bytes */
        crc = crc_table[7][w & 0xff] ^ crc_table[6][(w >> 8) & 0xff] ^ crc_table[5][(w >> 16) & 0xff] ^
              crc_table[4][(w >> 24) & 0xff] ^ crc_table[3][(w >> 32) & 0xff] ^
              crc_table[2][(w >> 40) & 0xff] ^ crc_table[1][(w >> 48) & 0xff] ^ crc_table[0][w >> 56];
        buf += 8;
        len -= 8;
    }
    while (len--) crc = crc_table[0][(crc ^ *buf++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

#if RINGQ_X86
__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t crc, const uint8_t *buf,
                                                                size_t len) {
    uint64_t c = ~crc & 0xffffffffu;
    while (len && ((uintptr_t)buf & 7)) {
        c = _mm_crc32_u8((uint32_t)c, *buf++);
        len--;
    }
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, buf, 8);
        c = _mm_crc32_u64(c, w);
        buf += 8;
        len -= 8;
    }
    while (len--) c = _mm_crc32_u8((uint32_t)c, *buf++);
    return ~(uint32_t)c;
}
#endif

uint32_t ringq_crc32c_hw(uint32_t crc, const uint8_t *buf, size_t len) {
#if RINGQ_X86
    if (crc_hw) return crc32c_sse42(crc, buf, len);
#endif
    return ringq_crc32c_sw(crc, buf, len);
}

int ringq_crc32c_hw_available(void) { return crc_hw; }

uint32_t ringq_crc32c(uint32_t crc, const uint8_t *buf, size_t len) {
    return ringq_crc32c_hw(crc, buf, len);
}

/* ---- atomics ----------------------------------------------------------------------------------- */

int ringq_load64(const uint8_t *base, size_t maplen, size_t off, uint64_t *out) {
    int rc = word_check(base, maplen, off, 8);
    if (rc) return rc;
    *out = atomic_load_explicit(A64(base, off), memory_order_acquire);
    return 0;
}

int ringq_store64(uint8_t *base, size_t maplen, size_t off, uint64_t value) {
    int rc = word_check(base, maplen, off, 8);
    if (rc) return rc;
    atomic_store_explicit(A64(base, off), value, memory_order_release);
    return 0;
}

int ringq_cas64(uint8_t *base, size_t maplen, size_t off, uint64_t expected, uint64_t desired,
                uint64_t *actual) {
    int rc = word_check(base, maplen, off, 8);
    if (rc) return rc;
    uint64_t e = expected;
    int ok = atomic_compare_exchange_strong(A64(base, off), &e, desired);
    if (actual) *actual = ok ? desired : e;
    return ok;
}

int ringq_fetch_add64(uint8_t *base, size_t maplen, size_t off, uint64_t delta, uint64_t *prev) {
    int rc = word_check(base, maplen, off, 8);
    if (rc) return rc;
    uint64_t p = atomic_fetch_add(A64(base, off), delta);
    if (prev) *prev = p;
    return 0;
}

int ringq_lower_packed64(uint8_t *base, size_t maplen, size_t off, uint32_t gen_bits, uint64_t v) {
    int rc = word_check(base, maplen, off, 8);
    if (rc) return rc;
    if (gen_bits < 1 || gen_bits > 63) return RINGQ_EINVAL;
    uint64_t gen_mask = (1ULL << gen_bits) - 1, vmax = UINT64_MAX >> gen_bits;
    if (v > vmax) v = vmax;
    uint64_t cur = atomic_load_explicit(A64(base, off), memory_order_acquire);
    for (;;) {
        uint64_t val = cur >> gen_bits;
        uint64_t next = ((val < v ? val : v) << gen_bits) | ((cur + 1) & gen_mask);
        if (atomic_compare_exchange_strong(A64(base, off), &cur, next)) return 0;
    }
}

int ringq_load32(const uint8_t *base, size_t maplen, size_t off, uint32_t *out) {
    int rc = word_check(base, maplen, off, 4);
    if (rc) return rc;
    *out = atomic_load_explicit(A32(base, off), memory_order_acquire);
    return 0;
}

int ringq_load32_64(const uint8_t *base, size_t maplen, size_t off32, size_t off64, uint32_t *out32,
                    uint64_t *out64) {
    int rc = ringq_load32(base, maplen, off32, out32);
    return rc ? rc : ringq_load64(base, maplen, off64, out64);
}

int ringq_watch(ringq_watched *w, uint32_t n, int reset) {
    if (!w && n) return RINGQ_EINVAL;
    for (uint32_t i = 0; i < n; i++) { /* every word checked before any is read or reset */
        if (w[i].width != 4 && w[i].width != 8) return RINGQ_EINVAL;
        int rc = word_check(w[i].base, (size_t)w[i].maplen, (size_t)w[i].off, w[i].width);
        if (rc) return rc;
    }
    for (uint32_t i = 0; i < n; i++) {
        uint64_t v = w[i].width == 4
                         ? atomic_load_explicit(A32(w[i].base, w[i].off), memory_order_acquire)
                         : atomic_load_explicit(A64(w[i].base, w[i].off), memory_order_acquire);
        if (reset)
            w[i].expect = v;
        else if (v != w[i].expect)
            return 0;
    }
    return 1;
}

int ringq_store32(uint8_t *base, size_t maplen, size_t off, uint32_t value) {
    int rc = word_check(base, maplen, off, 4);
    if (rc) return rc;
    atomic_store_explicit(A32(base, off), value, memory_order_release);
    return 0;
}

int ringq_cas32(uint8_t *base, size_t maplen, size_t off, uint32_t expected, uint32_t desired,
                uint32_t *actual) {
    int rc = word_check(base, maplen, off, 4);
    if (rc) return rc;
    uint32_t e = expected;
    int ok = atomic_compare_exchange_strong(A32(base, off), &e, desired);
    if (actual) *actual = ok ? desired : e;
    return ok;
}

int ringq_fetch_add32(uint8_t *base, size_t maplen, size_t off, uint32_t delta, uint32_t *prev) {
    int rc = word_check(base, maplen, off, 4);
    if (rc) return rc;
    uint32_t p = atomic_fetch_add(A32(base, off), delta);
    if (prev) *prev = p;
    return 0;
}

/* ---- futex ------------------------------------------------------------------------------------- */
int ringq_futex_available(void) { return RINGQ_HAVE_FUTEX; }

int ringq_futex_wait(uint8_t *base, size_t maplen, size_t off, uint32_t expected, int64_t timeout_ns) {
    int rc = word_check(base, maplen, off, 4);
    if (rc) return rc;
#if RINGQ_HAVE_FUTEX
    struct timespec ts, *tsp = NULL;
    if (timeout_ns >= 0) {
        ts.tv_sec = (time_t)(timeout_ns / 1000000000LL);
        ts.tv_nsec = (long)(timeout_ns % 1000000000LL);
        tsp = &ts;
    }
    /* FUTEX_WAIT (not FUTEX_WAIT_PRIVATE): the word is shared between processes. */
    long r = syscall(SYS_futex, (uint32_t *)(base + off), FUTEX_WAIT, expected, tsp, NULL, 0);
    if (r == 0) return 0;
    if (errno == EAGAIN) return 0; /* the word already differed: something happened */
    if (errno == ETIMEDOUT) return 1;
    if (errno == ENOSYS) return RINGQ_ENOFUTEX;
    return -errno;
#else
    (void)expected;
    (void)timeout_ns;
    return RINGQ_ENOFUTEX;
#endif
}

static inline void cpu_relax(void) {
#if RINGQ_X86
    _mm_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

int ringq_spin_wait(const uint8_t *base, size_t maplen, size_t off, uint32_t expected, int64_t spin_ns) {
    int rc = word_check(base, maplen, off, 4);
    if (rc) return rc;
    const _Atomic uint32_t *w = (const _Atomic uint32_t *)(const void *)(base + off);
    if (atomic_load_explicit(w, memory_order_acquire) != expected) return 0;
    if (spin_ns <= 0) return 1;
    int64_t end = mono_ns() + spin_ns;
    for (;;) {
        for (int i = 0; i < 64; i++) { /* the clock is read once per 64 polls */
            cpu_relax();
            if (atomic_load_explicit(w, memory_order_acquire) != expected) return 0;
        }
        if (mono_ns() >= end) return 1;
    }
}

int ringq_futex_wake(uint8_t *base, size_t maplen, size_t off, int n) {
    int rc = word_check(base, maplen, off, 4);
    if (rc) return rc;
    if (n <= 0) return RINGQ_EINVAL;
#if RINGQ_HAVE_FUTEX
    long r = syscall(SYS_futex, (uint32_t *)(base + off), FUTEX_WAKE, n, NULL, NULL, 0);
    if (r >= 0) return (int)r;
    if (errno == ENOSYS) return RINGQ_ENOFUTEX;
    return -errno;
#else
    return RINGQ_ENOFUTEX;
#endif
}

/* ---- msync ------------------------------------------------------------------------------------- */
int ringq_msync(uint8_t *base, size_t maplen, size_t off, size_t len) {
    if (!base || !in_bounds(maplen, off, len)) return RINGQ_EBOUNDS;
    if (len == 0) return 0;
    long pg = sysconf(_SC_PAGESIZE);
    if (pg <= 0) pg = 4096;
    uintptr_t start = (uintptr_t)base + off;
    uintptr_t end = start + len;
    uintptr_t astart = start & ~((uintptr_t)pg - 1); /* the mapping base is page aligned */
    if (msync((void *)astart, end - astart, MS_SYNC) != 0) return -errno;
    return 0;
}

/* ---- the two files of a format-2 segment ------------------------------------------------------ */

int ringq_map_pair(int state_fd, size_t state_len, int rec_fd, uint64_t rec_off, size_t rec_len,
                   int writable, uint8_t **out) {
    long pg = sysconf(_SC_PAGESIZE);
    if (pg <= 0) pg = 4096;
    if (!out || state_len == 0 || rec_len == 0 || state_len % (size_t)pg || rec_off % (uint64_t)pg)
        return RINGQ_EINVAL;
    if (state_len > SIZE_MAX - rec_len) return RINGQ_EINVAL;
    size_t total = state_len + rec_len;
    /* The reservation makes the two MAP_FIXED mappings below land in address space that is ours. */
    void *base = mmap(NULL, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) return -errno;
    int prot = PROT_READ | (writable ? PROT_WRITE : 0);
    if (mmap(base, state_len, prot, MAP_SHARED | MAP_FIXED, state_fd, 0) == MAP_FAILED ||
        mmap((uint8_t *)base + state_len, rec_len, PROT_READ, MAP_SHARED | MAP_FIXED, rec_fd,
             (off_t)rec_off) == MAP_FAILED) {
        int e = errno;
        munmap(base, total);
        return -e;
    }
    *out = (uint8_t *)base;
    return 0;
}

int ringq_unmap(uint8_t *base, size_t len) {
    if (!base || len == 0) return RINGQ_EINVAL;
    return munmap(base, len) == 0 ? 0 : -errno;
}

/* ---- owner locks ------------------------------------------------------------------------------- */
static int ofd_lock(int fd, uint32_t idx, int cmd, short type, struct flock *out) {
#ifdef F_OFD_SETLK
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = (off_t)idx;
    fl.l_len = 1;
    fl.l_pid = 0; /* required by OFD locks */
    if (fcntl(fd, cmd, &fl) != 0) return -errno;
    if (out) *out = fl;
    return 0;
#else
    (void)fd; (void)idx; (void)cmd; (void)type; (void)out;
    return -ENOSYS;
#endif
}

int ringq_owner_trylock(int fd, uint32_t idx) {
#ifdef F_OFD_SETLK
    int rc = ofd_lock(fd, idx, F_OFD_SETLK, F_WRLCK, NULL);
    if (rc == 0) return 1;
    if (rc == -EAGAIN || rc == -EACCES) return 0;
    return rc;
#else
    (void)fd; (void)idx;
    return -ENOSYS;
#endif
}

int ringq_owner_unlock(int fd, uint32_t idx) {
#ifdef F_OFD_SETLK
    return ofd_lock(fd, idx, F_OFD_SETLK, F_UNLCK, NULL);
#else
    (void)fd; (void)idx;
    return -ENOSYS;
#endif
}

int ringq_owner_probe(int fd, uint32_t idx) {
#ifdef F_OFD_GETLK
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    int rc = ofd_lock(fd, idx, F_OFD_GETLK, F_WRLCK, &fl);
    if (rc) return rc;
    return fl.l_type == F_UNLCK ? 0 : 1;
#else
    (void)fd; (void)idx;
    return -ENOSYS;
#endif
}

/* ---- records ----------------------------------------------------------------------------------- */
/* Record header (little-endian), RINGQ_REC_HEADER bytes; see docs/format.md "record":
 *   0 u32 magic  4 u32 crc  8 u32 record_len  12 u32 span  16 u64 seq  24 i64 enqueued_us
 *   32 i64 available_ms  40 i32 priority  44 u16 max_attempts  46 u16 attempts_before
 *   48 u16 id_len  50 u8 codec  51 u8 kind  52 u32 payload_len  56 u64 supersedes            */
_Static_assert(sizeof(ringq_rec_header) == RINGQ_REC_HEADER, "record header size");
_Static_assert(sizeof(ringq_claimed) == 56 && offsetof(ringq_claimed, slot) == 32 &&
               offsetof(ringq_claimed, codec) == 48, "ringq_claimed layout (read with struct)");
_Static_assert(offsetof(ringq_rec_header, seq) == 16 && offsetof(ringq_rec_header, priority) == 40 &&
               offsetof(ringq_rec_header, id_len) == 48 && offsetof(ringq_rec_header, payload_len) == 52 &&
               offsetof(ringq_rec_header, supersedes) == 56, "record header offsets");
/* The checks both record writers make (bad_fd: the caller's descriptor is unusable): returns the
 * record's span (> 0) or an error code. */
static int new_record_span(size_t maplen, const ringq_geom *g, uint32_t slot, const uint8_t *rec,
                           uint32_t len, uint64_t state, int bad_fd) {
    int rc = geom_check(maplen, g);
    if (rc) return rc;
    if (!rec || len < RINGQ_REC_HEADER || bad_fd || !publishable(state)) return RINGQ_EINVAL;
    uint32_t span = (uint32_t)((len + g->slot_size - 1) / g->slot_size);
    if (slot >= g->slot_count || span > g->slot_count - slot) return RINGQ_EBOUNDS;
    if (rd32(rec + 8) != len || rd32(rec + 12) != span) return RINGQ_EINVAL;
    return (int)span;
}

int ringq_rec_write(uint8_t *base, size_t maplen, const ringq_geom *g, uint32_t slot,
                    const uint8_t *rec, uint32_t len, uint64_t state) {
    int span = new_record_span(maplen, g, slot, rec, len, state, 0);
    if (span < 0) return span;
    uint8_t *dst = base + g->data_off + (size_t)slot * g->slot_size;
    memcpy(dst, rec, len);
    uint32_t crc = record_crc(g, slot, dst, len);
    memcpy(dst + 4, &crc, 4);
    publish_record(base, g, slot, (uint32_t)span, state);
    return span;
}

int ringq_rec_pwrite(int fd, uint64_t data_file_off, uint8_t *base, size_t maplen, const ringq_geom *g,
                     uint32_t slot, uint8_t *rec, uint32_t len, uint64_t state) {
    int span = new_record_span(maplen, g, slot, rec, len, state, fd < 0);
    if (span < 0) return span;
    uint32_t crc = record_crc(g, slot, rec, len);
    memcpy(rec + 4, &crc, 4);
    uint64_t off = data_file_off + (uint64_t)slot * g->slot_size;
    uint32_t done = 0;
    while (done < len) {
        ssize_t n = pwrite(fd, rec + done, len - done, (off_t)(off + done));
        if (n < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        if (n == 0) return -EIO;
        done += (uint32_t)n;
    }
    publish_record(base, g, slot, (uint32_t)span, state);
    return span;
}

int check_record(const uint8_t *base, const ringq_geom *g, uint32_t slot, ringq_rec_info *out) {
    memset(out, 0, sizeof *out);
    out->slot = slot;
    out->span = 1;
    out->status = RINGQ_ECORRUPT;
    out->state = atomic_load_explicit(A64(base, g->state_off + (size_t)slot * RINGQ_STATE_ENTRY),
                                      memory_order_acquire);
    const uint8_t *p = base + g->data_off + (size_t)slot * g->slot_size;
    if (rd32(p) != RINGQ_REC_MAGIC) return RINGQ_ECORRUPT;
    uint32_t len = rd32(p + 8), span = rd32(p + 12);
    size_t room = (size_t)(g->slot_count - slot) * g->slot_size;
    if (len < RINGQ_REC_HEADER || len > room) return RINGQ_ECORRUPT;
    if (span != (len + g->slot_size - 1) / g->slot_size) return RINGQ_ECORRUPT;
    uint16_t id_len = rd16(p + 48);
    uint32_t payload_len = rd32(p + 52);
    if ((uint64_t)RINGQ_REC_HEADER + id_len + payload_len != len) return RINGQ_ECORRUPT;
    if (record_crc(g, slot, p, len) != rd32(p + 4)) return RINGQ_ECORRUPT;
    out->span = span;
    out->status = 0;
    out->record_len = len;
    out->seq = rd64(p + 16);
    out->enqueued_us = (int64_t)rd64(p + 24);
    out->available_ms = (int64_t)rd64(p + 32);
    out->priority = (int32_t)rd32(p + 40);
    out->max_attempts = rd16(p + 44);
    out->attempts_before = rd16(p + 46);
    out->id_len = id_len;
    out->codec = p[50];
    out->kind = p[51];
    out->payload_len = payload_len;
    out->supersedes = rd64(p + 56);
    return 0;
}

int ringq_rec_check(const uint8_t *base, size_t maplen, const ringq_geom *g, uint32_t slot,
                    ringq_rec_info *out) {
    int rc = geom_check(maplen, g);
    if (rc) return rc;
    if (!out || slot >= g->slot_count) return RINGQ_EBOUNDS;
    return check_record(base, g, slot, out);
}

int ringq_seg_scan(const uint8_t *base, size_t maplen, const ringq_geom *g, uint32_t from, uint32_t to,
                   ringq_rec_info *out, uint32_t cap, uint32_t *next) {
    int rc = geom_check(maplen, g);
    if (rc) return rc;
    if (!out || !next || from > to || to > g->slot_count) return RINGQ_EBOUNDS;
    uint32_t n = 0, s = from;
    while (s < to && n < cap) {
        check_record(base, g, s, &out[n]);
        /* A valid record may not claim slots past `to` (the published tail): if it does, the tail
         * and the record disagree, so trust neither and resynchronise slot by slot. */
        if (out[n].status == 0 && out[n].span > to - s) {
            out[n].status = RINGQ_ECORRUPT;
            out[n].span = 1;
        }
        s += out[n].span;
        if (out[n].status != 0) {
            /* The continuation slots of a damaged record hold its payload, which may look like
             * anything -- even like a valid record: never resynchronise inside them. */
            while (s < to && (atomic_load_explicit(A64(base, g->state_off + (size_t)s * RINGQ_STATE_ENTRY),
                                                   memory_order_acquire) & 7u) == RINGQ_ST_CONT)
                s++;
        }
        n++;
    }
    *next = s;
    return (int)n;
}

int ringq_next_ready(const uint8_t *base, size_t maplen, const ringq_geom *g, const uint32_t *order,
                     uint32_t n, uint32_t start, uint64_t *state) {
    int rc = geom_check(maplen, g);
    if (rc) return rc;
    if (!order || !state) return RINGQ_EINVAL;
    for (uint32_t i = start; i < n; i++) {
        uint32_t slot = order[i];
        if (slot >= g->slot_count) continue;
        uint64_t w = atomic_load_explicit(A64(base, g->state_off + (size_t)slot * RINGQ_STATE_ENTRY),
                                          memory_order_acquire);
        if ((w & 7u) == RINGQ_ST_READY) {
            *state = w;
            return (int)i;
        }
    }
    return (int)n;
}
