/* ringq_threads.c - the C helper's thread-shared paths, several threads at once, checked as a
 * whole history.  Built and run by tests/test_native_sanitized.py under ThreadSanitizer and under
 * AddressSanitizer + UndefinedBehaviorSanitizer:
 *   gcc -std=gnu11 -g -O1 -fsanitize=thread -Icsrc tests/native/ringq_threads.c csrc/ *.c -lpthread
 *   ./threads [jobs] [seed] [shared|append]
 *
 * One segment mapping and one control page in memory, shared by the threads of this process as a
 * queue's mappings are: a producer publishes records (ringq_rec_write, then a release-store of
 * the tail and a bump of the wake word with FUTEX_WAKE, as an append does); CONSUMERS threads lease
 * them with ringq_wait_claim (asleep on the futex, leasing the job the wake announced),
 * ringq_claim_next (the one-call lease of a lane's first job), ringq_claim_run and ringq_take_run
 * (a run of them in one call, the second through a segment handle; their leases are counted with
 * claim_next's) and, for jobs returned to READY, a
 * plain CAS (the Python policy path); a reaper thread returns some leases to READY (as an expired
 * lease is), and consumers ack with ringq_ack under their fencing token.  Each thread passes
 * its own argument and result structs, as ringq/local/leases.py does.
 *
 * The history: every (slot, lease count) is claimed by at most one thread, every successful ack
 * names the lease count of a claim that thread made and is the only ack of its slot, and at the
 * end every slot is DONE.  TSan reports any data race in the helper; the checks report any lease
 * handed out twice.  Prints "threads: N leases (W by the wait, C by claim_next, P by CAS), M acks,
 * 0 failed" and exits 0 on success.  With "shared" the consumers pass one result struct to the
 * wait between them (the fault the checks exist for): the run must fail.  With "append" the
 * segment is a file mapped MAP_SHARED and two producers append with ringq_append_fast, the
 * uncontended enqueue's one call (writer lock, pwrite, publish, wake), as a queue does, each
 * through its own descriptor of the lock file; it also prints "append: N lock waits" (how
 * often a producer found the lock taken and waited for its release) and checks that no writer
 * is left registered as waiting; its appends wake one sleeper per job, as a queue's do while
 * every sleeper waits in the wait's claim (ringq.h, RINGQ_CLAIM_WAITER), and no consumer may be
 * left registered asleep at the end.
 */
#include "ringq.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define CONSUMERS 4
#define SLOT_SIZE 128u
#define MAX_LC 64u
#define WAKE_OFF 88u
#define WAITERS_OFF 92u
#define CHANGE_OFF 96u
#define ACKED_OFF 232u
#define DEPS_OFF 256u
#define FLOOR_OFF 248u

static uint32_t jobs = 4000;
static ringq_geom g;
static uint8_t *seg, *ctl;
static size_t maplen;
static const size_t ctl_len = 4096;
static _Atomic uint32_t *claims;  /* [slot * MAX_LC + lc]: threads that claimed that lease */
static _Atomic uint32_t *acks;    /* [slot]: accepted acks */
static _Atomic uint32_t done_count, producer_done;
static _Atomic unsigned long leases, acked, failures, by_wait, by_claim, by_cas, by_handle;
static int shared_out;
static ringq_claim_out common_out;

#define FAIL(...)                                   \
    do {                                            \
        atomic_fetch_add(&failures, 1);             \
        fprintf(stderr, __VA_ARGS__);               \
        fputc('\n', stderr);                        \
    } while (0)

static uint64_t now_rel(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* The realtime clock's reading at now_rel() == 0, ms: the segment epoch ringq_ack is given. */
static int64_t epoch_ms;

static void set_epoch(void) {
    struct timespec rt;
    clock_gettime(CLOCK_REALTIME, &rt);
    epoch_ms = (int64_t)rt.tv_sec * 1000 + rt.tv_nsec / 1000000 - (int64_t)now_rel();
}

static uint64_t word_at(uint32_t slot) {
    uint64_t w = 0;
    ringq_load64(seg, maplen, g.state_off + (size_t)slot * RINGQ_STATE_ENTRY, &w);
    return w;
}

static uint32_t lc_of(uint64_t w) { return (uint32_t)((w >> RINGQ_W_LC_SHIFT) & RINGQ_W_LC_MASK); }

static uint32_t tail_now(void) {
    uint32_t t = 0;
    ringq_load32(seg, maplen, RINGQ_SEG_OFF_TAIL, &t);
    return t;
}

/* "append" mode: the segment is a file mapped MAP_SHARED and two producer threads append the
 * jobs with ringq_append_fast (flock on the lock file, pwrite into the file, publish, wake,
 * unlock), the one-call append of an uncontended enqueue, instead of writing records through the
 * mapping.  Each producer opens the lock file itself, as each process does, so their flocks
 * exclude each other; one that finds the lock taken waits as ringq/engine/lock.py does
 * (registered in lock_waiters before it retries, asleep on lock_wake), and the holder's release
 * wakes it. */
static int append_mode, seg_fd = -1;
static char lock_path[] = "/tmp/ringq-threads-lock.XXXXXX";
static _Atomic uint32_t next_job, lock_waits;
#define PRODUCERS_APPEND 2
#define TAIL_SEG_OFF 72u
#define NEXT_SEQ_OFF 64u
#define ENQUEUED_OFF 224u
#define LOCK_WAKE_OFF 212u
#define LOCK_WAITERS_OFF 216u

static void append_job(int lock_fd, uint32_t job) {
    static _Thread_local uint8_t scratch[4 * SLOT_SIZE];
    ringq_ctl_words w = {0};
    w.tail_seg = TAIL_SEG_OFF;
    w.next_seq = NEXT_SEQ_OFF;
    w.enqueued = ENQUEUED_OFF;
    w.acked = ACKED_OFF;
    w.lock_waiters = LOCK_WAITERS_OFF;
    w.lock_wake = LOCK_WAKE_OFF;
    w.wake = WAKE_OFF;
    w.waiters = WAITERS_OFF;
    ringq_rec_header tmpl;
    memset(&tmpl, 0, sizeof tmpl);
    tmpl.max_attempts = 60;
    tmpl.kind = 1;
    uint8_t codec = 1, data[8] = {0};
    memcpy(data, &job, 4);
    uint32_t len = sizeof data, head = 0, end = 0;
    for (int registered = 0;;) {
        uint32_t seen = 0;
        if (registered) ringq_load32(ctl, ctl_len, LOCK_WAKE_OFF, &seen);
        int rc = ringq_append_fast(lock_fd, ctl, ctl_len, &w, seg_fd, g.data_off, seg, maplen, &g, epoch_ms, 0,
                                   &tmpl, &codec, NULL, &len, 1, data, sizeof data, scratch, sizeof scratch,
                                   &head, &end, 0);
        if (rc == 1 || rc < 0) {
            if (registered) ringq_fetch_add32(ctl, ctl_len, LOCK_WAITERS_OFF, (uint32_t)-1, NULL);
            if (rc < 0) FAIL("append_fast of job %u: rc %d", job, rc);
            if (rc < 0) return;
            break;
        }
        if (!registered) { /* the lock is taken: register, then retry before sleeping */
            ringq_fetch_add32(ctl, ctl_len, LOCK_WAITERS_OFF, 1, NULL);
            registered = 1;
            atomic_fetch_add(&lock_waits, 1);
            continue;
        }
        ringq_futex_wait(ctl, ctl_len, LOCK_WAKE_OFF, seen, 1000000);
    }
    if (end != head + 1 || tmpl.seq != (uint64_t)head + 1)
        FAIL("append_fast put a job at slot %u (end %u) with seq %llu", head, end, (unsigned long long)tmpl.seq);
}

static void *append_producer(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    int lock_fd = open(lock_path, O_RDWR | O_CLOEXEC);
    if (lock_fd < 0) {
        FAIL("open the lock file");
        return NULL;
    }
    for (;;) {
        uint32_t job = atomic_fetch_add(&next_job, 1);
        if (job >= jobs) break;
        append_job(lock_fd, job);
        seed = seed * 1103515245u + 12345u;
        if ((seed >> 16) % 8 != 0) usleep(50 + (seed >> 8) % 200);
    }
    close(lock_fd);
    return NULL;
}

static void *producer(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    uint8_t rec[RINGQ_REC_HEADER + 8];
    for (uint32_t slot = 0; slot < jobs; slot++) {
        memset(rec, 0, sizeof rec);
        uint32_t magic = RINGQ_REC_MAGIC, len = sizeof rec, span = 1, plen = 8;
        int64_t enq_us = 1000000, avail_ms = 0;
        memcpy(rec, &magic, 4);
        memcpy(rec + 8, &len, 4);
        memcpy(rec + 12, &span, 4);
        uint64_t job_seq = (uint64_t)slot + 1; /* the job's seq, which half the acks name */
        memcpy(rec + 16, &job_seq, 8);
        memcpy(rec + 24, &enq_us, 8);
        memcpy(rec + 32, &avail_ms, 8);
        rec[51] = 1; /* a plain job */
        memcpy(rec + 52, &plen, 4);
        memcpy(rec + 64, &slot, 4);
        if (ringq_rec_write(seg, maplen, &g, slot, rec, len, RINGQ_ST_READY) != 1) FAIL("rec_write %u", slot);
        ringq_store32(seg, maplen, RINGQ_SEG_OFF_TAIL, slot + 1);
        ringq_fetch_add32(ctl, ctl_len, WAKE_OFF, 1, NULL);
        uint32_t waiters = 0;
        ringq_load32(ctl, ctl_len, WAITERS_OFF, &waiters);
        if (waiters) ringq_futex_wake(ctl, ctl_len, WAKE_OFF, 0x7fffffff);
        seed = seed * 1103515245u + 12345u;
        /* mostly one job at a time, so that consumers wait in ringq_wait_claim together */
        if ((seed >> 16) % 8 != 0) usleep(50 + (seed >> 8) % 200);
    }
    atomic_store(&producer_done, 1);
    ringq_fetch_add32(ctl, ctl_len, WAKE_OFF, 1, NULL);
    ringq_futex_wake(ctl, ctl_len, WAKE_OFF, 0x7fffffff);
    return NULL;
}

/* A lease this thread won: record it (a second claimer of one lease is the fault we look for). */
static void won(uint32_t me, uint32_t slot, uint64_t word, uint32_t *held_lc) {
    uint32_t lc = lc_of(word);
    if ((word & 7) != RINGQ_ST_LEASED || lc == 0 || lc >= MAX_LC) {
        FAIL("thread %u: claimed slot %u with word %llx", me, slot, (unsigned long long)word);
        return;
    }
    if (atomic_fetch_add(&claims[(size_t)slot * MAX_LC + lc], 1) != 0)
        FAIL("slot %u lease %u handed to two threads", slot, lc);
    atomic_fetch_add(&leases, 1);
    *held_lc = lc;
}

static void settle(uint32_t me, uint32_t slot, uint32_t lc, unsigned *seed) {
    *seed = *seed * 1103515245u + 12345u;
    if ((*seed >> 16) % 7 == 0) return; /* left to the reaper, as a lease that expires */
    /* Through the handles the Python side passes (ringq_ack reads the clock itself: the handle's
     * epoch puts its time on now_rel()'s base). */
    static const ringq_ctl_words words = {.acked = ACKED_OFF};
    ringq_seg_ref sref = {.base = seg, .maplen = maplen, .g = &g, .epoch_ms = epoch_ms};
    ringq_ctl_ref cref = {.base = ctl, .len = ctl_len, .words = &words, .deps = DEPS_OFF};
    uint64_t out[3] = {0, 0, 0};
    /* Half name the job's seq, as the Python side's first try does (checked against the record). */
    uint64_t seq = (*seed >> 20) & 1 ? (uint64_t)slot + 1 : 0;
    int rc = ringq_ack(&sref, &cref, slot, lc, seq, out);
    if (rc == 0) {
        if (atomic_fetch_add(&acks[slot], 1) != 0) FAIL("slot %u acked twice (thread %u, lease %u)", slot, me, lc);
        atomic_fetch_add(&acked, 1);
        atomic_fetch_add(&done_count, 1);
    } else if (rc != 2) {
        FAIL("thread %u: ack of slot %u lease %u returned %d", me, slot, lc, rc);
    }
}

static void *consumer(void *arg) {
    uint32_t me = (uint32_t)(uintptr_t)arg;
    unsigned seed = 7919u * (me + 1);
    uint32_t *order = malloc(sizeof(uint32_t) * jobs);
    uint8_t *plain = malloc(g.slot_count);
    for (uint32_t i = 0; i < jobs; i++) order[i] = i;
    memset(plain, 1, g.slot_count);
    ringq_wait_args a = {.wake_off = WAKE_OFF, .waiters_off = WAITERS_OFF, .change_off = CHANGE_OFF,
                         .timeout_ns = 20000000, .vt_ms = 1000000, .owner_base = me + 1,
                         .floor_off = FLOOR_OFF, .floor_gen_bits = 20, .tail_seg_off = TAIL_SEG_OFF};
    ringq_claim_out co;
    ringq_claimed rec; /* what the wait reports of a job it leased: this thread's own */
    uint32_t cursor = 0;
    uint64_t seen_change = 0;
    int64_t *avail = calloc(g.slot_count, sizeof *avail), *enq = calloc(g.slot_count, sizeof *enq);
    uint64_t *seqs = calloc(g.slot_count, sizeof *seqs);
    ringq_run_keys keys = {.avail_ms = avail, .enq_us = enq, .seq = seqs, .bounded = 0};
    ringq_claimed run[8];
    while (atomic_load(&done_count) < jobs) {
        uint32_t wake = 0, lc = 0;
        ringq_load32(ctl, ctl_len, WAKE_OFF, &wake);
        uint32_t tail = tail_now();
        /* the one-call lease of the first READY job from the cursor, or of a run of them */
        while (cursor < tail) {
            /* (not in the shared-results mode: that check needs the threads waiting together) */
            if (!shared_out && (seed >> 4) % 2 == 0) {
                uint32_t next = 0, why = 0, nw[3] = {0, 0, 0};
                uint32_t cap = 1 + (seed >> 6) % 8;
                int got, through_handle = (seed >> 9) % 2;
                if (!through_handle) {
                    got = ringq_claim_run(seg, maplen, &g, order, tail, cursor, plain, &keys, now_rel(),
                                          now_rel() + 1000000, me + 1, run, cap, &next, &why);
                } else { /* through the segment's handle, at the clock's time, as the Python side */
                    static const ringq_ctl_words words = {.acked = ACKED_OFF};
                    ringq_seg_ref sref = {.base = seg, .maplen = maplen, .g = &g, .epoch_ms = epoch_ms};
                    ringq_ctl_ref cref = {.base = ctl, .len = ctl_len, .words = &words, .floor = FLOOR_OFF,
                                          .floor_gen_bits = 20};
                    got = ringq_take_run(&sref, &cref, order, tail, cursor, plain, &keys, 1000000, me + 1, run,
                                         cap, nw);
                    next = nw[0];
                    why = nw[1];
                    if (nw[2] != (uint32_t)(got > 0 ? got : 0)) FAIL("take_run's count of jobs leased is not its answer");
                }
                if (got < 0) {
                    FAIL("claim_run failed");
                    break;
                }
                for (int i = 0; i < got; i++) {
                    won(me, run[i].slot, run[i].word, &lc);
                    atomic_fetch_add(&by_claim, 1);
                    if (through_handle) atomic_fetch_add(&by_handle, 1);
                    settle(me, run[i].slot, lc, &seed);
                }
                seed = seed * 1103515245u + 12345u;
                if (why == RINGQ_RUN_END) {
                    cursor = tail;
                    break;
                }
                cursor = next;
                if (why != RINGQ_RUN_ASK) continue;
                /* READY but not plain-claimable here (leased before): the general path below */
            }
            if (ringq_claim_next(seg, maplen, &g, order, tail, cursor, order[cursor], plain, now_rel(),
                                 now_rel() + 1000000, me + 1, &co) != 0) {
                FAIL("claim_next failed");
                break;
            }
            if (co.status == RINGQ_CLAIMED) {
                won(me, co.slot, co.word, &lc);
                atomic_fetch_add(&by_claim, 1);
                cursor = co.index + 1;
                settle(me, co.slot, lc, &seed);
                continue;
            }
            if (co.status == RINGQ_CLAIM_NONE) {
                cursor = tail;
                break;
            }
            if (co.index != cursor) { /* the first READY job is further on: rank it */
                cursor = co.index;
                continue;
            }
            /* READY but not for the one-call lease (leased before and returned by the reaper, or
             * not due yet by the consumers' clock): the policy path's plain CAS, with a deadline of
             * its own, as transitions.leased gives one */
            uint64_t w = co.word,
                     next = (w & ((1ull << RINGQ_W_LC_SHIFT) - 1) & ~7ull) | RINGQ_ST_LEASED |
                            ((uint64_t)(lc_of(w) + 1) << RINGQ_W_LC_SHIFT) |
                            ((now_rel() + 1000000) << RINGQ_W_TIME_SHIFT);
            uint64_t seen = 0;
            int ok = lc_of(w) + 1 < MAX_LC &&
                     ringq_cas64(seg, maplen, g.state_off + (size_t)co.slot * RINGQ_STATE_ENTRY, w, next, &seen) == 1;
            if (ok) {
                won(me, co.slot, next, &lc);
                atomic_fetch_add(&by_cas, 1);
                settle(me, co.slot, lc, &seed);
            }
            cursor = co.index + 1;
        }
        if (atomic_load(&done_count) >= jobs) break;
        /* nothing ahead: jobs may have come back READY behind us (the reaper) */
        uint64_t change = 0;
        ringq_load64(ctl, ctl_len, CHANGE_OFF, &change);
        if (change != seen_change) { /* jobs came back READY behind the cursor: look again */
            seen_change = change;
            cursor = 0;
            continue;
        }
        if (cursor < tail_now()) continue;
        a.wake_seen = wake;
        a.from_slot = tail;
        a.change_seen = change;
        a.spin_ns = (seed >> 3) % 3 == 0 ? 20000 : 0;
        ringq_claim_out *wo = shared_out ? &common_out : &co;
        if (ringq_wait_claim(ctl, ctl_len, seg, maplen, &g, &a, wo, &rec) != 0) FAIL("wait_claim failed");
        else if (!shared_out && wo->status == RINGQ_CLAIMED && rec.slot != wo->slot) FAIL("wait_claim reported another record");
        else if (wo->status == RINGQ_CLAIMED) {
            uint32_t slot = wo->slot;
            uint64_t word = wo->word;
            won(me, slot, word, &lc);
            atomic_fetch_add(&by_wait, 1);
            co.slot = slot;
            settle(me, co.slot, lc, &seed);
        }
        seed = seed * 1103515245u + 12345u;
    }
    free(order);
    free(plain);
    free(avail);
    free(enq);
    free(seqs);
    return NULL;
}

/* Returns leases left unacked to READY (lease count kept), as reclaiming an expired lease does. */
static void *reaper(void *arg) {
    (void)arg;
    while (atomic_load(&done_count) < jobs) {
        uint32_t tail = tail_now(), returned = 0;
        for (uint32_t slot = 0; slot < tail; slot++) {
            uint64_t w = word_at(slot), seen = 0;
            if ((w & 7) != RINGQ_ST_LEASED) continue;
            uint64_t ready = (w & ~7ull) | RINGQ_ST_READY;
            if (ringq_cas64(seg, maplen, g.state_off + (size_t)slot * RINGQ_STATE_ENTRY, w, ready, &seen) == 1)
                returned++;
        }
        if (returned) {
            ringq_fetch_add64(ctl, ctl_len, CHANGE_OFF, 1, NULL);
            ringq_fetch_add32(ctl, ctl_len, WAKE_OFF, 1, NULL);
            ringq_futex_wake(ctl, ctl_len, WAKE_OFF, 0x7fffffff);
        }
        usleep(2000);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc > 1) jobs = (uint32_t)atol(argv[1]);
    unsigned seed = argc > 2 ? (unsigned)strtoul(argv[2], NULL, 10) : 1;
    shared_out = argc > 3 && strcmp(argv[3], "shared") == 0;
    append_mode = argc > 3 && strcmp(argv[3], "append") == 0;
    g.seg_seq = 3;
    g.slot_size = SLOT_SIZE;
    g.slot_count = jobs;
    g.state_off = 256;
    g.data_off = g.state_off + (uint64_t)jobs * RINGQ_STATE_ENTRY;
    maplen = g.data_off + (size_t)jobs * SLOT_SIZE;
    ctl = aligned_alloc(4096, ctl_len);
    memset(ctl, 0, ctl_len);
    if (append_mode) {
        char seg_path[] = "/tmp/ringq-threads-seg.XXXXXX";
        seg_fd = mkstemp(seg_path);
        int lock_fd = mkstemp(lock_path);
        if (seg_fd < 0 || lock_fd < 0 || ftruncate(seg_fd, (off_t)maplen) != 0) {
            perror("segment file");
            return 2;
        }
        close(lock_fd); /* each producer opens its own, as each process does */
        unlink(seg_path);
        seg = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_SHARED, seg_fd, 0);
        if (seg == MAP_FAILED) {
            perror("mmap");
            return 2;
        }
    } else {
        seg = aligned_alloc(4096, (maplen + 4095) / 4096 * 4096);
        memset(seg, 0, maplen);
    }
    uint64_t tail_seg = g.seg_seq;
    memcpy(ctl + TAIL_SEG_OFF, &tail_seg, 8); /* appends go to this segment: waits may sleep on */
    set_epoch();
    claims = calloc((size_t)jobs * MAX_LC, sizeof *claims);
    acks = calloc(jobs, sizeof *acks);
    pthread_t p, r, c[CONSUMERS];
    for (uintptr_t i = 0; i < CONSUMERS; i++) pthread_create(&c[i], NULL, consumer, (void *)i);
    pthread_create(&r, NULL, reaper, NULL);
    if (append_mode) {
        pthread_t ap[PRODUCERS_APPEND];
        for (uintptr_t i = 0; i < PRODUCERS_APPEND; i++)
            pthread_create(&ap[i], NULL, append_producer, (void *)(uintptr_t)(seed + 101 * i));
        for (int i = 0; i < PRODUCERS_APPEND; i++) pthread_join(ap[i], NULL);
        atomic_store(&producer_done, 1);
        ringq_fetch_add32(ctl, ctl_len, WAKE_OFF, 1, NULL);
        ringq_futex_wake(ctl, ctl_len, WAKE_OFF, 0x7fffffff);
        unlink(lock_path);
    } else {
        pthread_create(&p, NULL, producer, (void *)(uintptr_t)seed);
        pthread_join(p, NULL);
    }
    for (int i = 0; i < CONSUMERS; i++) pthread_join(c[i], NULL);
    pthread_join(r, NULL);
    for (uint32_t slot = 0; slot < jobs; slot++) {
        uint64_t w = word_at(slot);
        if ((w & 7) != RINGQ_ST_DONE) FAIL("slot %u ends in state %llu", slot, (unsigned long long)(w & 7));
        if (atomic_load(&acks[slot]) != 1) FAIL("slot %u acked %u times", slot, atomic_load(&acks[slot]));
    }
    uint64_t counted = 0;
    ringq_load64(ctl, ctl_len, ACKED_OFF, &counted);
    if (counted != acked) FAIL("acked count %llu, acks %lu", (unsigned long long)counted, acked);
    printf("threads: %lu leases (%lu by the wait, %lu by claim_next, %lu by CAS; %lu through a segment "
           "handle), %lu acks, %lu failed\n",
           atomic_load(&leases), atomic_load(&by_wait), atomic_load(&by_claim), atomic_load(&by_cas),
           atomic_load(&by_handle), atomic_load(&acked), atomic_load(&failures));
    free(claims);
    free(acks);
    if (append_mode) {
        munmap(seg, maplen);
        close(seg_fd);
        uint32_t waiters = 1;
        ringq_load32(ctl, ctl_len, LOCK_WAITERS_OFF, &waiters);
        if (waiters) FAIL("%u writers still registered as waiting for the lock", waiters);
        uint32_t sleepers = 1;
        ringq_load32(ctl, ctl_len, WAITERS_OFF, &sleepers);
        if (sleepers) FAIL("consumers still registered asleep (waiters word %#x)", sleepers);
        printf("append: %u lock waits\n", atomic_load(&lock_waits));
    } else {
        free(seg);
    }
    free(ctl);
    return atomic_load(&failures) ? 1 : 0;
}
