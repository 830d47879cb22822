/* ringq_selftest.c - the C helper alone, under AddressSanitizer and UndefinedBehaviorSanitizer.
 *
 * Built and run by tests/test_native_sanitized.py:
 *   gcc -std=gnu11 -g -O1 -fsanitize=address,undefined -fno-sanitize-recover=all \
 *       -Icsrc tests/native/ringq_selftest.c csrc/*.c -o selftest && ./selftest [iterations] [seed]
 *
 * Known answers (CRC32C, atomics, bounds and alignment errors), then a fuzz loop: random but
 * valid geometries over heap buffers of *exactly* the mapping's length (so any read or write past
 * the end is caught by ASan), filled with random bytes, random state words and a few real
 * records, and every entry point called with random slots, ranges and orders.  The append calls
 * get random batches too (lengths, ids, first record, scratch, data and control lengths, tails,
 * state words), writing into a real file.  Every call must return its documented codes; the
 * sanitizers abort on any out-of-bounds access or UB.
 * Prints "selftest: N passed, 0 failed" and exits 0 on success.
 */
#include "ringq.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static unsigned long checks, failures;
#define CHECK(cond)                                                                      \
    do {                                                                                 \
        checks++;                                                                        \
        if (!(cond)) {                                                                   \
            failures++;                                                                  \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);   \
        }                                                                                \
    } while (0)

static uint64_t rng_state;
static uint64_t rnd(void) { /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1DULL;
}
static uint32_t below(uint32_t n) { return n ? (uint32_t)(rnd() % n) : 0; }

/* The wall clock in ms since the Unix epoch, as the handle-taking calls read it. */
static int64_t wall_ms(void) {
    struct timespec rt;
    clock_gettime(CLOCK_REALTIME, &rt);
    return (int64_t)rt.tv_sec * 1000 + rt.tv_nsec / 1000000;
}

static void known_answers(void) {
    const uint8_t *s = (const uint8_t *)"123456789";
    CHECK(ringq_crc32c(0, s, 9) == 0xE3069283u);
    CHECK(ringq_crc32c_sw(0, s, 9) == 0xE3069283u);
    CHECK(ringq_crc32c_hw(0, s, 9) == 0xE3069283u);
    CHECK(ringq_crc32c(0, s, 0) == 0);
    uint8_t zeros[32] = {0}, ones[32];
    memset(ones, 0xff, sizeof ones);
    CHECK(ringq_crc32c(0, zeros, 32) == 0x8A9136AAu); /* RFC 3720 B.4 */
    CHECK(ringq_crc32c(0, ones, 32) == 0x62A8AB43u);
    /* incremental == whole, software == hardware, at every alignment and length */
    uint8_t *buf = malloc(300);
    for (int i = 0; i < 300; i++) buf[i] = (uint8_t)rnd();
    for (size_t off = 0; off < 9; off++)
        for (size_t len = 0; len + off <= 300; len += 7) {
            uint32_t whole = ringq_crc32c_sw(0, buf + off, len);
            CHECK(ringq_crc32c_hw(0, buf + off, len) == whole);
            size_t cut = len / 3;
            CHECK(ringq_crc32c(ringq_crc32c(0, buf + off, cut), buf + off + cut, len - cut) == whole);
        }
    free(buf);
}

static void atomics(void) {
    uint8_t *m = malloc(64);
    memset(m, 0, 64);
    uint64_t v = 1;
    uint32_t w = 1;
    CHECK(ringq_store64(m, 64, 8, 42) == 0);
    CHECK(ringq_load64(m, 64, 8, &v) == 0 && v == 42);
    CHECK(ringq_cas64(m, 64, 8, 41, 7, &v) == 0 && v == 42);
    CHECK(ringq_cas64(m, 64, 8, 42, 7, &v) == 1 && v == 7);
    CHECK(ringq_fetch_add64(m, 64, 8, 3, &v) == 0 && v == 7);
    CHECK(ringq_load64(m, 64, 56, &v) == 0);
    CHECK(ringq_load64(m, 64, 57, &v) == RINGQ_EBOUNDS);
    CHECK(ringq_load64(m, 64, 60, &v) == RINGQ_EBOUNDS);
    CHECK(ringq_load64(m, 64, 4, &v) == RINGQ_EALIGN);
    CHECK(ringq_load64(m, 64, (size_t)-8, &v) == RINGQ_EBOUNDS); /* no wrap-around */
    CHECK(ringq_load64(NULL, 64, 0, &v) == RINGQ_EBOUNDS);
    CHECK(ringq_store32(m, 64, 60, 5) == 0);
    CHECK(ringq_load32(m, 64, 60, &w) == 0 && w == 5);
    CHECK(ringq_load32(m, 64, 58, &w) == RINGQ_EALIGN);
    CHECK(ringq_load32(m, 64, 64, &w) == RINGQ_EBOUNDS);
    CHECK(ringq_cas32(m, 64, 60, 5, 6, NULL) == 1);
    CHECK(ringq_fetch_add32(m, 64, 60, 0xFFFFFFFFu, &w) == 0 && w == 6);
    CHECK(ringq_load32(m, 64, 60, &w) == 0 && w == 5);
    CHECK(ringq_msync(m, 64, 60, 8) == RINGQ_EBOUNDS);
    CHECK(ringq_futex_wake(m, 64, 64, 1) == RINGQ_EBOUNDS);
    CHECK(ringq_futex_wake(m, 64, 60, 0) == RINGQ_EINVAL);
    CHECK(ringq_futex_wait(m, 64, 60, 99, 1000) == 0); /* the word differs: returns at once */
    free(m);
}

static void watch_answers(void) {
    uint8_t *a = malloc(16), *b = malloc(8);
    memset(a, 0, 16);
    memset(b, 0, 8);
    ringq_watched w[3] = {{a, 16, 0, 0, 4, 0}, {a, 16, 8, 0, 8, 0}, {b, 8, 0, 0, 8, 0}};
    CHECK(ringq_store32(a, 16, 0, 5) == 0 && ringq_store64(a, 16, 8, 1ull << 40) == 0);
    CHECK(ringq_store64(b, 8, 0, 9) == 0);
    CHECK(ringq_watch(w, 3, 0) == 0); /* the expects (0) are not what the words hold */
    CHECK(ringq_watch(w, 3, 1) == 1 && w[0].expect == 5 && w[1].expect == 1ull << 40 && w[2].expect == 9);
    CHECK(ringq_watch(w, 3, 0) == 1);
    CHECK(ringq_store64(b, 8, 0, 10) == 0); /* the last word moves: seen */
    CHECK(ringq_watch(w, 3, 0) == 0);
    CHECK(ringq_watch(w, 2, 0) == 1);       /* ... by a watch of all three only */
    CHECK(ringq_watch(w, 3, 1) == 1 && ringq_watch(w, 3, 0) == 1);
    CHECK(ringq_watch(w, 0, 0) == 1 && ringq_watch(NULL, 0, 0) == 1 && ringq_watch(NULL, 1, 0) == RINGQ_EINVAL);
    /* a bad entry anywhere: refused before anything is read or reset */
    ringq_watched bad[2] = {{a, 16, 0, 77, 4, 0}, {a, 16, 4, 0, 8, 0}};
    CHECK(ringq_watch(bad, 2, 1) == RINGQ_EALIGN && bad[0].expect == 77);
    bad[1].off = 16;
    CHECK(ringq_watch(bad, 2, 1) == RINGQ_EBOUNDS && bad[0].expect == 77);
    bad[1].off = 8;
    bad[1].width = 2;
    CHECK(ringq_watch(bad, 2, 1) == RINGQ_EINVAL && bad[0].expect == 77);
    bad[1].width = 8;
    bad[1].maplen = 0; /* a closed mapping: its length is 0 */
    CHECK(ringq_watch(bad, 2, 0) == RINGQ_EBOUNDS);
    free(a);
    free(b);
}

static void put_record(uint8_t *m, size_t maplen, const ringq_geom *g, uint32_t slot, uint32_t plen) {
    uint32_t len = RINGQ_REC_HEADER + plen;
    uint32_t span = (len + g->slot_size - 1) / g->slot_size;
    uint8_t *rec = malloc(len);
    memset(rec, 0, len);
    uint32_t magic = RINGQ_REC_MAGIC;
    memcpy(rec, &magic, 4);
    memcpy(rec + 8, &len, 4);
    memcpy(rec + 12, &span, 4);
    memcpy(rec + 52, &plen, 4);
    for (uint32_t i = 0; i < plen; i++) rec[64 + i] = (uint8_t)rnd();
    int rc = ringq_rec_write(m, maplen, g, slot, rec, len, RINGQ_ST_READY | (1ULL << 24));
    CHECK(rc == (int)span || rc == RINGQ_EBOUNDS);
    if (rc > 0) {
        ringq_rec_info info;
        CHECK(ringq_rec_check(m, maplen, g, slot, &info) == 0);
        CHECK(info.span == span && info.record_len == len && info.payload_len == plen);
    }
    free(rec);
}

/* A zeroed segment of `slots` 128-byte slots in one buffer, its state table first: the geometry in
 * *g, the buffer's length in *maplen (the known-answer tests' fixture; free() the result). */
static uint8_t *new_segment(ringq_geom *g, uint32_t seq, uint32_t slots, size_t *maplen) {
    *g = (ringq_geom){.seg_seq = seq, .state_off = 0, .data_off = slots * RINGQ_STATE_ENTRY, .slot_size = 128,
                      .slot_count = slots};
    *maplen = g->data_off + (size_t)slots * 128;
    return calloc(1, *maplen);
}

/* ringq_claim_next and ringq_ack_slot on whatever the buffer holds: documented codes only, a
 * claim changes exactly the slot it names (to LEASED, lease count 1, the deadline, the owner word),
 * an ack only to DONE with the lease count kept. */
static void claim_and_ack(uint8_t *m, size_t maplen, const ringq_geom *g, int ok_geom, const uint32_t *order) {
    uint8_t *plain = malloc(g->slot_count); /* exactly slot_count bytes: an overread is caught */
    for (uint32_t i = 0; i < g->slot_count; i++) plain[i] = (uint8_t)below(2);
    uint32_t n = below(17), start = below(19);
    uint32_t expect = n && below(4) ? order[below(n)] : below(g->slot_count + 3);
    uint64_t now_rel = rnd() & 0xFFFFFFFFFFULL, deadline = below(8) ? now_rel + below(100000) : rnd();
    uint64_t owner_base = rnd() & ~(0x3FFFFULL << RINGQ_OW_LC_SHIFT);
    ringq_claim_out co;
    int rc = ringq_claim_next(m, maplen, g, order, n, start, expect, plain, now_rel, deadline, owner_base, &co);
    if (!ok_geom) {
        CHECK(rc == RINGQ_EBOUNDS);
    } else {
        CHECK(rc == 0);
        CHECK(co.status == RINGQ_CLAIMED || co.status == RINGQ_CLAIM_ASK || co.status == RINGQ_CLAIM_NONE);
        if (co.status == RINGQ_CLAIMED) {
            CHECK(co.index >= start && co.index < n && order[co.index] == co.slot && co.slot == expect);
            uint64_t w = 0, ow = 0;
            ringq_load64(m, maplen, g->state_off + (size_t)co.slot * RINGQ_STATE_ENTRY, &w);
            ringq_load64(m, maplen, g->state_off + (size_t)co.slot * RINGQ_STATE_ENTRY + 8, &ow);
            CHECK(w == co.word && (w & 7) == RINGQ_ST_LEASED && ((w >> RINGQ_W_LC_SHIFT) & RINGQ_W_LC_MASK) == 1);
            CHECK((w >> RINGQ_W_TIME_SHIFT) == (deadline > RINGQ_W_TIME_MAX ? RINGQ_W_TIME_MAX : deadline));
            CHECK(ow == (owner_base | (1ULL << RINGQ_OW_LC_SHIFT)));
        } else if (co.status == RINGQ_CLAIM_ASK) {
            CHECK(co.index >= start && co.index < n && (co.word & 7) == RINGQ_ST_READY);
        }
    }
    CHECK(ringq_claim_next(m, maplen, g, NULL, n, start, expect, plain, 0, 0, 0, &co) ==
          (ok_geom ? RINGQ_EINVAL : RINGQ_EBOUNDS));
    uint32_t slot = below(g->slot_count + 2), token = below(3);
    uint64_t before = 0, w = 0;
    if (slot < g->slot_count) ringq_load64(m, maplen, g->state_off + (size_t)slot * RINGQ_STATE_ENTRY, &before);
    uint64_t ctl[32] = {0}, fin = 0;
    ringq_ctl_words words = {.acked = 8 * below(34)}; /* past the page now and then: refused */
    rc = ringq_ack_slot(m, maplen, g, slot, token, now_rel, (uint8_t *)ctl, sizeof ctl, &words, &w, &fin);
    if (!ok_geom || slot >= g->slot_count || maplen < RINGQ_SEG_OFF_FINISHED + 8 || words.acked >= sizeof ctl) {
        CHECK(rc == RINGQ_EBOUNDS);
    } else {
        CHECK(rc >= 0 && rc <= 3);
        if (rc == 0) {
            CHECK(ctl[words.acked / 8] == 1);
            CHECK((before & 7) == RINGQ_ST_LEASED && (w & 7) == RINGQ_ST_DONE);
            CHECK(((w ^ before) >> RINGQ_W_LC_SHIFT & RINGQ_W_LC_MASK) == 0);
        } else {
            CHECK(w == before); /* refused, repeated or left to the caller: unchanged */
        }
    }
    free(plain);
}

/* A record with the fields ringq_wait_claim looks at, published READY at time 0. */
static void put_job(uint8_t *m, size_t maplen, const ringq_geom *g, uint32_t slot, uint8_t kind, int32_t prio,
                    int64_t avail_ms, int64_t enq_us) {
    uint32_t plen = 10, len = RINGQ_REC_HEADER + plen, span = 1;
    uint8_t rec[RINGQ_REC_HEADER + 10];
    memset(rec, 0, sizeof rec);
    uint32_t magic = RINGQ_REC_MAGIC;
    memcpy(rec, &magic, 4);
    memcpy(rec + 8, &len, 4);
    memcpy(rec + 12, &span, 4);
    memcpy(rec + 24, &enq_us, 8);
    memcpy(rec + 32, &avail_ms, 8);
    memcpy(rec + 40, &prio, 4);
    rec[51] = kind;
    memcpy(rec + 52, &plen, 4);
    CHECK(ringq_rec_write(m, maplen, g, slot, rec, len, RINGQ_ST_READY) == 1);
}

/* ringq_wait_claim: it leases only the one job the caller's index would rank first. */
static void wait_claim_answers(void) {
    ringq_geom g = {.seg_seq = 9, .state_off = 256, .data_off = 256 + 4 * RINGQ_STATE_ENTRY, .slot_size = 128, .slot_count = 4};
    size_t maplen = g.data_off + 4 * 128;
    uint8_t *m = calloc(1, maplen);
    uint64_t ctlbuf[32] = {0};
    uint8_t *ctl = (uint8_t *)ctlbuf;
    ringq_wait_args a = {.wake_off = 88, .waiters_off = 92, .change_off = 96, .wake_seen = 0, .from_slot = 0,
                         .change_seen = 0, .spin_ns = 0, .timeout_ns = 1000000, .epoch_ms = 0, .vt_ms = 500, .owner_base = 7};
    ringq_claim_out co;
    uint32_t tail = 1;
    CHECK(ringq_wait_claim(ctl, sizeof ctlbuf, m, maplen, &g, &a, &co, NULL) == 0 && co.status == RINGQ_CLAIM_NONE); /* timed out */
    ctl[88] = 1; /* the wake word moved */
    CHECK(ringq_wait_claim(ctl, sizeof ctlbuf, m, maplen, &g, &a, &co, NULL) == 0 && co.status == RINGQ_CLAIM_ASK); /* nothing new */
    put_job(m, maplen, &g, 0, 1, 0, 1000, 1000000);
    memcpy(m + RINGQ_SEG_OFF_TAIL, &tail, 4);
    ctlbuf[96 / 8] = 5; /* a job returned to READY meanwhile */
    CHECK(ringq_wait_claim(ctl, sizeof ctlbuf, m, maplen, &g, &a, &co, NULL) == 0 && co.status == RINGQ_CLAIM_ASK);
    ctlbuf[96 / 8] = 0;
    put_job(m, maplen, &g, 1, 1, 3, 1000, 1000000); /* a later job of higher priority */
    tail = 2;
    memcpy(m + RINGQ_SEG_OFF_TAIL, &tail, 4);
    CHECK(ringq_wait_claim(ctl, sizeof ctlbuf, m, maplen, &g, &a, &co, NULL) == 0 && co.status == RINGQ_CLAIM_ASK);
    a.from_slot = 1; /* only the second is new: it is leased, and its fields reported */
    a.floor_off = 104; /* with a lease-deadline floor to lower: bad generation bits lease nothing */
    ctlbuf[104 / 8] = (UINT64_MAX >> 20) << 20;
    CHECK(ringq_wait_claim(ctl, sizeof ctlbuf, m, maplen, &g, &a, &co, NULL) == RINGQ_EINVAL);
    a.floor_gen_bits = 20;
    a.floor_off = 4096;
    CHECK(ringq_wait_claim(ctl, sizeof ctlbuf, m, maplen, &g, &a, &co, NULL) == RINGQ_EBOUNDS);
    a.floor_off = 104;
    ringq_claimed rec;
    memset(&rec, 0xAB, sizeof rec);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t before_ms = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
    CHECK(ringq_wait_claim(ctl, sizeof ctlbuf, m, maplen, &g, &a, &co, &rec) == 0 && co.status == RINGQ_CLAIMED && co.slot == 1);
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t after_ms = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
    uint64_t floor_ms = ctlbuf[104 / 8] >> 20; /* lowered to the lease's deadline (epoch 0) */
    CHECK(floor_ms >= before_ms + 500 && floor_ms <= after_ms + 500 && (ctlbuf[104 / 8] & 0xFFFFF) == 1);
    CHECK(rec.word == co.word && rec.slot == 1 && rec.priority == 3 && rec.available_ms == 1000 &&
          rec.enqueued_us == 1000000 && rec.payload_len == 10 && rec.id_len == 0 && rec.pad8 == 0 && rec.pad32 == 0);
    uint64_t w = 0, ow = 0;
    ringq_load64(m, maplen, g.state_off + 1 * RINGQ_STATE_ENTRY, &w);
    ringq_load64(m, maplen, g.state_off + 1 * RINGQ_STATE_ENTRY + 8, &ow);
    CHECK(w == co.word && (w & 7) == RINGQ_ST_LEASED && ((w >> RINGQ_W_LC_SHIFT) & RINGQ_W_LC_MASK) == 1);
    CHECK(ow == (7 | (1ULL << RINGQ_OW_LC_SHIFT)));
    /* Leased already (as by another consumer): one wake-up since the wait's and that one new
     * record, so it sleeps on, past the record, until it times out ... */
    CHECK(ringq_wait_claim(ctl, sizeof ctlbuf, m, maplen, &g, &a, &co, NULL) == 0 && co.status == RINGQ_CLAIM_ASK);
    a.tail_seg_off = 72; /* (only where it is told which segment appends go to) */
    ctlbuf[72 / 8] = g.seg_seq;
    CHECK(ringq_wait_claim(ctl, sizeof ctlbuf, m, maplen, &g, &a, &co, NULL) == 0 && co.status == RINGQ_CLAIM_NONE);
    ctl[88] = 2; /* ... but with two wake-ups, something else happened too: the caller looks */
    CHECK(ringq_wait_claim(ctl, sizeof ctlbuf, m, maplen, &g, &a, &co, NULL) == 0 && co.status == RINGQ_CLAIM_ASK);
    ctl[88] = 1;
    ctlbuf[72 / 8] = g.seg_seq + 1; /* ... and so it does when appends went on to a newer segment */
    CHECK(ringq_wait_claim(ctl, sizeof ctlbuf, m, maplen, &g, &a, &co, NULL) == 0 && co.status == RINGQ_CLAIM_ASK);
    a.tail_seg_off = 4096; /* outside the control page */
    CHECK(ringq_wait_claim(ctl, sizeof ctlbuf, m, maplen, &g, &a, &co, NULL) == RINGQ_EBOUNDS);
    a.tail_seg_off = 0;
    put_job(m, maplen, &g, 2, 2, 0, 1000, 1000000); /* kind 2: an expiry applies */
    put_job(m, maplen, &g, 3, 1, 0, 5000, 1000000); /* delayed */
    tail = 4;
    memcpy(m + RINGQ_SEG_OFF_TAIL, &tail, 4);
    a.from_slot = 2;
    CHECK(ringq_wait_claim(ctl, sizeof ctlbuf, m, maplen, &g, &a, &co, NULL) == 0 && co.status == RINGQ_CLAIM_ASK);
    a.from_slot = 3;
    CHECK(ringq_wait_claim(ctl, sizeof ctlbuf, m, maplen, &g, &a, &co, NULL) == 0 && co.status == RINGQ_CLAIM_ASK);
    a.change_off = 4096; /* outside the control page */
    CHECK(ringq_wait_claim(ctl, sizeof ctlbuf, m, maplen, &g, &a, &co, NULL) == RINGQ_EBOUNDS);
    CHECK(ringq_wait_claim(ctl, sizeof ctlbuf, m, maplen, &g, NULL, &co, NULL) == RINGQ_EINVAL);
    free(m);
}

static void packed_answers(void) {
    uint64_t w[2] = {(100ULL << 20) | 5, 0};
    CHECK(ringq_lower_packed64((uint8_t *)w, 16, 0, 20, 50) == 0 && w[0] == ((50ULL << 20) | 6));
    CHECK(ringq_lower_packed64((uint8_t *)w, 16, 0, 20, 70) == 0 && w[0] == ((50ULL << 20) | 7));
    w[0] = (1ULL << 20) | 0xFFFFF; /* the generation wraps within its bits */
    CHECK(ringq_lower_packed64((uint8_t *)w, 16, 0, 20, UINT64_MAX) == 0 && w[0] == (1ULL << 20));
    CHECK(ringq_lower_packed64((uint8_t *)w, 16, 0, 0, 1) == RINGQ_EINVAL);
    CHECK(ringq_lower_packed64((uint8_t *)w, 16, 0, 64, 1) == RINGQ_EINVAL);
    CHECK(ringq_lower_packed64((uint8_t *)w, 16, 12, 20, 1) == RINGQ_EBOUNDS);
    CHECK(ringq_lower_packed64((uint8_t *)w, 16, 4, 20, 1) == RINGQ_EALIGN);
}

static void spin_answers(void) {
    uint32_t word[2] = {7, 0};
    CHECK(ringq_spin_wait((const uint8_t *)word, 8, 0, 6, 1000000) == 0); /* differs already */
    CHECK(ringq_spin_wait((const uint8_t *)word, 8, 0, 7, 0) == 1);        /* no spin */
    CHECK(ringq_spin_wait((const uint8_t *)word, 8, 0, 7, 200000) == 1);   /* runs out */
    CHECK(ringq_spin_wait((const uint8_t *)word, 8, 6, 7, 10) == RINGQ_EBOUNDS);
    CHECK(ringq_spin_wait((const uint8_t *)word, 8, 2, 7, 10) == RINGQ_EALIGN);
}

/* One record through a lease and an ack, with the answers the Python side relies on. */
static void claim_known_answers(void) {
    ringq_geom g;
    size_t maplen;
    uint8_t *m = new_segment(&g, 5, 4, &maplen);
    put_record(m, maplen, &g, 1, 20); /* READY, time 1 */
    uint8_t plain[4] = {1, 1, 1, 1};
    uint32_t order[3] = {0, 1, 2};
    ringq_claim_out co;
    CHECK(ringq_claim_next(m, maplen, &g, order, 3, 0, 2, plain, 10, 500, 7, &co) == 0);
    CHECK(co.status == RINGQ_CLAIM_ASK && co.slot == 1); /* ranked another slot: nothing changes */
    CHECK(ringq_claim_next(m, maplen, &g, order, 3, 0, 1, plain, 0, 500, 7, &co) == 0);
    CHECK(co.status == RINGQ_CLAIM_ASK); /* not due yet */
    plain[1] = 0;
    CHECK(ringq_claim_next(m, maplen, &g, order, 3, 0, 1, plain, 10, 500, 7, &co) == 0 && co.status == RINGQ_CLAIM_ASK);
    plain[1] = 1;
    CHECK(ringq_claim_next(m, maplen, &g, order, 3, 0, 1, plain, 10, 500, 7, &co) == 0);
    CHECK(co.status == RINGQ_CLAIMED && co.index == 1 && co.slot == 1);
    CHECK(ringq_claim_next(m, maplen, &g, order, 3, 0, 1, plain, 10, 500, 7, &co) == 0 && co.status == RINGQ_CLAIM_NONE);
    uint64_t w = 0, fin = 0, cbuf[32] = {0};
    uint8_t *c = (uint8_t *)cbuf;
    ringq_ctl_words cw = {.acked = 232};
    CHECK(ringq_ack_slot(m, maplen, &g, 1, 2, 20, c, sizeof cbuf, &cw, &w, &fin) == 2);      /* another token: refused */
    CHECK(ringq_ack_slot(m, maplen, &g, 0, 0, 20, c, sizeof cbuf, &cw, &w, &fin) == 2);      /* never published */
    CHECK(ringq_ack_slot(m, maplen, &g, 1, 1, 20, c, sizeof cbuf, &cw, &w, &fin) == 0 && (w & 7) == RINGQ_ST_DONE);
    CHECK(fin == 1 && cbuf[232 / 8] == 1); /* counted once, as finished and as acked */
    CHECK(ringq_ack_slot(m, maplen, &g, 1, 1, 30, c, sizeof cbuf, &cw, &w, &fin) == 1);      /* repeated */
    CHECK(ringq_ack_slot(m, maplen, &g, 1, 0, 30, c, sizeof cbuf, &cw, &w, &fin) == 1);      /* repeated, by bare id */
    CHECK(ringq_ack_slot(m, maplen, &g, 1, 0, 30, c, sizeof cbuf, &cw, NULL, &fin) == RINGQ_EINVAL);
    /* a cancel-requested lease is left to the caller */
    uint64_t leased = RINGQ_ST_LEASED | RINGQ_W_CANCEL | (1ULL << RINGQ_W_LC_SHIFT);
    ringq_store64(m, maplen, 2 * RINGQ_STATE_ENTRY, leased);
    CHECK(ringq_ack_slot(m, maplen, &g, 2, 1, 30, c, sizeof cbuf, &cw, &w, &fin) == 3 && w == leased);
    /* cancelled by the holder's ack (reason 0) is a repeat; cancelled after the lease ended unacked
     * (reason 2) is not: no ack went in, so the holder's is refused; an ack by bare id names no
     * lease and is a repeat of any finished job */
    uint64_t ended = RINGQ_ST_DONE | RINGQ_W_CANCEL | (1ULL << RINGQ_W_LC_SHIFT);
    ringq_store64(m, maplen, 2 * RINGQ_STATE_ENTRY, ended | ((uint64_t)RINGQ_END_CANCELLED << RINGQ_W_WHY_SHIFT));
    CHECK(ringq_ack_slot(m, maplen, &g, 2, 1, 30, c, sizeof cbuf, &cw, &w, &fin) == 1);
    ended |= (uint64_t)RINGQ_END_RECLAIMED << RINGQ_W_WHY_SHIFT;
    ringq_store64(m, maplen, 2 * RINGQ_STATE_ENTRY, ended);
    CHECK(ringq_ack_slot(m, maplen, &g, 2, 1, 30, c, sizeof cbuf, &cw, &w, &fin) == 2 && w == ended);
    CHECK(ringq_ack_slot(m, maplen, &g, 2, 0, 30, c, sizeof cbuf, &cw, &w, &fin) == 1 && w == ended);
    ringq_store64(m, maplen, 2 * RINGQ_STATE_ENTRY, leased);
    /* ringq_ack: the same through the handles, at the clock's time, reporting the dependents
     * counter; a handle whose length was zeroed (an unmapped segment or page) is refused. */
    int64_t now_ms = wall_ms();
    ringq_seg_ref sref = {.base = m, .maplen = maplen, .g = &g, .epoch_ms = now_ms - 5000};
    ringq_ctl_ref cref = {.base = c, .len = sizeof cbuf, .words = &cw, .deps = 248};
    uint64_t out[3] = {0, 0, 0};
    cbuf[248 / 8] = 42;
    ringq_store64(m, maplen, 3 * RINGQ_STATE_ENTRY, RINGQ_ST_LEASED | (4ULL << RINGQ_W_LC_SHIFT));
    CHECK(ringq_ack(&sref, &cref, 3, 3, 0, out) == 2);                /* another token: refused */
    CHECK(ringq_ack(&sref, &cref, 3, 4, 0, out) == 0 && (out[0] & 7) == RINGQ_ST_DONE);
    CHECK(((out[0] >> RINGQ_W_LC_SHIFT) & RINGQ_W_LC_MASK) == 4);
    uint64_t at = out[0] >> RINGQ_W_TIME_SHIFT; /* ms since the handle's epoch: about 5000 */
    CHECK(at >= 5000 && at < 65000);
    CHECK(out[1] == 2 && out[2] == 42 && cbuf[232 / 8] == 2);
    CHECK(ringq_ack(&sref, &cref, 3, 4, 0, out) == 1);                /* repeated */
    sref.epoch_ms = now_ms + 3600000;                               /* an epoch ahead of the clock */
    ringq_store64(m, maplen, 3 * RINGQ_STATE_ENTRY, RINGQ_ST_LEASED | (1ULL << RINGQ_W_LC_SHIFT));
    CHECK(ringq_ack(&sref, &cref, 3, 1, 0, out) == 0 && (out[0] >> RINGQ_W_TIME_SHIFT) == 0);
    cref.deps = 0;                                                  /* no counter: reported as 0 */
    ringq_store64(m, maplen, 3 * RINGQ_STATE_ENTRY, RINGQ_ST_LEASED | (1ULL << RINGQ_W_LC_SHIFT));
    CHECK(ringq_ack(&sref, &cref, 3, 1, 0, out) == 0 && out[2] == 0);
    cref.deps = sizeof cbuf;                                        /* past the page */
    CHECK(ringq_ack(&sref, &cref, 3, 1, 0, out) == RINGQ_EBOUNDS);
    cref.deps = 248;
    sref.maplen = 0;
    CHECK(ringq_ack(&sref, &cref, 3, 1, 0, out) == RINGQ_EBOUNDS);
    sref.maplen = maplen;
    cref.len = 0;
    CHECK(ringq_ack(&sref, &cref, 3, 1, 0, out) == RINGQ_EBOUNDS);
    CHECK(ringq_ack(NULL, &cref, 3, 1, 0, out) == RINGQ_EINVAL && ringq_ack(&sref, &cref, 3, 1, 0, NULL) == RINGQ_EINVAL);
    /* With the job's seq: the slot's record must be that job's and the lease still running, or
     * nothing changes (RINGQ_ACK_OTHER, RINGQ_ACK_EXPIRED); without it, neither is looked at. */
    sref.epoch_ms = now_ms - 5000; /* now is about 5000 ms after the epoch */
    cref.len = sizeof cbuf;
    uint64_t seq = 77;
    memcpy(m + g.data_off + 1 * g.slot_size + 16, &seq, 8); /* slot 1's record names job 77 */
    uint64_t running = RINGQ_ST_LEASED | (2ULL << RINGQ_W_LC_SHIFT) | (65000ULL << RINGQ_W_TIME_SHIFT);
    uint64_t ran_out = RINGQ_ST_LEASED | (2ULL << RINGQ_W_LC_SHIFT) | (1000ULL << RINGQ_W_TIME_SHIFT);
    ringq_store64(m, maplen, 1 * RINGQ_STATE_ENTRY, running);
    CHECK(ringq_ack(&sref, &cref, 1, 2, 76, out) == RINGQ_ACK_OTHER);          /* another job's record */
    ringq_store64(m, maplen, 0, running);
    CHECK(ringq_ack(&sref, &cref, 0, 2, 77, out) == RINGQ_ACK_OTHER);          /* no record at all */
    CHECK(ringq_ack(&sref, &cref, 4, 2, 77, out) == RINGQ_EBOUNDS);            /* past the slots */
    uint64_t now_word = 0;
    CHECK(ringq_load64(m, maplen, 1 * RINGQ_STATE_ENTRY, &now_word) == 0 && now_word == running);
    CHECK(ringq_ack(&sref, &cref, 1, 2, 77, out) == 0 && (out[0] & 7) == RINGQ_ST_DONE);
    ringq_store64(m, maplen, 1 * RINGQ_STATE_ENTRY, ran_out);
    CHECK(ringq_ack(&sref, &cref, 1, 2, 77, out) == RINGQ_ACK_EXPIRED && out[0] == ran_out);
    CHECK(ringq_load64(m, maplen, 1 * RINGQ_STATE_ENTRY, &now_word) == 0 && now_word == ran_out);
    CHECK(ringq_ack(&sref, &cref, 1, 0, 77, out) == RINGQ_ACK_EXPIRED);        /* by bare id, too */
    CHECK(ringq_ack(&sref, &cref, 1, 3, 77, out) == 2 && out[0] == ran_out);   /* another token: refused */
    CHECK(ringq_ack(&sref, &cref, 1, 2, 0, out) == 0 && (out[0] & 7) == RINGQ_ST_DONE); /* not looked at */
    free(m);
}

/* ringq_take_run: ringq_claim_run through the segment's handle, at the clock's time, lowering the
 * lease-deadline floor of the control page to the run's deadline. */
static void take_run_known_answers(void) {
    ringq_geom g;
    size_t maplen;
    uint8_t *m = new_segment(&g, 10, 4, &maplen);
    for (uint32_t s = 0; s < 3; s++) put_record(m, maplen, &g, s, 10); /* READY, time 1 */
    uint8_t plain[4] = {1, 1, 1, 1};
    uint32_t order[3] = {0, 1, 2};
    int64_t avail[4] = {0}, enq[4] = {0};
    uint64_t seq[4] = {1, 2, 3, 0};
    ringq_run_keys k = {.avail_ms = avail, .enq_us = enq, .seq = seq, .bounded = 0};
    ringq_claimed out[4];
    uint32_t nw[3] = {99, 99, 99};
    uint64_t cbuf[32] = {0};
    const uint32_t gen_bits = 20;
    cbuf[248 / 8] = (((1ULL << 44) - 1) << gen_bits) | 7; /* no lease known, generation 7 */
    ringq_ctl_words cw = {.acked = 232};
    ringq_ctl_ref c = {.base = (uint8_t *)cbuf, .len = sizeof cbuf, .words = &cw, .floor = 248, .floor_gen_bits = gen_bits};
    int64_t now = wall_ms();
    ringq_seg_ref s = {.base = m, .maplen = maplen, .g = &g, .epoch_ms = now + 60000};
    /* an epoch ahead of the clock: due at time 1, nothing is due yet, and the floor stays */
    CHECK(ringq_take_run(&s, &c, order, 3, 0, plain, &k, 500, 7, out, 4, nw) == 0);
    CHECK(nw[0] == 0 && nw[1] == RINGQ_RUN_ASK && nw[2] == 0 && cbuf[248 / 8] == ((((1ULL << 44) - 1) << gen_bits) | 7));
    s.epoch_ms = now - 10000; /* due since 10 s */
    CHECK(ringq_take_run(&s, &c, order, 3, 0, plain, &k, 500, 7, out, 2, nw) == 2);
    CHECK(nw[0] == 2 && nw[1] == RINGQ_RUN_FULL && nw[2] == 2 && out[0].slot == 0 && out[1].slot == 1);
    uint64_t until = out[0].word >> RINGQ_W_TIME_SHIFT; /* the clock's time past the epoch + 500 ms */
    CHECK(until >= 10500 && until < 70500);
    /* the floor: the run's deadline (ms since the Unix epoch), its generation bumped */
    CHECK((cbuf[248 / 8] >> gen_bits) == (uint64_t)s.epoch_ms + until && (cbuf[248 / 8] & 0xFFFFF) == 8);
    s.maplen = 0; /* a handle whose segment was unmapped */
    CHECK(ringq_take_run(&s, &c, order, 3, 2, plain, &k, 500, 7, out, 4, nw) == RINGQ_EBOUNDS);
    CHECK(nw[2] == 0); /* nothing leased: nothing to find again */
    s.maplen = maplen;
    c.floor = sizeof cbuf; /* a floor past the page: refused before anything is leased */
    CHECK(ringq_take_run(&s, &c, order, 3, 2, plain, &k, 500, 7, out, 4, nw) == RINGQ_EBOUNDS);
    c.floor = 248;
    c.floor_gen_bits = 0;
    CHECK(ringq_take_run(&s, &c, order, 3, 2, plain, &k, 500, 7, out, 4, nw) == RINGQ_EINVAL);
    c.floor_gen_bits = gen_bits;
    uint64_t w2 = 0;
    CHECK(ringq_load64(m, maplen, 2 * RINGQ_STATE_ENTRY, &w2) == 0 && (w2 & 7) == RINGQ_ST_READY);
    CHECK(ringq_take_run(NULL, &c, order, 3, 2, plain, &k, 500, 7, out, 4, nw) == RINGQ_EINVAL);
    CHECK(ringq_take_run(&s, NULL, order, 3, 2, plain, &k, 500, 7, out, 4, nw) == RINGQ_EINVAL);
    CHECK(ringq_take_run(&s, &c, order, 3, 2, plain, &k, 500, 7, out, 4, NULL) == RINGQ_EINVAL);
    c.floor = 0; /* no floor to lower */
    CHECK(ringq_take_run(&s, &c, order, 3, 2, plain, &k, 500, 7, out, 4, nw) == 1);
    CHECK(nw[0] == 3 && nw[1] == RINGQ_RUN_END && nw[2] == 1 && out[0].slot == 2 && (cbuf[248 / 8] & 0xFFFFF) == 8);
    free(m);
}

/* ringq_claim_run: a run of plain jobs in one call, stopping where the caller must decide. */
static void claim_run_known_answers(void) {
    ringq_geom g;
    size_t maplen;
    uint8_t *m = new_segment(&g, 9, 8, &maplen);
    for (uint32_t s = 0; s < 6; s++) put_record(m, maplen, &g, s, 10); /* READY, time 1 */
    uint8_t plain[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    uint32_t order[6] = {0, 1, 2, 3, 4, 5};
    int64_t avail[8] = {10, 11, 12, 13, 14, 15, 0, 0}, enq[8] = {0};
    uint64_t seq[8] = {1, 2, 3, 4, 5, 6, 0, 0};
    ringq_run_keys k = {.avail_ms = avail, .enq_us = enq, .seq = seq, .bounded = 0};
    ringq_claimed out[8];
    uint32_t next = 99, why = 99;
    /* not due yet: nothing leased, the first candidate handed back */
    CHECK(ringq_claim_run(m, maplen, &g, order, 6, 0, plain, &k, 0, 500, 7, out, 8, &next, &why) == 0);
    CHECK(why == RINGQ_RUN_ASK && next == 0);
    /* two leased, then the cap */
    CHECK(ringq_claim_run(m, maplen, &g, order, 6, 0, plain, &k, 10, 500, 7, out, 2, &next, &why) == 2);
    CHECK(why == RINGQ_RUN_FULL && next == 2 && out[0].slot == 0 && out[1].slot == 1);
    CHECK((out[0].word & 7) == RINGQ_ST_LEASED && ((out[0].word >> RINGQ_W_LC_SHIFT) & RINGQ_W_LC_MASK) == 1);
    CHECK((out[0].word >> RINGQ_W_TIME_SHIFT) == 500 && out[0].payload_len == 10 && out[0].id_len == 0);
    uint64_t ow = 0;
    CHECK(ringq_load64(m, maplen, 0 * RINGQ_STATE_ENTRY + 8, &ow) == 0 && ow == (7 | (1ULL << RINGQ_OW_LC_SHIFT)));
    /* a bound: slots ranking after (12, 0, 3) are left for the other lane */
    k.bounded = 1;
    k.bound_avail_ms = 12;
    k.bound_enq_us = 0;
    k.bound_seq32 = 4;
    CHECK(ringq_claim_run(m, maplen, &g, order, 6, 2, plain, &k, 10, 500, 7, out, 8, &next, &why) == 1);
    CHECK(why == RINGQ_RUN_BOUND && next == 3 && out[0].slot == 2);
    /* a bound equal to a candidate's key is that job's own entry elsewhere: it is leased, and the
     * run stops after it (slot 3 is (13, 0, 4)) */
    k.bound_avail_ms = 13;
    CHECK(ringq_claim_run(m, maplen, &g, order, 6, 3, plain, &k, 10, 500, 7, out, 8, &next, &why) == 1);
    CHECK(why == RINGQ_RUN_BOUND && next == 4 && out[0].slot == 3);
    k.bounded = 0;
    /* a slot that is not plain stops the run there; leased ones are passed over */
    plain[5] = 0;
    CHECK(ringq_claim_run(m, maplen, &g, order, 6, 0, plain, &k, 10, 500, 7, out, 8, &next, &why) == 1);
    CHECK(why == RINGQ_RUN_ASK && next == 5 && out[0].slot == 4);
    plain[5] = 1;
    /* a record that fails its CRC is handed back, untouched */
    m[g.data_off + 5 * 128 + 70] ^= 1;
    CHECK(ringq_claim_run(m, maplen, &g, order, 6, 0, plain, &k, 10, 500, 7, out, 8, &next, &why) == 0);
    CHECK(why == RINGQ_RUN_ASK && next == 5);
    uint64_t w5 = 0;
    CHECK(ringq_load64(m, maplen, 5 * RINGQ_STATE_ENTRY, &w5) == 0 && (w5 & 7) == RINGQ_ST_READY);
    CHECK(ringq_claim_run(m, maplen, &g, order, 6, 6, plain, &k, 10, 500, 7, out, 8, &next, &why) == 0);
    CHECK(why == RINGQ_RUN_END && next == 6);
    /* bad arguments */
    CHECK(ringq_claim_run(m, maplen, &g, order, 6, 0, plain, NULL, 10, 500, 7, out, 8, &next, &why) == RINGQ_EINVAL);
    k.seq = NULL;
    CHECK(ringq_claim_run(m, maplen, &g, order, 6, 0, plain, &k, 10, 500, 7, out, 8, &next, &why) == RINGQ_EINVAL);
    k.seq = seq;
    CHECK(ringq_claim_run(m, maplen - 1, &g, order, 6, 0, plain, &k, 10, 500, 7, out, 8, &next, &why) == RINGQ_EBOUNDS);
    /* order entries beyond the segment are skipped, never read */
    uint32_t wild[2] = {1000, 5000};
    CHECK(ringq_claim_run(m, maplen, &g, wild, 2, 0, plain, &k, 10, 500, 7, out, 8, &next, &why) == 0 && why == RINGQ_RUN_END);
    free(m);
}

static void fuzz_once(void) {
    ringq_geom g;
    g.slot_size = 64u * (1 + below(6));
    g.slot_count = 1 + below(40);
    g.seg_seq = rnd() & 0xFFFF;
    g.state_off = 8 * below(8);
    g.data_off = g.state_off + (uint64_t)g.slot_count * RINGQ_STATE_ENTRY + 8 * below(4);
    size_t maplen = g.data_off + (size_t)g.slot_count * g.slot_size;
    if (below(4) == 0) maplen -= 1 + below(64); /* too short for its geometry: must be refused */
    uint8_t *m = malloc(maplen ? maplen : 1);
    for (size_t i = 0; i < maplen; i++) m[i] = (uint8_t)(below(3) ? 0 : rnd());
    int ok_geom = maplen == g.data_off + (size_t)g.slot_count * g.slot_size;
    if (ok_geom) {
        for (uint32_t k = below(6); k; k--) put_record(m, maplen, &g, below(g.slot_count), below(3 * g.slot_size));
        for (uint32_t k = below(8); k; k--) { /* damage */
            m[g.data_off + below((uint32_t)(maplen - g.data_off))] ^= (uint8_t)(1 + below(255));
            uint64_t st = rnd();
            memcpy(m + g.state_off + (size_t)below(g.slot_count) * RINGQ_STATE_ENTRY, &st, 8);
        }
    }
    ringq_rec_info *out = malloc(sizeof *out * (g.slot_count + 1));
    for (int k = 0; k < 20; k++) {
        uint32_t from = below(g.slot_count + 2), to = below(g.slot_count + 2), next = 0;
        uint32_t cap = below(g.slot_count + 1);
        int n = ringq_seg_scan(m, maplen, &g, from, to, out, cap, &next);
        if (!ok_geom) {
            CHECK(n == RINGQ_EBOUNDS);
        } else if (from > to || to > g.slot_count) {
            CHECK(n == RINGQ_EBOUNDS);
        } else {
            CHECK(n >= 0 && (uint32_t)n <= cap && next >= from && next <= to);
            for (int i = 0; i < n; i++) {
                CHECK(out[i].slot >= from && out[i].slot < to && out[i].span >= 1);
                CHECK(out[i].status == 0 || out[i].status == RINGQ_ECORRUPT);
                if (out[i].status == 0) CHECK(out[i].slot + out[i].span <= to);
            }
        }
        ringq_rec_info one;
        uint32_t slot = below(g.slot_count + 2);
        int rc = ringq_rec_check(m, maplen, &g, slot, &one);
        CHECK(rc == 0 || rc == RINGQ_ECORRUPT || rc == RINGQ_EBOUNDS);
        if (rc == 0) CHECK(one.slot + one.span <= g.slot_count && one.record_len <= (g.slot_count - slot) * g.slot_size);
        uint32_t order[16];
        for (int i = 0; i < 16; i++) order[i] = below(g.slot_count + 5);
        uint64_t st = 0;
        int idx = ringq_next_ready(m, maplen, &g, order, 16, below(18), &st);
        CHECK(idx == RINGQ_EBOUNDS || (idx >= 0 && idx <= 16));
        claim_and_ack(m, maplen, &g, ok_geom, order);
    }
    /* hostile geometries, as if read from a file: all refused, nothing touched */
    ringq_geom bad = g;
    bad.slot_size = 63;
    CHECK(ringq_seg_scan(m, maplen, &bad, 0, 1, out, 1, &(uint32_t){0}) == RINGQ_EINVAL);
    bad = g;
    bad.slot_count = 0xFFFFFFFFu;
    CHECK(ringq_rec_check(m, maplen, &bad, 0, out) == RINGQ_EBOUNDS);
    bad = g;
    bad.data_off = (uint64_t)-64;
    CHECK(ringq_rec_check(m, maplen, &bad, 0, out) == RINGQ_EBOUNDS);
    bad = g;
    bad.state_off += 4;
    CHECK(ringq_rec_check(m, maplen, &bad, 0, out) == RINGQ_EALIGN);
    free(out);
    free(m);
}

/* Format 2: a state file and a record file mapped as one range; a record written with pwrite into
 * the record file is seen (and validates) through the read-only part of the range. */
static void pair_mapping(void) {
    char spath[] = "/tmp/ringq-selftest-state-XXXXXX", rpath[] = "/tmp/ringq-selftest-rec-XXXXXX";
    int sfd = mkstemp(spath), rfd = mkstemp(rpath);
    CHECK(sfd >= 0 && rfd >= 0);
    if (sfd < 0 || rfd < 0) return;
    unlink(spath);
    unlink(rpath);
    const size_t page = 4096, state_len = 2 * page, nslots = 8, slot = 128;
    CHECK(ftruncate(sfd, (off_t)state_len) == 0 && ftruncate(rfd, (off_t)(page + page)) == 0);
    uint8_t *base = NULL;
    CHECK(ringq_map_pair(sfd, state_len + 1, rfd, page, nslots * slot, 1, &base) == RINGQ_EINVAL);
    CHECK(ringq_map_pair(sfd, state_len, rfd, page + 1, nslots * slot, 1, &base) == RINGQ_EINVAL);
    CHECK(ringq_map_pair(sfd, state_len, rfd, page, nslots * slot, 1, NULL) == RINGQ_EINVAL);
    CHECK(ringq_map_pair(sfd, state_len, rfd, page, nslots * slot, 1, &base) == 0);
    size_t maplen = state_len + nslots * slot;
    ringq_geom g = {.seg_seq = 3, .state_off = page, .data_off = state_len, .slot_size = slot, .slot_count = nslots};
    uint32_t plen = 150, len = RINGQ_REC_HEADER + plen, span = 2;
    uint8_t *rec = calloc(1, len);
    uint32_t magic = RINGQ_REC_MAGIC;
    memcpy(rec, &magic, 4);
    memcpy(rec + 8, &len, 4);
    memcpy(rec + 12, &span, 4);
    memcpy(rec + 52, &plen, 4);
    CHECK(ringq_rec_pwrite(rfd, page, base, maplen, &g, 7, rec, len, RINGQ_ST_READY) == RINGQ_EBOUNDS);
    CHECK(ringq_rec_pwrite(rfd, page, base, maplen, &g, 2, rec, len, RINGQ_ST_EMPTY) == RINGQ_EINVAL);
    CHECK(ringq_rec_pwrite(-1, page, base, maplen, &g, 2, rec, len, RINGQ_ST_READY) == RINGQ_EINVAL);
    CHECK(ringq_rec_pwrite(rfd, page, base, maplen, &g, 2, rec, len, RINGQ_ST_READY) == 2);
    ringq_rec_info info;
    CHECK(ringq_rec_check(base, maplen, &g, 2, &info) == 0 && info.span == 2 && info.payload_len == plen);
    uint64_t w = 0;
    CHECK(ringq_load64(base, maplen, page + 2 * RINGQ_STATE_ENTRY, &w) == 0 && w == RINGQ_ST_READY);
    CHECK(ringq_load64(base, maplen, page + 3 * RINGQ_STATE_ENTRY, &w) == 0 && w == RINGQ_ST_CONT);
    uint8_t back[4] = {0};
    CHECK(pread(rfd, back, 4, (off_t)(page + 2 * slot)) == 4 && memcmp(back, &magic, 4) == 0);
    CHECK(ringq_msync(base, maplen, state_len + 2 * slot, len) == 0);
    free(rec);
    CHECK(ringq_unmap(base, maplen) == 0);
    CHECK(ringq_unmap(NULL, maplen) == RINGQ_EINVAL);
    close(sfd);
    close(rfd);
}

/* ---- appends ---------------------------------------------------------------------------------- */
static int append_fd = -1, append_ro_fd = -1; /* a scratch record file, read-write and read-only */
static int lock_fd = -1, lock_other_fd = -1;    /* two open descriptions of one lock file */
static unsigned long appends_written, appends_published, reserves_granted, fast_appends; /* reached */

static void *exact(size_t n) { /* a heap block of exactly n bytes (ASan sees any overrun) */
    void *p = malloc(n ? n : 1);
    if (p && n) memset(p, (int)below(256), n);
    return p;
}

/* A random geometry whose header words (tail, counts) lie in front of the state table, as in a
 * real state file; now and then one where they do not, which every append call must refuse. */
static size_t append_geom(ringq_geom *g) {
    g->slot_size = 64u * (1 + below(6));
    g->slot_count = 1 + below(40);
    g->seg_seq = 1 + (rnd() & 0xFFFF);
    g->state_off = below(8) ? 176 + 8 * below(8) : 8 * below(22);
    g->data_off = g->state_off + (uint64_t)g->slot_count * RINGQ_STATE_ENTRY + 8 * below(4);
    size_t maplen = g->data_off + (size_t)g->slot_count * g->slot_size;
    if (below(8) == 0) maplen -= 1 + below(64);
    return maplen;
}

static int ok_code(int rc) {
    return rc >= 0 || rc == RINGQ_EBOUNDS || rc == RINGQ_EALIGN || rc == RINGQ_EINVAL;
}

static void fuzz_append_once(void) {
    ringq_geom g;
    size_t maplen = append_geom(&g);
    uint8_t *m = exact(maplen);
    memset(m, 0, maplen);
    uint32_t n = 1 + below(8), first = below(n + 1);
    uint8_t codecs[8];
    uint16_t ids[8];
    uint32_t lens[8], heads[8], end = 0xFFFFFFFFu;
    size_t need = 0;
    for (uint32_t i = 0; i < n; i++) {
        codecs[i] = (uint8_t)below(6);
        ids[i] = (uint16_t)(below(3) ? 0 : below(70));
        lens[i] = below(16) ? below(3 * g.slot_size) : (uint32_t)rnd(); /* now and then absurd */
        heads[i] = 0xFFFFFFFFu;
        need += (size_t)ids[i] + lens[i];
    }
    int with_ids = (int)below(2);
    size_t data_len = below(4) ? need : below((uint32_t)(need % 4096 + 1));
    if (data_len > 1 << 20) data_len = 1 << 20;
    uint8_t *data = exact(data_len);
    size_t scratch_len = below(4) ? (size_t)g.slot_count * g.slot_size : below(4 * g.slot_size + 1);
    uint8_t *scratch = exact(scratch_len);
    size_t ctl_len = 64 + 8 * below(40);
    uint8_t *ctl = exact(ctl_len);
    size_t count_off = below(8) ? 8 * below((uint32_t)(ctl_len / 8)) : below((uint32_t)ctl_len + 16);
    ringq_rec_header t;
    memset(&t, 0, sizeof t);
    t.seq = rnd() >> 8;
    t.priority = (int32_t)rnd();
    t.kind = 1;
    uint64_t state = below(6) ? RINGQ_ST_READY | (rnd() << 24) : below(8);
    uint32_t tail = below(g.slot_count + 3);
    int publish = (int)below(2);
    int fd = below(8) ? append_fd : append_ro_fd;
    int rc = ringq_append(fd, 4096, m, maplen, &g, tail, &t, state, codecs, with_ids ? ids : NULL, lens, n, first,
                          data, data_len, scratch, scratch_len, publish, below(3) ? ctl : NULL, ctl_len, count_off,
                          heads, &end);
    CHECK(ok_code(rc) || rc == -EBADF);
    if (rc == -EBADF) CHECK(fd == append_ro_fd);
    if (rc > 0) {
        appends_written++;
        CHECK((uint32_t)rc <= n - first && end <= g.slot_count);
        uint32_t prev = tail;
        for (uint32_t i = first; i < first + (uint32_t)rc; i++) {
            CHECK(heads[i] == prev || i > first);
            CHECK(heads[i] >= prev && heads[i] < end);
            prev = heads[i] + 1;
        }
        uint32_t tail_word;
        memcpy(&tail_word, m + RINGQ_SEG_OFF_TAIL, 4);
        if (publish && first + (uint32_t)rc == n) {
            uint64_t w;
            memcpy(&w, m + g.state_off + (size_t)heads[first] * RINGQ_STATE_ENTRY, 8);
            CHECK(w == state && tail_word == end);
            appends_published++;
        } else {
            CHECK(tail_word == 0); /* nothing published */
            /* ... until the caller publishes the run */
            int pr = ringq_append_publish(m, maplen, &g, heads + first, (uint32_t)rc, end, state, t.seq);
            CHECK(pr == rc || ((state & 7u) == RINGQ_ST_EMPTY || (state & 7u) == RINGQ_ST_CONT));
        }
    } else if (rc == 0) {
        CHECK(tail > 0 && end == 0xFFFFFFFFu);
    }
    /* publish with random heads: sorted or not, in range or not */
    uint32_t k = below(9), rh[8];
    for (uint32_t i = 0; i < k; i++) rh[i] = below(g.slot_count + 2);
    if (below(2)) /* an increasing run now and then */
        for (uint32_t i = 0; i < k; i++) rh[i] = i * (1 + below(3));
    int pr = ringq_append_publish(m, maplen, &g, rh, k, below(g.slot_count + 2), state, 1);
    CHECK(ok_code(pr) && (pr < 0 || (uint32_t)pr == k));
    /* the prologue, over random words */
    uint32_t w32 = below(4) ? below(g.slot_count + 2) : (uint32_t)rnd();
    if (maplen >= 176) {
        memcpy(m + RINGQ_SEG_OFF_TAIL, &w32, 4);
        w32 = below(4) == 0;
        memcpy(m + RINGQ_SEG_OFF_RETIRED, &w32, 4);
    }
    size_t tail_seg_off = 8 * below((uint32_t)(ctl_len / 8) + 1), next_off = 8 * below((uint32_t)(ctl_len / 8) + 1);
    if (below(8) == 0) next_off += 4;
    if (tail_seg_off + 8 <= ctl_len && below(2)) memcpy(ctl + tail_seg_off, &g.seg_seq, 8);
    uint32_t rtail = 0xFFFFFFFFu;
    uint64_t first_seq = 0;
    uint64_t want = below(4) ? below(4) : rnd();
    int rr = ringq_append_reserve(m, maplen, &g, ctl, ctl_len, tail_seg_off, next_off, n, want, &rtail, &first_seq);
    CHECK(ok_code(rr) && rr <= 1);
    if (rr == 0) {
        reserves_granted++;
        uint64_t next;
        memcpy(&next, ctl + next_off, 8);
        CHECK(rtail <= g.slot_count && want <= g.slot_count - rtail && next == first_seq + n);
    }
    /* the whole append in one call, over the same random words; now and then with the lock held
     * by another open file description (contended: nothing done) */
    ringq_ctl_words cw = {.tail_seg = tail_seg_off, .next_seq = next_off, .enqueued = count_off,
                          .lock_waiters = 4 * below((uint32_t)(ctl_len / 4) + 2), .lock_wake = 4 * below((uint32_t)(ctl_len / 4) + 2)};
    int held = below(6) == 0 && flock(lock_other_fd, LOCK_EX | LOCK_NB) == 0;
    uint64_t before = 0;
    if (next_off + 8 <= ctl_len) memcpy(&before, ctl + next_off, 8);
    end = 0xFFFFFFFFu;
    int fr = ringq_append_fast(below(10) ? lock_fd : -1, ctl, ctl_len, &cw, fd, 4096, m, maplen, &g, (int64_t)(rnd() >> 24),
                               below(8) ? (int64_t)below(100000) : -1, &t, codecs, with_ids ? ids : NULL, lens, n, data,
                               data_len, scratch, scratch_len, heads, &end, (int)below(2));
    CHECK(ok_code(fr) || fr == -EBADF);
    CHECK(fr <= 0 || (uint32_t)fr == n);
    if (held) {
        CHECK(fr <= 0);
        if (fr == 0 && next_off + 8 <= ctl_len) {
            uint64_t after;
            memcpy(&after, ctl + next_off, 8);
            CHECK(after == before); /* nothing reserved */
        }
        flock(lock_other_fd, LOCK_UN);
    }
    if (fr > 0) {
        fast_appends++;
        CHECK(end <= g.slot_count && heads[0] < end);
        uint64_t w;
        memcpy(&w, m + g.state_off + (size_t)heads[0] * RINGQ_STATE_ENTRY, 8);
        CHECK((w & 7u) == RINGQ_ST_READY);
    }
    /* whatever happened, the lock is free again */
    CHECK(flock(lock_other_fd, LOCK_EX | LOCK_NB) == 0 && flock(lock_other_fd, LOCK_UN) == 0);
    free(m);
    free(data);
    free(scratch);
    free(ctl);
}

/* A batch through a real pair of files: what ringq_append writes is what ringq_rec_check reads
 * back, across the end of the segment; a write that fails publishes nothing. */
static void append_pair(void) {
    char spath[] = "/tmp/ringq-selftest-astate-XXXXXX", rpath[] = "/tmp/ringq-selftest-arec-XXXXXX";
    int sfd = mkstemp(spath), rfd = mkstemp(rpath);
    CHECK(sfd >= 0 && rfd >= 0);
    if (sfd < 0 || rfd < 0) return;
    int ro = open(rpath, O_RDONLY);
    unlink(spath);
    unlink(rpath);
    const size_t page = 4096, state_len = 2 * page, nslots = 8, slot = 128;
    CHECK(ftruncate(sfd, (off_t)state_len) == 0 && ftruncate(rfd, (off_t)(page + page)) == 0);
    uint8_t *base = NULL;
    CHECK(ringq_map_pair(sfd, state_len, rfd, page, nslots * slot, 1, &base) == 0);
    size_t maplen = state_len + nslots * slot;
    ringq_geom g = {.seg_seq = 5, .state_off = page, .data_off = state_len, .slot_size = slot, .slot_count = nslots};
    uint8_t ctl[256] = {0};
    uint64_t next = 10;
    memcpy(ctl + 64, &next, 8);
    memcpy(ctl + 72, &g.seg_seq, 8);
    uint32_t tail = 99;
    uint64_t first = 0;
    CHECK(ringq_append_reserve(base, maplen, &g, ctl, sizeof ctl, 72, 64, 5, 9, &tail, &first) == 1); /* 9 > 8 slots */
    CHECK(ringq_append_reserve(base, maplen, &g, ctl, sizeof ctl, 72, 64, 5, 8, &tail, &first) == 0);
    CHECK(tail == 0 && first == 10);
    memcpy(&next, ctl + 64, 8);
    CHECK(next == 15);
    /* five records: 10, 200, 0, 300 and 5 payload bytes (1, 3, 1, 3, 1 slots): four fit */
    uint8_t codecs[5] = {1, 2, 1, 2, 1};
    uint16_t ids[5] = {0, 3, 0, 0, 2};
    uint32_t lens[5] = {10, 200, 0, 300, 5}, heads[5], end = 0;
    uint8_t data[520];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t)(i * 7);
    uint8_t scratch[8 * 128];
    ringq_rec_header t;
    memset(&t, 0, sizeof t);
    t.seq = first;
    t.enqueued_us = 1700000000000000;
    t.available_ms = 1700000000000;
    t.priority = -2;
    t.max_attempts = 5;
    t.kind = 1;
    uint64_t ready = RINGQ_ST_READY | (7ULL << 24);
    CHECK(ringq_append(ro, page, base, maplen, &g, 0, &t, ready, codecs, ids, lens, 5, 0, data, sizeof data,
                       scratch, sizeof scratch, 1, ctl, sizeof ctl, 224, heads, &end) == -EBADF);
    uint64_t w = 1;
    CHECK(ringq_load64(base, maplen, page, &w) == 0 && w == 0); /* nothing published */
    int rc = ringq_append(rfd, page, base, maplen, &g, 0, &t, ready, codecs, ids, lens, 5, 0, data, sizeof data,
                          scratch, sizeof scratch, 1, ctl, sizeof ctl, 224, heads, &end);
    CHECK(rc == 4 && end == 8);
    CHECK(heads[0] == 0 && heads[1] == 1 && heads[2] == 4 && heads[3] == 5);
    CHECK(ringq_load64(base, maplen, page, &w) == 0 && w == 0); /* not the batch's end: unpublished */
    size_t at = 0;
    for (int i = 0; i < 4; i++) {
        ringq_rec_info info;
        CHECK(ringq_rec_check(base, maplen, &g, heads[i], &info) == 0);
        CHECK(info.seq == 10 + (uint64_t)i && info.codec == codecs[i] && info.id_len == ids[i] &&
              info.payload_len == lens[i] && info.priority == -2 && info.kind == 1);
        CHECK(memcmp(base + state_len + (size_t)heads[i] * slot + RINGQ_REC_HEADER, data + at, ids[i] + lens[i]) == 0);
        at += ids[i] + lens[i];
    }
    CHECK(ringq_append(rfd, page, base, maplen, &g, 8, &t, ready, codecs, ids, lens, 5, 4, data, sizeof data,
                       scratch, sizeof scratch, 1, ctl, sizeof ctl, 224, heads, &end) == 0); /* full */
    CHECK(ringq_append_publish(base, maplen, &g, heads, 4, 8, ready, 13) == 4);
    uint32_t tw = 0;
    CHECK(ringq_load32(base, maplen, RINGQ_SEG_OFF_TAIL, &tw) == 0 && tw == 8);
    CHECK(ringq_load64(base, maplen, page + 2 * RINGQ_STATE_ENTRY, &w) == 0 && w == RINGQ_ST_CONT);
    CHECK(ringq_load64(base, maplen, page + 4 * RINGQ_STATE_ENTRY, &w) == 0 && w == ready);
    CHECK(ringq_load64(base, maplen, RINGQ_SEG_OFF_LAST_SEQ, &w) == 0 && w == 13);
    CHECK(ringq_append_reserve(base, maplen, &g, ctl, sizeof ctl, 72, 64, 1, 0, &tail, &first) == 0 && tail == 8);
    CHECK(ringq_append_reserve(base, maplen, &g, ctl, sizeof ctl, 72, 64, 1, 1, &tail, &first) == 1); /* full */
    g.seg_seq = 6; /* no longer the tail segment named in the control page */
    CHECK(ringq_append_reserve(base, maplen, &g, ctl, sizeof ctl, 72, 64, 1, 0, &tail, &first) == 1);
    CHECK(ringq_unmap(base, maplen) == 0);
    close(sfd);
    close(rfd);
    close(ro);
}

int main(int argc, char **argv) {
    long iterations = argc > 1 ? atol(argv[1]) : 20000;
    rng_state = argc > 2 ? strtoull(argv[2], NULL, 10) * 2 + 1 : 0x9E3779B97F4A7C15ULL;
    known_answers();
    atomics();
    watch_answers();
    pair_mapping();
    append_pair();
    char apath[] = "/tmp/ringq-selftest-append-XXXXXX";
    append_fd = mkstemp(apath);
    append_ro_fd = open(apath, O_RDONLY);
    unlink(apath);
    CHECK(append_fd >= 0 && append_ro_fd >= 0);
    char lpath[] = "/tmp/ringq-selftest-lock-XXXXXX";
    lock_fd = mkstemp(lpath);
    lock_other_fd = open(lpath, O_RDWR);
    unlink(lpath);
    CHECK(lock_fd >= 0 && lock_other_fd >= 0);
    claim_known_answers();
    claim_run_known_answers();
    take_run_known_answers();
    spin_answers();
    packed_answers();
    wait_claim_answers();
    for (long i = 0; i < iterations; i++) {
        fuzz_once();
        fuzz_append_once();
    }
    printf("appends: %lu runs written, %lu published, %lu reserves granted, %lu whole appends\n",
           appends_written, appends_published, reserves_granted, fast_appends);
    printf("selftest: %lu passed, %lu failed\n", checks - failures, failures);
    return failures ? 1 : 0;
}
