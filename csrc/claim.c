/* claim.c - a lease and an ack in one call each.  See ringq.h for the contracts.
 *
 * These are the two hottest paths of a consumer.  Each replaces what used to be several calls
 * (find the next READY slot, CAS the state word, tag the owner word; load, check, CAS) with one,
 * so that the interpreter runs once per operation.  Policy stays with the caller: a slot is
 * claimed here only if the caller flagged it plain and ranked it first; anything else (a retried
 * job, a delayed one, an expiry, a limit) is reported back untouched for the caller to decide.
 */
#include "ringq.h"
#include "ringq_internal.h"

#include <errno.h>
#include <limits.h>
#include <time.h>

#define STATE_OF(w) ((uint32_t)((w) & 7u))
#define LC_OF(w) ((uint32_t)(((w) >> RINGQ_W_LC_SHIFT) & RINGQ_W_LC_MASK))
#define TIME_OF(w) ((w) >> RINGQ_W_TIME_SHIFT)
#define WHY_BITS(w) ((w) & (3ull << RINGQ_W_WHY_SHIFT))
/* A DONE word a reclaim of a cancel-requested lease wrote: never the trace of an accepted ack. */
#define RECLAIMED_CANCEL(w) \
    (((w) & RINGQ_W_CANCEL) && WHY_BITS(w) == ((uint64_t)RINGQ_END_RECLAIMED << RINGQ_W_WHY_SHIFT))

static inline uint64_t word_of(uint32_t st, uint64_t why_bits, uint32_t lc, uint64_t t) {
    if (t > RINGQ_W_TIME_MAX) t = RINGQ_W_TIME_MAX;
    return (uint64_t)st | why_bits | ((uint64_t)(lc & RINGQ_W_LC_MASK) << RINGQ_W_LC_SHIFT) |
           (t << RINGQ_W_TIME_SHIFT);
}

/* A plain first lease of the READY word *w at slot: CAS it to LEASED(lc 1, deadline_rel), reason
 * kept, then tag the owner word with owner_base and lease count 1.  1 if leased (*w then holds the
 * READY word replaced), 0 if the CAS lost (*w holds the word another process wrote). */
static inline int lease_plain(uint8_t *base, const ringq_geom *g, uint32_t slot, uint64_t *w,
                              uint64_t deadline_rel, uint64_t owner_base, uint64_t *leased) {
    _Atomic uint64_t *sw = A64(base, g->state_off + (size_t)slot * RINGQ_STATE_ENTRY);
    *leased = word_of(RINGQ_ST_LEASED, WHY_BITS(*w), 1, deadline_rel);
    if (!atomic_compare_exchange_strong(sw, w, *leased)) return 0;
    atomic_store_explicit(A64(base, g->state_off + (size_t)slot * RINGQ_STATE_ENTRY + 8),
                          owner_base | ((uint64_t)1 << RINGQ_OW_LC_SHIFT), memory_order_release);
    return 1;
}

int ringq_claim_next(uint8_t *base, size_t maplen, const ringq_geom *g, const uint32_t *order,
                     uint32_t n, uint32_t start, uint32_t expect, const uint8_t *plain,
                     uint64_t now_rel, uint64_t deadline_rel, uint64_t owner_base,
                     ringq_claim_out *out) {
    int rc = geom_check(maplen, g);
    if (rc) return rc;
    if (!order || !plain || !out) return RINGQ_EINVAL;
    out->status = RINGQ_CLAIM_NONE;
    out->index = n;
    out->slot = 0;
    out->_pad = 0;
    out->word = 0;
    out->prev = 0;
    for (uint32_t i = start; i < n; i++) {
        uint32_t slot = order[i];
        if (slot >= g->slot_count) continue;
        _Atomic uint64_t *sw = A64(base, g->state_off + (size_t)slot * RINGQ_STATE_ENTRY);
        uint64_t w = atomic_load_explicit(sw, memory_order_acquire);
        while (STATE_OF(w) == RINGQ_ST_READY) {
            out->index = i;
            out->slot = slot;
            out->word = w;
            if (slot != expect || !plain[slot] || LC_OF(w) != 0 || TIME_OF(w) > now_rel ||
                (w & RINGQ_W_CANCEL)) {
                out->status = RINGQ_CLAIM_ASK;
                return 0;
            }
            /* The bytes are validated again before the job is handed out (as every read does):
             * a record that fails goes back to the caller, which quarantines it. */
            ringq_rec_info info;
            if (check_record(base, g, slot, &info) != 0) {
                out->status = RINGQ_CLAIM_ASK;
                return 0;
            }
            uint64_t leased;
            if (lease_plain(base, g, slot, &w, deadline_rel, owner_base, &leased)) {
                out->status = RINGQ_CLAIMED;
                out->prev = w;
                out->word = leased;
                return 0;
            }
            /* w now holds the word another process wrote: READY again (rare) loops, else move on. */
        }
    }
    out->status = RINGQ_CLAIM_NONE;
    out->index = n;
    return 0;
}

/* Not after the bound.  An equal key is the same job: the bound is its own entry elsewhere in the
 * caller's heap (a job a limit held back and offers again, which is also its lane's candidate),
 * and leasing it here is what that entry would do. */
static inline int ranks_before(const ringq_run_keys *k, uint32_t slot) {
    if (!k->bounded) return 1;
    int64_t a = k->avail_ms[slot], e = k->enq_us[slot];
    if (a != k->bound_avail_ms) return a < k->bound_avail_ms;
    if (e != k->bound_enq_us) return e < k->bound_enq_us;
    return (uint32_t)(k->seq[slot] & 0xffffffffu) <= k->bound_seq32;
}

/* What the caller builds a leased job from: the LEASED word and the record's fields. */
static void report_claimed(ringq_claimed *c, const ringq_rec_info *info, uint32_t slot, uint64_t leased) {
    memset(c, 0, sizeof *c);
    c->word = leased;
    c->seq = info->seq;
    c->enqueued_us = info->enqueued_us;
    c->available_ms = info->available_ms;
    c->slot = slot;
    c->payload_len = info->payload_len;
    c->priority = info->priority;
    c->max_attempts = info->max_attempts;
    c->id_len = info->id_len;
    c->codec = info->codec;
}

int ringq_claim_run(uint8_t *base, size_t maplen, const ringq_geom *g, const uint32_t *order,
                    uint32_t n, uint32_t start, const uint8_t *plain, const ringq_run_keys *keys,
                    uint64_t now_rel, uint64_t deadline_rel, uint64_t owner_base,
                    ringq_claimed *out, uint32_t cap, uint32_t *next, uint32_t *why) {
    int rc = geom_check(maplen, g);
    if (rc) return rc;
    if (!order || !plain || !keys || !keys->avail_ms || !keys->enq_us || !keys->seq || !out ||
        !next || !why)
        return RINGQ_EINVAL;
    uint32_t got = 0;
    *why = RINGQ_RUN_END;
    *next = n;
    for (uint32_t i = start; i < n; i++) {
        uint32_t slot = order[i];
        if (slot >= g->slot_count) continue;
        _Atomic uint64_t *sw = A64(base, g->state_off + (size_t)slot * RINGQ_STATE_ENTRY);
        uint64_t w = atomic_load_explicit(sw, memory_order_acquire);
        while (STATE_OF(w) == RINGQ_ST_READY) {
            if (got == cap) {
                *why = RINGQ_RUN_FULL;
                *next = i;
                return (int)got;
            }
            if (!plain[slot] || LC_OF(w) != 0 || TIME_OF(w) > now_rel || (w & RINGQ_W_CANCEL)) {
                *why = RINGQ_RUN_ASK;
                *next = i;
                return (int)got;
            }
            if (!ranks_before(keys, slot)) {
                *why = RINGQ_RUN_BOUND;
                *next = i;
                return (int)got;
            }
            ringq_rec_info info;
            if (check_record(base, g, slot, &info) != 0) { /* the caller quarantines it */
                *why = RINGQ_RUN_ASK;
                *next = i;
                return (int)got;
            }
            uint64_t leased;
            if (lease_plain(base, g, slot, &w, deadline_rel, owner_base, &leased)) {
                report_claimed(&out[got++], &info, slot, leased);
                break;
            }
            /* w is what another process wrote: READY again (rare) loops, else move on. */
        }
    }
    return (int)got;
}

static int64_t realtime_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int ringq_ack_slot(uint8_t *base, size_t maplen, const ringq_geom *g, uint32_t slot, uint32_t token,
                   uint64_t now_rel, uint8_t *ctl, size_t ctl_len, const ringq_ctl_words *words,
                   uint64_t *word, uint64_t *finished) {
    int rc = geom_check(maplen, g);
    if (rc) return rc;
    if (!word || !finished || !words) return RINGQ_EINVAL;
    if (slot >= g->slot_count) return RINGQ_EBOUNDS;
    rc = word_check(base, maplen, RINGQ_SEG_OFF_FINISHED, 8);
    if (!rc) rc = word_check(ctl, ctl_len, words->acked, 8);
    if (rc) return rc;
    _Atomic uint64_t *sw = A64(base, g->state_off + (size_t)slot * RINGQ_STATE_ENTRY);
    uint64_t w = atomic_load_explicit(sw, memory_order_acquire);
    for (;;) {
        uint32_t st = STATE_OF(w), lc = LC_OF(w);
        if (st == RINGQ_ST_DONE && (token == 0 || (lc == token && !RECLAIMED_CANCEL(w)))) {
            *word = w;
            return 1;
        }
        if (st != RINGQ_ST_LEASED || (token != 0 && lc != token)) {
            *word = w;
            return 2;
        }
        if (w & RINGQ_W_CANCEL) {
            *word = w;
            return 3;
        }
        uint64_t done = word_of(RINGQ_ST_DONE, WHY_BITS(w), lc, now_rel);
        if (atomic_compare_exchange_strong(sw, &w, done)) {
            *word = done;
            *finished = atomic_fetch_add(A64(base, RINGQ_SEG_OFF_FINISHED), 1) + 1;
            atomic_fetch_add(A64(ctl, words->acked), 1);
            return 0;
        }
    }
}

int ringq_take_run(const ringq_seg_ref *s, const ringq_ctl_ref *c, const uint32_t *order,
                   uint32_t n, uint32_t start, const uint8_t *plain, const ringq_run_keys *keys,
                   uint64_t vt_ms, uint64_t owner_base, ringq_claimed *out, uint32_t cap,
                   uint32_t *next_why) {
    if (!s || !c || !next_why) return RINGQ_EINVAL;
    next_why[2] = 0;
    if (c->floor && (c->floor_gen_bits < 1 || c->floor_gen_bits > 63)) return RINGQ_EINVAL;
    int rc = c->floor ? word_check(c->base, c->len, c->floor, 8) : 0;
    if (rc) return rc; /* checked first: nothing is leased when the floor could not be lowered */
    int64_t now_rel = realtime_ms() - s->epoch_ms;
    uint64_t now = now_rel > 0 ? (uint64_t)now_rel : 0;
    int got = ringq_claim_run(s->base, s->maplen, s->g, order, n, start, plain, keys, now,
                              now + vt_ms, owner_base, out, cap, &next_why[0], &next_why[1]);
    if (got > 0 && c->floor) {
        int64_t until = s->epoch_ms + (int64_t)(now + vt_ms);
        (void)ringq_lower_packed64(c->base, c->len, c->floor, c->floor_gen_bits,
                                   until > 0 ? (uint64_t)until : 0); /* its arguments checked above */
    }
    if (got > 0) next_why[2] = (uint32_t)got;
    return got;
}

int ringq_ack(const ringq_seg_ref *s, const ringq_ctl_ref *c, uint32_t slot, uint32_t token,
              uint64_t seq, uint64_t *out) {
    if (!s || !c || !out) return RINGQ_EINVAL;
    int rc = c->deps ? word_check(c->base, c->len, c->deps, 8) : 0;
    if (rc) return rc;
    int64_t now_rel = realtime_ms() - s->epoch_ms;
    uint64_t now = now_rel > 0 ? (uint64_t)now_rel : 0;
    if (seq) {
        const ringq_geom *g = s->g;
        if ((rc = geom_check(s->maplen, g))) return rc;
        if (slot >= g->slot_count) return RINGQ_EBOUNDS;
        const uint8_t *p = s->base + g->data_off + (size_t)slot * g->slot_size;
        if (rd32(p) != RINGQ_REC_MAGIC || rd64(p + 16) != seq) return RINGQ_ACK_OTHER;
        uint64_t w = atomic_load_explicit(A64(s->base, g->state_off + (size_t)slot * RINGQ_STATE_ENTRY),
                                          memory_order_acquire);
        if (STATE_OF(w) == RINGQ_ST_LEASED && (token == 0 || LC_OF(w) == token) && TIME_OF(w) < now) {
            out[0] = w;
            return RINGQ_ACK_EXPIRED;
        }
    }
    rc = ringq_ack_slot(s->base, s->maplen, s->g, slot, token, now, c->base, c->len, c->words,
                        &out[0], &out[1]);
    if (rc == 0)
        out[2] = c->deps ? atomic_load_explicit(A64(c->base, c->deps), memory_order_seq_cst) : 0;
    return rc;
}

int ringq_wait_claim(uint8_t *ctl, size_t ctl_len, uint8_t *base, size_t maplen, const ringq_geom *g,
                     const ringq_wait_args *a, ringq_claim_out *out, ringq_claimed *rec) {
    int rc = geom_check(maplen, g);
    if (rc) return rc;
    if (!a || !out) return RINGQ_EINVAL;
    if ((rc = word_check(ctl, ctl_len, a->wake_off, 4)) || (rc = word_check(ctl, ctl_len, a->waiters_off, 4)) ||
        (rc = word_check(ctl, ctl_len, a->change_off, 8)) || (rc = word_check(base, maplen, RINGQ_SEG_OFF_TAIL, 4)))
        return rc;
    if (a->tail_seg_off && (rc = word_check(ctl, ctl_len, a->tail_seg_off, 8))) return rc;
    if (a->floor_off) { /* checked first: nothing is leased when the floor could not be lowered */
        if (a->floor_gen_bits < 1 || a->floor_gen_bits > 63) return RINGQ_EINVAL;
        if ((rc = word_check(ctl, ctl_len, a->floor_off, 8))) return rc;
    }
    memset(out, 0, sizeof *out);
    uint32_t seen = a->wake_seen, from = a->from_slot;
    out->index = from;
    int64_t left = a->timeout_ns, spin = a->spin_ns > 0 ? a->spin_ns : 0;
    ringq_rec_info first, info;
    uint64_t deadline = 0, w = 0, leased = 0;
    _Atomic uint64_t *sw = NULL;
    for (;;) {
        out->status = RINGQ_CLAIM_NONE;
        if (spin > 0) {
            int64_t t = spin < left ? spin : left;
            rc = ringq_spin_wait(ctl, ctl_len, a->wake_off, seen, t);
            if (rc < 0) return rc;
            left -= t;
            spin = 0;
        } else {
            rc = 1;
        }
        if (rc == 1) { /* the spin ran out (or there was none): sleep on the futex, as a registered waiter */
            if (left <= 0) return 0;
            int64_t t0 = mono_ns();
            /* Counted as a sleeper and as one that waits to claim, in one word (ringq.h). */
            atomic_fetch_add(A32(ctl, a->waiters_off), 1u + RINGQ_CLAIM_WAITER);
            rc = ringq_futex_wait(ctl, ctl_len, a->wake_off, seen, left);
            atomic_fetch_sub(A32(ctl, a->waiters_off), 1u + RINGQ_CLAIM_WAITER);
            left -= mono_ns() - t0;
            if (rc == 1) return 0;                 /* timed out */
            if (rc == -EINTR) {
                out->status = RINGQ_CLAIM_ASK;     /* a signal: let the caller look (and run handlers) */
                return 0;
            }
            if (rc < 0) return rc;
            if (atomic_load_explicit(A32(ctl, a->wake_off), memory_order_acquire) == seen) {
                out->status = RINGQ_CLAIM_ASK;     /* a spurious wake-up */
                return 0;
            }
        }
        out->status = RINGQ_CLAIM_ASK;
        if (atomic_load_explicit(A64(ctl, a->change_off), memory_order_acquire) != a->change_seen) return 0;
        uint32_t tail = atomic_load_explicit(A32(base, RINGQ_SEG_OFF_TAIL), memory_order_acquire);
        if (tail > g->slot_count) tail = g->slot_count;
        if (from >= tail) return 0;
        /* The new records from `from`: the first READY one is the candidate (those before it
         * were taken by other consumers since this process read the segment); no later one may
         * have a higher priority. */
        uint32_t s = from, n = 0;
        int found = 0;
        while (s < tail) {
            if (++n > RINGQ_WAIT_FEW) goto pass_on;
            if (check_record(base, g, s, found ? &info : &first) != 0) goto pass_on;
            const ringq_rec_info *r = found ? &info : &first;
            if (r->span > tail - s) goto pass_on;
            if (found && info.priority > first.priority) goto pass_on;
            if (!found) {
                w = atomic_load_explicit(A64(base, g->state_off + (size_t)s * RINGQ_STATE_ENTRY),
                                         memory_order_acquire);
                found = STATE_OF(w) == RINGQ_ST_READY;
                if (!found) out->index = from = s + r->span; /* taken: the wait's look starts after it */
            }
            s += r->span;
        }
        if (found) {
            if (first.kind != 1 || first.attempts_before != 0 || first.supersedes != 0 ||
                first.available_ms > first.enqueued_us / 1000)
                goto pass_on;
            int64_t now_rel = realtime_ms() - a->epoch_ms;
            if (now_rel < 0) now_rel = 0;
            deadline = (uint64_t)now_rel + a->vt_ms;
            sw = A64(base, g->state_off + (size_t)first.slot * RINGQ_STATE_ENTRY);
            w = atomic_load_explicit(sw, memory_order_acquire);
            if (STATE_OF(w) == RINGQ_ST_READY) {
                if (LC_OF(w) != 0 || TIME_OF(w) > (uint64_t)now_rel || (w & RINGQ_W_CANCEL)) goto pass_on;
                leased = word_of(RINGQ_ST_LEASED, WHY_BITS(w), 1, deadline);
                if (atomic_compare_exchange_strong(sw, &w, leased)) break;
            }
            goto pass_on; /* changed meanwhile: the caller looks, and so do the others */
        }
        /* Every new record taken, and one wake-up since `seen`: an append's (other news wakes
         * with a step of 2, Control.wake), whose job another consumer leased first (one that
         * looked without sleeping, or another sleeper when the append woke every one).  Nothing
         * else happened: sleep again, past those records, without the caller's look. */
        if (atomic_load_explicit(A32(ctl, a->wake_off), memory_order_acquire) != seen + 1u || left <= 0 ||
            !a->tail_seg_off ||
            atomic_load_explicit(A64(ctl, a->tail_seg_off), memory_order_acquire) != g->seg_seq)
            return 0; /* more news, no time left, or the append went to a newer segment */
        seen += 1u;
        from = s;
    }
    atomic_store_explicit(A64(base, g->state_off + (size_t)first.slot * RINGQ_STATE_ENTRY + 8),
                          a->owner_base | ((uint64_t)1 << RINGQ_OW_LC_SHIFT), memory_order_release);
    if (a->floor_off) {
        int64_t until = a->epoch_ms + (int64_t)deadline;
        (void)ringq_lower_packed64(ctl, ctl_len, a->floor_off, a->floor_gen_bits,
                                   until > 0 ? (uint64_t)until : 0); /* its arguments checked above */
    }
    out->status = RINGQ_CLAIMED;
    out->slot = first.slot;
    out->word = leased;
    out->prev = w;
    if (rec) report_claimed(rec, &first, first.slot, leased);
    return 0;
pass_on:
    /* New records this wait does not lease itself (a delayed or retried job, a batch, a record
     * that needs the caller's judgement, a job another consumer leased first while a later
     * record may wait): its caller looks, and so does every other sleeper.  An append wakes one
     * sleeper per record while all of them wait here (wake_consumers, csrc/append.c), and what
     * this one learns here -- a job due later, say -- the others must learn too: this caller may
     * stop waiting before it is due.  The word is not moved: a sleeper woken by this alone and
     * finding nothing new looks once and sleeps again. */
    if (atomic_load_explicit(A32(ctl, a->waiters_off), memory_order_acquire))
        ringq_futex_wake(ctl, ctl_len, a->wake_off, INT_MAX);
    return 0;
}
