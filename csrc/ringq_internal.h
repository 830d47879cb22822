/* ringq_internal.h - what the C files of the helper share and the Python side never sees:
 * bounds and alignment checks, atomic access to words of a mapping, little-endian reads, the
 * geometry check, the record CRC and the monotonic clock.  See ringq.h for the public contract. */
#ifndef RINGQ_INTERNAL_H
#define RINGQ_INTERNAL_H

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "ringq.h"

/* ---- time ---------------------------------------------------------------------------------------- */
/* CLOCK_MONOTONIC in ns: for waits and spins that count down. */
static inline int64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ---- bounds ------------------------------------------------------------------------------------ */
static inline int in_bounds(size_t maplen, size_t off, size_t len) {
    return off <= maplen && len <= maplen - off;
}

static inline int word_check(const void *base, size_t maplen, size_t off, size_t size) {
    if (!base || !in_bounds(maplen, off, size)) return RINGQ_EBOUNDS;
    if (((uintptr_t)base + off) & (size - 1)) return RINGQ_EALIGN;
    return 0;
}

/* ---- atomic words of a mapping ----------------------------------------------------------------- */
#define A64(base, off) ((_Atomic uint64_t *)(void *)((uint8_t *)(base) + (off)))
#define A32(base, off) ((_Atomic uint32_t *)(void *)((uint8_t *)(base) + (off)))

/* ---- records ----------------------------------------------------------------------------------- */
static inline uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint16_t rd16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint64_t rd64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

static inline int geom_check(size_t maplen, const ringq_geom *g) {
    if (!g || g->slot_size < RINGQ_REC_HEADER || (g->slot_size & 63) || g->slot_count == 0)
        return RINGQ_EINVAL;
    if ((g->state_off & 7) || (g->data_off & 7)) return RINGQ_EALIGN;
    if (!in_bounds(maplen, g->state_off, (size_t)g->slot_count * RINGQ_STATE_ENTRY)) return RINGQ_EBOUNDS;
    if (!in_bounds(maplen, g->data_off, (size_t)g->slot_count * g->slot_size)) return RINGQ_EBOUNDS;
    return 0;
}

static inline uint32_t record_crc(const ringq_geom *g, uint32_t slot, const uint8_t *rec, uint32_t len) {
    uint8_t seed[16];
    memset(seed, 0, sizeof seed);
    memcpy(seed, &g->seg_seq, 8);
    memcpy(seed + 8, &slot, 4);
    uint32_t crc = ringq_crc32c(0, seed, sizeof seed);
    return ringq_crc32c(crc, rec + 8, len - 8);
}

/* A state word a record may be published with: not EMPTY, not CONT. */
static inline int publishable(uint64_t state) {
    return (state & 7u) != RINGQ_ST_EMPTY && (state & 7u) != RINGQ_ST_CONT;
}

/* Publish the record at head `slot` spanning `span` slots: its continuation slots CONT, then a
 * release-store of `state` into the head (a reader that acquire-loads it sees the whole record).
 * Stores only: the caller checked the slots against the geometry. */
static inline void publish_record(uint8_t *base, const ringq_geom *g, uint32_t slot, uint32_t span,
                                  uint64_t state) {
    for (uint32_t i = 1; i < span; i++)
        atomic_store_explicit(A64(base, g->state_off + (size_t)(slot + i) * RINGQ_STATE_ENTRY),
                              (uint64_t)RINGQ_ST_CONT, memory_order_relaxed);
    atomic_store_explicit(A64(base, g->state_off + (size_t)slot * RINGQ_STATE_ENTRY), state,
                          memory_order_release);
}

/* Validate the record whose head is at `slot` (magic, lengths, CRC) and fill *out (ringq.c).  The
 * geometry must have passed geom_check and slot be below slot_count.  0 or RINGQ_ECORRUPT. */
__attribute__((visibility("hidden"))) int check_record(const uint8_t *base, const ringq_geom *g,
                                                      uint32_t slot, ringq_rec_info *out);

#endif /* RINGQ_INTERNAL_H */
