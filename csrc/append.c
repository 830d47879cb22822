/* append.c - the write path of an enqueue: a batch of records built, checksummed and laid out in
 * the caller's scratch buffer, written to the segment's record file with one pwrite(2), then
 * published in order; and the sync that makes it durable once the writer lock is released
 * (ringq_append_sync).  See ringq.h ("appends") for the contract.
 *
 * Why one call per batch: per record, the Python side used to pack a header, copy id and payload
 * into a buffer of its own, and cross into C for a pwrite and a release-store.  Here a batch costs
 * one crossing and one system call; the per-record work is a header, a CRC32C and a copy.
 *
 * Order of effects (the commit protocol of docs/design.md): every byte of the run is in the record
 * file (page cache) before the first state word is stored; state words are release-stored in slot
 * order; the segment's tail moves last.  A reader that acquire-loads a published state word sees
 * the record's bytes; one that reads the tail sees every state word below it.
 */
#define _GNU_SOURCE
#include "ringq.h"
#include "ringq_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

_Static_assert(RINGQ_SEG_OFF_TAIL % 4 == 0 && RINGQ_SEG_OFF_NRECORDS % 8 == 0 &&
               RINGQ_SEG_OFF_LAST_SEQ % 8 == 0, "segment header words are naturally aligned");
#define SEG_WORDS_END (RINGQ_SEG_OFF_LAST_SEQ + 8u)

/* The header words an append publishes lie in the state file's header page, before the state
 * table: refuse a geometry (or a mapping) where they would not. */
static int words_check(const uint8_t *base, size_t maplen, const ringq_geom *g) {
    if (g->state_off < SEG_WORDS_END) return RINGQ_EBOUNDS;
    int rc = word_check(base, maplen, RINGQ_SEG_OFF_TAIL, 4);
    if (!rc) rc = word_check(base, maplen, RINGQ_SEG_OFF_NRECORDS, 8);
    if (!rc) rc = word_check(base, maplen, RINGQ_SEG_OFF_LAST_SEQ, 8);
    if (!rc) rc = word_check(base, maplen, g->state_off, 8);
    return rc;
}

int ringq_append_reserve(uint8_t *base, size_t maplen, const ringq_geom *g, uint8_t *ctl, size_t ctl_len,
                         size_t tail_seg_off, size_t next_seq_off, uint32_t n, uint64_t slots,
                         uint32_t *tail, uint64_t *first_seq) {
    int rc = geom_check(maplen, g);
    if (rc) return rc;
    if (!tail || !first_seq) return RINGQ_EINVAL;
    rc = words_check(base, maplen, g);
    if (!rc) rc = word_check(base, maplen, RINGQ_SEG_OFF_RETIRED, 4);
    if (!rc) rc = word_check(ctl, ctl_len, tail_seg_off, 8);
    if (!rc) rc = word_check(ctl, ctl_len, next_seq_off, 8);
    if (rc) return rc;
    if (atomic_load_explicit(A64(ctl, tail_seg_off), memory_order_acquire) != g->seg_seq) return 1;
    if (atomic_load_explicit(A32(base, RINGQ_SEG_OFF_RETIRED), memory_order_acquire)) return 1;
    uint32_t t = atomic_load_explicit(A32(base, RINGQ_SEG_OFF_TAIL), memory_order_acquire);
    if (t > g->slot_count || slots > (uint64_t)(g->slot_count - t)) return 1;
    if (t < g->slot_count &&
        (atomic_load_explicit(A64(base, g->state_off + (size_t)t * RINGQ_STATE_ENTRY), memory_order_acquire) &
         7u) != RINGQ_ST_EMPTY)
        return 1;
    uint64_t next = atomic_load_explicit(A64(ctl, next_seq_off), memory_order_acquire);
    uint64_t last = atomic_load_explicit(A64(base, RINGQ_SEG_OFF_LAST_SEQ), memory_order_acquire);
    uint64_t first = next > last + 1 ? next : last + 1;
    atomic_store_explicit(A64(ctl, next_seq_off), first + n, memory_order_release);
    *tail = t;
    *first_seq = first;
    return 0;
}

/* Stores only; the caller has checked heads, end and the words. */
static void publish(uint8_t *base, const ringq_geom *g, const uint32_t *heads, uint32_t n, uint32_t end,
                    uint64_t state, uint64_t last_seq) {
    for (uint32_t i = 0; i < n; i++) {
        uint32_t head = heads[i], stop = i + 1 < n ? heads[i + 1] : end;
        publish_record(base, g, head, stop - head, state);
    }
    atomic_fetch_add_explicit(A64(base, RINGQ_SEG_OFF_NRECORDS), (uint64_t)n, memory_order_seq_cst);
    atomic_store_explicit(A64(base, RINGQ_SEG_OFF_LAST_SEQ), last_seq, memory_order_release);
    atomic_store_explicit(A32(base, RINGQ_SEG_OFF_TAIL), end, memory_order_release);
}

int ringq_append_publish(uint8_t *base, size_t maplen, const ringq_geom *g, const uint32_t *heads,
                         uint32_t n, uint32_t end, uint64_t state, uint64_t last_seq) {
    int rc = geom_check(maplen, g);
    if (rc) return rc;
    if (!heads || n == 0 || !publishable(state)) return RINGQ_EINVAL;
    rc = words_check(base, maplen, g);
    if (rc) return rc;
    if (end > g->slot_count) return RINGQ_EBOUNDS;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t stop = i + 1 < n ? heads[i + 1] : end;
        if (heads[i] >= stop) return heads[i] >= end ? RINGQ_EBOUNDS : RINGQ_EINVAL;
    }
    publish(base, g, heads, n, end, state, last_seq);
    return (int)n;
}

/* An append's wake-up for `n` new records: add 1 to the consumers' wake word (Control.wake's
 * other news adds 2), then, if any consumer is registered asleep, wake one sleeper per record when
 * every sleeper waits in ringq_wait_claim, which leases a new job itself or hands the look to its
 * caller (and then wakes every sleeper, if what it found needs them all), and every sleeper
 * otherwise: one waiting for the word alone may lease nothing, and the job must not wait for
 * another sleeper's timeout.  One load of the waiters word tells both counts (RINGQ_CLAIM_WAITER);
 * counts left wrong -- by a sleeper killed while registered, or a control page rebuilt under
 * sleepers -- never make them agree where they should not.  The caller checked the words. */
static void wake_consumers(uint8_t *ctl, size_t ctl_len, const ringq_ctl_words *w, uint32_t n) {
    atomic_fetch_add_explicit(A32(ctl, w->wake), 1u, memory_order_seq_cst);
    uint32_t v = atomic_load_explicit(A32(ctl, w->waiters), memory_order_seq_cst);
    if (!v) return;
    int k = INT_MAX;
    if ((v & (RINGQ_CLAIM_WAITER - 1u)) == v / RINGQ_CLAIM_WAITER && n < (uint32_t)INT_MAX)
        k = n ? (int)n : 1;
    ringq_futex_wake(ctl, ctl_len, w->wake, k);
}

static int pwrite_all(int fd, const uint8_t *buf, size_t len, uint64_t off, size_t *done) {
    *done = 0;
    while (*done < len) {
        ssize_t w = pwrite(fd, buf + *done, len - *done, (off_t)(off + *done));
        if (w < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        if (w == 0) return -EIO;
        *done += (size_t)w;
    }
    return 0;
}

int ringq_append(int fd, uint64_t data_file_off, uint8_t *base, size_t maplen, const ringq_geom *g,
                 uint32_t tail, const ringq_rec_header *tmpl, uint64_t state,
                 const uint8_t *codecs, const uint16_t *id_lens, const uint32_t *payload_lens,
                 uint32_t n, uint32_t first, const uint8_t *data, size_t data_len,
                 uint8_t *scratch, size_t scratch_len, int publish_run, uint8_t *ctl, size_t ctl_len,
                 size_t count_off, uint32_t *heads, uint32_t *end) {
    int rc = geom_check(maplen, g);
    if (rc) return rc;
    if (fd < 0 || !tmpl || !codecs || !payload_lens || !heads || !end || !scratch || (!data && data_len))
        return RINGQ_EINVAL;
    if (first >= n || !publishable(state)) return RINGQ_EINVAL;
    rc = words_check(base, maplen, g);
    if (!rc && ctl) rc = word_check(ctl, ctl_len, count_off, 8);
    if (rc) return rc;
    if (tail > g->slot_count) return RINGQ_EBOUNDS;

    /* Where record `first`'s bytes start in data: the lengths before it, each checked. */
    uint64_t at = 0;
    for (uint32_t i = 0; i < first; i++) {
        at += (uint64_t)(id_lens ? id_lens[i] : 0) + payload_lens[i];
        if (at > data_len) return RINGQ_EBOUNDS;
    }
    const uint64_t slot_size = g->slot_size;
    uint32_t slot = tail, count = 0;
    size_t used = 0;
    for (uint32_t i = first; i < n; i++) {
        uint32_t id_len = id_lens ? id_lens[i] : 0, plen = payload_lens[i];
        uint64_t len = (uint64_t)RINGQ_REC_HEADER + id_len + plen;
        if (len > 0xFFFFFFFFu) return RINGQ_EINVAL;
        uint64_t span = (len + slot_size - 1) / slot_size;
        if (span > g->slot_count) return RINGQ_EBOUNDS;
        if ((uint64_t)id_len + plen > data_len - at) return RINGQ_EBOUNDS;
        if (span > (uint64_t)(g->slot_count - slot)) break; /* the segment is full: rotate */
        size_t bytes = (size_t)(span * slot_size);
        if (bytes > scratch_len - used) {
            if (count == 0) return RINGQ_EINVAL;
            break; /* the rest goes in the next call */
        }
        uint8_t *rec = scratch + used;
        ringq_rec_header h = *tmpl;
        h.magic = RINGQ_REC_MAGIC;
        h.crc = 0;
        h.record_len = (uint32_t)len;
        h.span = (uint32_t)span;
        h.seq = tmpl->seq + i;
        h.id_len = (uint16_t)id_len;
        h.codec = codecs[i];
        h.payload_len = plen;
        memcpy(rec, &h, RINGQ_REC_HEADER);
        memcpy(rec + RINGQ_REC_HEADER, data + at, (size_t)id_len + plen);
        memset(rec + len, 0, bytes - (size_t)len);
        uint32_t crc = record_crc(g, slot, rec, (uint32_t)len);
        memcpy(rec + 4, &crc, 4);
        heads[i] = slot;
        slot += (uint32_t)span;
        used += bytes;
        at += (uint64_t)id_len + plen;
        count++;
    }
    if (count == 0) {
        if (tail == 0) return RINGQ_EBOUNDS; /* unreachable: a record that never fits returned above */
        return 0;
    }
    uint64_t off = data_file_off + (uint64_t)tail * slot_size;
    size_t done = 0;
    rc = pwrite_all(fd, scratch, used, off, &done);
    if (rc) {
        if (done) {
            /* Recovery adopts intact records found beyond a tail: unmake the ones this failed run
             * left, so a failed batch never comes back in part. */
            size_t zdone;
            memset(scratch, 0, done);
            (void)pwrite_all(fd, scratch, done, off, &zdone);
        }
        return rc;
    }
    *end = slot;
    if (publish_run && first + count == n) {
        publish(base, g, heads + first, count, slot, state, tmpl->seq + n - 1);
        if (ctl) atomic_fetch_add_explicit(A64(ctl, count_off), (uint64_t)n, memory_order_relaxed);
    }
    return (int)count;
}

int ringq_append_fast(int lock_fd, uint8_t *ctl, size_t ctl_len, const ringq_ctl_words *w, int fd,
                      uint64_t data_file_off, uint8_t *base, size_t maplen, const ringq_geom *g,
                      int64_t epoch_ms, int64_t delay_ms, ringq_rec_header *tmpl, const uint8_t *codecs,
                      const uint16_t *id_lens, const uint32_t *payload_lens, uint32_t n, const uint8_t *data,
                      size_t data_len, uint8_t *scratch, size_t scratch_len, uint32_t *heads, uint32_t *end,
                      int writeback) {
    int rc = geom_check(maplen, g);
    if (rc) return rc;
    if (lock_fd < 0 || fd < 0 || !w || !tmpl || !codecs || !payload_lens || !heads || !end || !scratch ||
        n == 0 || delay_ms < 0)
        return RINGQ_EINVAL;
    rc = word_check(ctl, ctl_len, w->lock_waiters, 4);
    if (!rc) rc = word_check(ctl, ctl_len, w->lock_wake, 4);
    if (!rc && w->wake) rc = word_check(ctl, ctl_len, w->wake, 4);
    if (!rc && w->wake) rc = word_check(ctl, ctl_len, w->waiters, 4);
    if (rc) return rc;
    /* The slots the batch takes: it must fit the scratch whole (else the general way). */
    uint64_t need = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t len = (uint64_t)RINGQ_REC_HEADER + (id_lens ? id_lens[i] : 0) + payload_lens[i];
        if (len > 0xFFFFFFFFu) return RINGQ_EINVAL;
        need += (len + g->slot_size - 1) / g->slot_size;
    }
    if (need > scratch_len / g->slot_size) return 0;
    if (flock(lock_fd, LOCK_EX | LOCK_NB) != 0) return 0;
    uint32_t tail = 0;
    uint64_t first = 0;
    rc = ringq_append_reserve(base, maplen, g, ctl, ctl_len, w->tail_seg, w->next_seq, n, need, &tail, &first);
    if (rc == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        int64_t now_us = (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
        int64_t avail = now_us / 1000 + delay_ms;
        int64_t rel = avail - epoch_ms;
        if (rel < 0) rel = 0;
        if ((uint64_t)rel > RINGQ_W_TIME_MAX) rel = (int64_t)RINGQ_W_TIME_MAX;
        tmpl->seq = first;
        tmpl->enqueued_us = now_us;
        tmpl->available_ms = avail;
        rc = ringq_append(fd, data_file_off, base, maplen, g, tail, tmpl,
                          RINGQ_ST_READY | ((uint64_t)rel << RINGQ_W_TIME_SHIFT), codecs, id_lens, payload_lens,
                          n, 0, data, data_len, scratch, scratch_len, 1, ctl, ctl_len, w->enqueued, heads, end);
        /* The reserve checked the batch fits and the scratch holds it: all of it is written. */
        if (rc >= 0 && (uint32_t)rc != n) rc = RINGQ_EINVAL;
        /* Published: sleepers hear of it now, not after the unlock (they need no writer lock). */
        if (rc > 0 && w->wake) wake_consumers(ctl, ctl_len, w, (uint32_t)rc);
    } else if (rc == 1) {
        rc = 0;
    }
    flock(lock_fd, LOCK_UN);
    if (atomic_load_explicit(A32(ctl, w->lock_waiters), memory_order_acquire)) {
        /* After the unlock: a woken writer's retry succeeds. */
        atomic_fetch_add_explicit(A32(ctl, w->lock_wake), 1u, memory_order_seq_cst);
        ringq_futex_wake(ctl, ctl_len, w->lock_wake, 1);
    }
    /* A hint: its error is the sync's to report. */
    if (rc > 0 && writeback) (void)ringq_append_writeback(fd, data_file_off, g, heads[0], *end);
    return rc;
}

int ringq_append_writeback(int fd, uint64_t data_file_off, const ringq_geom *g, uint32_t lo, uint32_t hi) {
    if (fd < 0 || !g || lo > hi || hi > g->slot_count || g->slot_size == 0) return RINGQ_EINVAL;
    if (hi == lo) return 0;
    uint64_t off = data_file_off + (uint64_t)lo * g->slot_size;
    uint64_t len = (uint64_t)(hi - lo) * g->slot_size;
    if (off > (uint64_t)INT64_MAX || len > (uint64_t)INT64_MAX - off) return RINGQ_EINVAL;
#ifdef SYNC_FILE_RANGE_WRITE
    if (sync_file_range(fd, (off64_t)off, (off64_t)len, SYNC_FILE_RANGE_WRITE) != 0) return -errno;
    return 0;
#else
    return -ENOSYS;
#endif
}

int ringq_append_sync(uint8_t *base, size_t maplen, const ringq_geom *g, int fd, uint32_t lo, uint32_t hi,
                      uint8_t *ctl, size_t ctl_len, size_t sync_count_off, const ringq_ctl_words *w) {
    int rc = geom_check(maplen, g);
    if (rc) return rc;
    if (lo > hi || hi > g->slot_count || (ctl && !w)) return RINGQ_EINVAL;
    if (ctl) {
        rc = word_check(ctl, ctl_len, sync_count_off, 8);
        if (!rc && w->wake) rc = word_check(ctl, ctl_len, w->wake, 4);
        if (!rc && w->wake) rc = word_check(ctl, ctl_len, w->waiters, 4);
        if (rc) return rc;
    }
    if (hi > lo) {
        if (fd >= 0) {
            if (fdatasync(fd) != 0) return -errno;
        } else {
            /* geom_check put every slot of the table inside the mapping */
            rc = ringq_msync(base, maplen, (size_t)(g->data_off + (uint64_t)lo * g->slot_size),
                             (size_t)((uint64_t)(hi - lo) * g->slot_size));
            if (rc) return rc;
        }
    }
    if (!ctl) return 0;
    atomic_fetch_add_explicit(A64(ctl, sync_count_off), 1u, memory_order_relaxed);
    if (w->wake) wake_consumers(ctl, ctl_len, w, hi - lo); /* at least one per record */
    return 0;
}
