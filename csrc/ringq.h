/* ringq.h - the C helper of ringq: mechanisms, no policy.
 *
 * Everything here operates on memory that the caller mapped from a segment or control file
 * (MAP_SHARED).  Every function that takes a mapping takes its base address *and* its length, and
 * checks every offset and length -- including the ones it reads out of the file itself -- before it
 * touches memory.  Nothing here allocates, and nothing here decides what a queue does; the Python
 * engine (ringq/engine/ring.py and the modules under it) and the queue (ringq/local/queue.py) own the policy.
 *
 * Return convention (after LMDB): 0 or a positive count on success; a negative errno value (-EINTR,
 * -ENOSPC, ...) for an OS error; or one of the RINGQ_E* codes below, all of which lie in a reserved
 * range below -10000 so they can never be confused with an errno.  ringq/errors.py maps them, in one
 * place, to the RingqError hierarchy.
 *
 * The on-disk layout these functions understand is specified in docs/format.md.
 */
#ifndef RINGQ_H
#define RINGQ_H

#include <stddef.h>
#include <stdint.h>

/* ---- error codes ------------------------------------------------------------------------------ */
#define RINGQ_E_FIRST    (-10001)
#define RINGQ_EBOUNDS    (-10001) /* an offset or length falls outside the mapping */
#define RINGQ_EALIGN     (-10002) /* an atomic word is not naturally aligned */
#define RINGQ_EINVAL     (-10003) /* an argument is out of its documented range */
#define RINGQ_ECORRUPT   (-10004) /* a value read from the file is impossible (bad magic, CRC, length) */
#define RINGQ_ENOFUTEX   (-10005) /* futex(2) is not available; the caller falls back to polling */
#define RINGQ_E_LAST     (-10005)

/* ---- format constants (see docs/format.md) ---------------------------------------------------- */
#define RINGQ_SEG_MAGIC     0x3147455351474e52ULL /* "RNGQSEG1" read as little-endian u64 */
#define RINGQ_REC_MAGIC     0x31435251u           /* "QRC1" read as little-endian u32 */
#define RINGQ_REC_HEADER    64u                   /* bytes of fixed record header before id+payload */
#define RINGQ_STATE_ENTRY   16u                   /* bytes per slot in the state table: state + owner */

/* State word (u64, one per slot, in the state table; see docs/format.md "state word"):
 *   bits 0-2   state        RINGQ_ST_*
 *   bits 3-4   reason       why the job last left LEASED (RINGQ_WHY_*)
 *   bits 6-23  lease count  number of leases so far: the job's fencing token
 *   bits 24-63 time         milliseconds since the segment's epoch_ms: available-at when READY,
 *                           lease deadline when LEASED, finish time when DONE or DEAD            */
#define RINGQ_ST_EMPTY    0u /* slot not published (a crash before publish leaves this) */
#define RINGQ_ST_READY    1u
#define RINGQ_ST_LEASED   2u
#define RINGQ_ST_DONE     3u
#define RINGQ_ST_DEAD     4u
#define RINGQ_ST_GONE     5u /* purged, or superseded by a newer record of the same job */
#define RINGQ_ST_CONT     6u /* continuation slot of a record that spans several slots */
#define RINGQ_ST_BAD      7u /* published but failed validation: quarantined, never delivered */
#define RINGQ_WHY_NONE    0u
#define RINGQ_WHY_EXPIRED 1u /* the visibility timeout passed */
#define RINGQ_WHY_DIED    2u /* the process holding the lease died */
#define RINGQ_WHY_PURGED  3u
/* The reason field of a DONE word with the cancel flag: how the job ended without completing. */
#define RINGQ_END_CANCELLED 0u /* cancelled while pending, or its holder acked/nacked a cancel-requested lease */
#define RINGQ_END_EXPIRED   1u /* its expires-at passed before anyone leased it */
#define RINGQ_END_RECLAIMED 2u /* its cancel-requested lease was reclaimed: no ack of it went in */
/* Field positions of the state word (ringq/engine/words.py takes them from here). */
#define RINGQ_W_WHY_SHIFT   3
#define RINGQ_W_CANCEL      0x20u /* bit 5: cancel flag (policy: only Python sets it) */
#define RINGQ_W_LC_SHIFT    6
#define RINGQ_W_LC_MASK     0x3ffffu
#define RINGQ_W_TIME_SHIFT  24
#define RINGQ_W_TIME_MAX    0xffffffffffULL /* 40 bits of ms */
/* Field positions of the owner word (next to each state word). */
#define RINGQ_OW_LC_SHIFT   16

/* Geometry of one mapped segment, filled by the caller from the (validated) segment header. */
typedef struct {
    uint64_t seg_seq;    /* segment sequence number (seeds every record CRC) */
    uint64_t state_off;  /* byte offset of the state table in the mapping */
    uint64_t data_off;   /* byte offset of slot 0 in the mapping */
    uint32_t slot_size;  /* bytes per slot, a multiple of 64 */
    uint32_t slot_count; /* slots in the segment */
} ringq_geom;

/* The fixed header of a record (little-endian, RINGQ_REC_HEADER bytes, natural alignment, no padding;
 * docs/format.md "record").  The Python side takes its layout from this declaration (cffi), so the
 * format is written down once.  ringq.c checks the offsets at compile time. */
typedef struct {
    uint32_t magic;           /* RINGQ_REC_MAGIC */
    uint32_t crc;             /* CRC32C of bytes 8..len, seeded with (seg_seq, slot) */
    uint32_t record_len;      /* bytes of the record, header included */
    uint32_t span;            /* slots it occupies */
    uint64_t seq;             /* queue-wide enqueue sequence number */
    int64_t  enqueued_us;     /* microseconds since the Unix epoch */
    int64_t  available_ms;    /* initial available-at, milliseconds since the Unix epoch */
    int32_t  priority;        /* higher leases first */
    uint16_t max_attempts;    /* leases allowed before dead-lettering */
    uint16_t attempts_before; /* attempts carried over from a superseded record */
    uint16_t id_len;          /* bytes of explicit job id following the header */
    uint8_t  codec;           /* payload codec (ringq/codec.py) */
    uint8_t  kind;            /* 1 = job */
    uint32_t payload_len;     /* bytes of payload following the id */
    uint64_t supersedes;      /* (seg_seq << 24) | slot of the record this one replaces, or 0 */
} ringq_rec_header;

/* What ringq_rec_check / ringq_seg_scan learn about one record (static fields only). */
typedef struct {
    uint32_t slot;          /* head slot index */
    uint32_t span;          /* slots the record occupies (>= 1) */
    int32_t  status;        /* 0 valid; RINGQ_ECORRUPT if magic/length/CRC failed */
    int32_t  priority;      /* higher leases first */
    uint64_t seq;           /* queue-wide enqueue sequence number */
    int64_t  enqueued_us;   /* microseconds since the Unix epoch */
    int64_t  available_ms;  /* initial available-at, milliseconds since the Unix epoch */
    uint64_t supersedes;    /* (seg_seq << 24) | slot of the record this one replaces, or 0 */
    uint64_t state;         /* state word at the time of the scan (acquire load) */
    uint32_t record_len;    /* bytes of the record, header included */
    uint32_t payload_len;   /* bytes of payload */
    uint16_t max_attempts;  /* leases allowed before the job is dead-lettered */
    uint16_t attempts_before; /* attempts carried over from a superseded record */
    uint16_t id_len;        /* bytes of explicit job id (0: id derived from seq) */
    uint8_t  codec;         /* payload codec (ringq/codec.py) */
    uint8_t  kind;          /* record kind, 1 = job */
} ringq_rec_info;

/* ---- CRC32C (Castagnoli, reflected polynomial 0x82F63B78) ------------------------------------- */
/* crc is the running value (0 to start); returns the CRC of buf appended to what crc covered.
 * Known answer: ringq_crc32c(0, "123456789", 9) == 0xE3069283. */
uint32_t ringq_crc32c(uint32_t crc, const uint8_t *buf, size_t len);     /* best available */
uint32_t ringq_crc32c_sw(uint32_t crc, const uint8_t *buf, size_t len);  /* table (slice-by-8) */
uint32_t ringq_crc32c_hw(uint32_t crc, const uint8_t *buf, size_t len);  /* SSE4.2; falls back to
                                                                          * the table if absent */
int ringq_crc32c_hw_available(void);                                      /* 1 if SSE4.2 is used */

/* ---- atomics on words inside a mapping -------------------------------------------------------- */
/* off must be naturally aligned and off+size <= maplen.  Loads acquire, stores release, CAS and
 * fetch-add are sequentially consistent.  ringq_cas*: returns 1 if swapped, 0 if not (then *actual
 * holds the current value), or an error. */
int ringq_load64(const uint8_t *base, size_t maplen, size_t off, uint64_t *out);
int ringq_store64(uint8_t *base, size_t maplen, size_t off, uint64_t value);
int ringq_cas64(uint8_t *base, size_t maplen, size_t off, uint64_t expected, uint64_t desired,
                uint64_t *actual);
int ringq_fetch_add64(uint8_t *base, size_t maplen, size_t off, uint64_t delta, uint64_t *prev);
int ringq_load32(const uint8_t *base, size_t maplen, size_t off, uint32_t *out);
/* The u32 at off32, then the u64 at off64 (each an acquire load): two words compared together. */
int ringq_load32_64(const uint8_t *base, size_t maplen, size_t off32, size_t off64, uint32_t *out32,
                    uint64_t *out64);
/* A word of a shared mapping that a hot path compares with what it last saw (ringq_watch). */
typedef struct {
    const uint8_t *base;
    uint64_t maplen;
    uint64_t off;
    uint64_t expect; /* the value seen at the last reset */
    uint32_t width;  /* 4 or 8 */
    uint32_t pad;
} ringq_watched;
/* Acquire-load each of the n words of w: returns 1 if every one reads as its expect, else 0.
 * With reset, the values read become the new expects (and 1 is returned).  RINGQ_EINVAL for a
 * null w or a width other than 4 or 8, RINGQ_EBOUNDS for a word outside its mapping; nothing is
 * reset then. */
int ringq_watch(ringq_watched *w, uint32_t n, int reset);
int ringq_store32(uint8_t *base, size_t maplen, size_t off, uint32_t value);
int ringq_cas32(uint8_t *base, size_t maplen, size_t off, uint32_t expected, uint32_t desired,
                uint32_t *actual);
int ringq_fetch_add32(uint8_t *base, size_t maplen, size_t off, uint32_t delta, uint32_t *prev);
/* A word packing (value << gen_bits) | generation: set value to min(value, v) and add one to the
 * generation (modulo 2**gen_bits), in one CAS loop; v is clamped to the bits above gen_bits.
 * gen_bits in [1, 63].  Returns 0, RINGQ_EINVAL or a bounds/alignment error.  The queue's
 * lease-deadline floor (ringq/engine/control.py) is such a word. */
int ringq_lower_packed64(uint8_t *base, size_t maplen, size_t off, uint32_t gen_bits, uint64_t v);

/* ---- futex on a 32-bit word of a MAP_SHARED file mapping -------------------------------------- */
/* Wait while the word equals expected, at most timeout_ns nanoseconds (< 0: forever).  Returns 0
 * when woken or when the word already differed, 1 on timeout, -EINTR on a signal, RINGQ_ENOFUTEX
 * where futex is unavailable (the caller then polls).  Uses the shared (non-private) operations. */
int ringq_futex_wait(uint8_t *base, size_t maplen, size_t off, uint32_t expected, int64_t timeout_ns);
/* Wake up to n waiters; returns how many were woken, or an error. */
int ringq_futex_wake(uint8_t *base, size_t maplen, size_t off, int n);
int ringq_futex_available(void);
/* Poll the word (no syscall, a CPU pause between loads) until it differs from expected or spin_ns
 * nanoseconds pass.  Returns 0 if it differs, 1 if the spin ran out, or a bounds/alignment error.
 * For a consumer that expects work soon: a job appended during the spin is seen within about a
 * microsecond, without the futex wake-up's scheduling delay, at the price of a busy core. */
int ringq_spin_wait(const uint8_t *base, size_t maplen, size_t off, uint32_t expected, int64_t spin_ns);

/* ---- durability -------------------------------------------------------------------------------- */
/* msync(MS_SYNC) the pages covering [off, off+len) of the mapping (rounded out to page bounds). */
int ringq_msync(uint8_t *base, size_t maplen, size_t off, size_t len);

/* ---- the two files of a format-2 segment, mapped as one range ------------------------------------ */
/* Reserve state_len + rec_len bytes of address space, map the state file (bytes [0, state_len),
 * read-write unless writable == 0) at its start and the record file (bytes [rec_off, rec_off +
 * rec_len), always PROT_READ) right after it, all MAP_SHARED.  The other functions here then see one
 * mapping whose state table and slots lie at the offsets of a ringq_geom.  state_len and rec_off
 * must be multiples of the page size (RINGQ_EINVAL otherwise).  *out receives the base; release it
 * with ringq_unmap(base, state_len + rec_len).  Returns 0 or -errno. */
int ringq_map_pair(int state_fd, size_t state_len, int rec_fd, uint64_t rec_off, size_t rec_len,
                   int writable, uint8_t **out);
int ringq_unmap(uint8_t *base, size_t len);

/* ---- owner locks: open-file-description byte-range locks (F_OFD_SETLK) ------------------------ */
/* One byte per owner index in a shared owners file; the kernel drops the lock when the last fd of
 * the open file description closes, i.e. when the holding process dies.  trylock returns 1 if
 * acquired, 0 if someone else holds it; probe returns 1 if held by another description, 0 if free. */
int ringq_owner_trylock(int fd, uint32_t idx);
int ringq_owner_unlock(int fd, uint32_t idx);
int ringq_owner_probe(int fd, uint32_t idx);

/* ---- records ----------------------------------------------------------------------------------- */
/* Write one record (rec, len bytes: a RINGQ_REC_HEADER header followed by id and payload; the caller
 * leaves the crc field zero) at head slot `slot`: copies the bytes, fills the CRC, marks continuation
 * slots CONT, and publishes by release-storing `state` (a READY state word) into the head slot.
 * Returns the number of slots used, or RINGQ_EBOUNDS if it does not fit before slot_count. */
int ringq_rec_write(uint8_t *base, size_t maplen, const ringq_geom *g, uint32_t slot,
                    const uint8_t *rec, uint32_t len, uint64_t state);
/* The same for format 2, where the slots are a file that every process maps read-only: fills the CRC
 * into rec (the caller's buffer), pwrite(2)s the record to the record file `fd` at file offset
 * data_file_off + slot * slot_size (retrying short writes and EINTR), then marks continuation slots
 * CONT and publishes by release-storing `state` into the head slot's state word of the mapping.
 * Returns the number of slots used, RINGQ_EBOUNDS, RINGQ_EINVAL, or -errno of a failed pwrite
 * (nothing is published then). */
int ringq_rec_pwrite(int fd, uint64_t data_file_off, uint8_t *base, size_t maplen, const ringq_geom *g,
                     uint32_t slot, uint8_t *rec, uint32_t len, uint64_t state);
/* Validate the record whose head is at `slot` (published or not) and fill *out.  Returns 0 if it is
 * valid, RINGQ_ECORRUPT if not (out->span is then 1 and out->status says so), or RINGQ_EBOUNDS. */
int ringq_rec_check(const uint8_t *base, size_t maplen, const ringq_geom *g, uint32_t slot,
                    ringq_rec_info *out);
/* Scan records with head slots in [from, to), at most cap of them, validating each.  A record that
 * fails validation is reported with status RINGQ_ECORRUPT and span 1, and the scan resynchronises on
 * the next slot whose state word is not CONT (a damaged record's continuation slots hold payload
 * bytes, which must never be taken for a record).  Returns the number written to out; *next
 * receives the slot after the last one reported. */
int ringq_seg_scan(const uint8_t *base, size_t maplen, const ringq_geom *g, uint32_t from, uint32_t to,
                   ringq_rec_info *out, uint32_t cap, uint32_t *next);
/* First index i in [start, n) such that the state word of slot order[i] is READY; returns n if none.
 * The state word found is stored in *state.  order[] entries >= slot_count are skipped. */
int ringq_next_ready(const uint8_t *base, size_t maplen, const ringq_geom *g, const uint32_t *order,
                     uint32_t n, uint32_t start, uint64_t *state);

/* ---- words of the control page the one-call operations update ---------------------------------- */
/* Offsets of the control page's words an append or an ack uses (docs/format.md "control file"). */
typedef struct {
    size_t tail_seg;     /* u64: seq of the tail segment */
    size_t next_seq;     /* u64: next job seq to assign */
    size_t enqueued;     /* u64: jobs enqueued (a statistic) */
    size_t acked;        /* u64: leases acked (a statistic) */
    size_t lock_waiters; /* u32: writers waiting for the writer lock */
    size_t lock_wake;    /* u32: futex word those writers sleep on */
    size_t wake;         /* u32: consumers' futex word (0: the caller wakes them itself) */
    size_t waiters;      /* u32: consumers asleep on it (RINGQ_CLAIM_WAITER) */
} ringq_ctl_words;
/* The waiters word counts every sleeper in its low 16 bits (each adds 1) and, in its high 16,
 * those asleep in ringq_wait_claim (each adds 1 + RINGQ_CLAIM_WAITER): one load tells an append
 * whether every sleeper waits to claim, and it then wakes one per record (csrc/append.c). */
#define RINGQ_CLAIM_WAITER (1u << 16)

/* ---- leases and acks in one call each (csrc/claim.c) --------------------------------------------- */
/* What ringq_claim_next did (out->status) and what it saw. */
#define RINGQ_CLAIMED  0 /* the expected slot was READY and plain: it is now LEASED and tagged */
#define RINGQ_CLAIM_ASK 1 /* the first READY slot from `start` is another one, or needs the caller's
                          * judgement (retried, not yet due, not plain): nothing was changed */
#define RINGQ_CLAIM_NONE 2 /* no READY slot from `start` to n */
typedef struct {
    int32_t  status;  /* RINGQ_CLAIMED, RINGQ_CLAIM_ASK or RINGQ_CLAIM_NONE */
    uint32_t index;   /* index into order[] of the slot claimed or seen (n for NONE); of
                       * ringq_wait_claim: the slot its look got to (the records before it, from
                       * a->from_slot on, were taken by other consumers) */
    uint32_t slot;    /* that slot */
    uint32_t _pad;
    uint64_t word;    /* CLAIMED: the new LEASED word; ASK: the READY word seen */
    uint64_t prev;    /* CLAIMED: the READY word it replaced */
} ringq_claim_out;

/* Lease the next job of a lane in one call.  order[start..n) are head slots in lease order; the
 * first whose state word is READY is the candidate.  It is claimed -- CAS READY(lc 0, t) to
 * LEASED(lc 1, deadline_rel), reason kept, then a release-store of owner_base | (1 << 16) into its
 * owner word -- only if it is `expect` (the slot the caller ranked), plain[slot] is nonzero (the
 * caller's per-slot "no policy applies" flag: no delay, no expiry, not a relocated copy), it was
 * never leased (lease count 0) and its time is <= now_rel; otherwise out says what was seen and
 * nothing changes.  A lost CAS (another process leased it first) moves on to the next READY slot.
 * now_rel and deadline_rel are ms since the segment's epoch (deadline clamped to 40 bits).
 * Returns 0, RINGQ_EINVAL, or a bounds error of the geometry.  plain[] has slot_count bytes. */
int ringq_claim_next(uint8_t *base, size_t maplen, const ringq_geom *g, const uint32_t *order,
                     uint32_t n, uint32_t start, uint32_t expect, const uint8_t *plain,
                     uint64_t now_rel, uint64_t deadline_rel, uint64_t owner_base,
                     ringq_claim_out *out);

/* One job ringq_claim_run leased: its head slot, the LEASED word written, and the record's fields
 * the caller builds the job from, without reading the header again (the record was validated
 * first).  Natural alignment, no padding: the Python side reads an array of them with struct. */
typedef struct {
    uint64_t word;         /* the LEASED word written (lease count 1) */
    uint64_t seq;          /* queue-wide enqueue sequence number */
    int64_t  enqueued_us;  /* microseconds since the Unix epoch */
    int64_t  available_ms; /* milliseconds since the Unix epoch */
    uint32_t slot;         /* head slot */
    uint32_t payload_len;  /* bytes of payload, after the header and the id */
    int32_t  priority;
    uint16_t max_attempts;
    uint16_t id_len;       /* bytes of explicit id (0: the id is the seq) */
    uint8_t  codec;        /* payload codec */
    uint8_t  pad8;
    uint16_t pad16;
    uint32_t pad32;
} ringq_claimed;

/* The per-slot ordering fields of the caller's index (each slot_count long) and the key of the
 * best candidate outside this lane: ringq_claim_run leases a candidate only while its key
 * (avail_ms[slot], enq_us[slot], seq[slot] & 0xffffffff) is not above the bound's (unless bounded
 * is 0).  Equal keys are the same job: the bound is that job's own entry elsewhere in the caller's
 * heap, and the lane leases it. */
typedef struct {
    const int64_t  *avail_ms;
    const int64_t  *enq_us;
    const uint64_t *seq;
    int64_t  bound_avail_ms;
    int64_t  bound_enq_us;
    uint32_t bound_seq32;
    uint32_t bounded;
} ringq_run_keys;

/* Why ringq_claim_run stopped (*why). */
#define RINGQ_RUN_END   0 /* no READY slot left from `start` to n */
#define RINGQ_RUN_ASK   1 /* order[*next] is READY but not leased here: the caller decides */
#define RINGQ_RUN_BOUND 2 /* order[*next] ranks after the bound: another lane's job comes first */
#define RINGQ_RUN_FULL  3 /* cap jobs leased */

/* Lease a run of a lane's jobs in one call: ringq_claim_next's rule (READY, plain[slot], never
 * leased, due by now_rel, record valid; the same CAS and owner word) applied to order[start..n)
 * in turn, without an expected slot, until cap jobs are leased or the next READY candidate is not
 * claimable (RINGQ_RUN_ASK), ranks after keys' bound (RINGQ_RUN_BOUND) or none is left
 * (RINGQ_RUN_END).  Slots that are not READY are passed over; a lost CAS moves on.  out[0..count)
 * receives the jobs leased, *next the index in order[] to continue from (the ASK or BOUND
 * candidate's, or n), *why the reason it stopped.  Returns the count (>= 0), RINGQ_EINVAL (NULL
 * pointers) or a bounds error of the geometry. */
int ringq_claim_run(uint8_t *base, size_t maplen, const ringq_geom *g, const uint32_t *order,
                    uint32_t n, uint32_t start, const uint8_t *plain, const ringq_run_keys *keys,
                    uint64_t now_rel, uint64_t deadline_rel, uint64_t owner_base,
                    ringq_claimed *out, uint32_t cap, uint32_t *next, uint32_t *why);

/* Where a consumer that found nothing waits (ringq_wait_claim): words of the control page and the
 * tail segment's position as the caller last saw them. */
typedef struct {
    size_t wake_off;      /* u32 futex word producers bump (control page) */
    size_t waiters_off;   /* u32 count of sleepers on it (RINGQ_CLAIM_WAITER) */
    size_t change_off;    /* u64 bumped whenever a job returns to READY */
    uint32_t wake_seen;   /* the wake word read before the caller looked for work */
    uint32_t from_slot;   /* slots of the tail segment the caller has read: new records start here */
    uint64_t change_seen; /* the change word read with it */
    int64_t spin_ns;      /* poll the wake word this long before sleeping (0: sleep at once) */
    int64_t timeout_ns;   /* give up after this long in all */
    int64_t epoch_ms;     /* the tail segment's epoch, ms since the Unix epoch */
    uint64_t vt_ms;       /* visibility timeout of a lease taken here */
    uint64_t owner_base;  /* owner word, lease count 0 (as ringq_claim_next) */
    size_t floor_off;     /* u64 lease-deadline floor (control page) a lease taken here lowers
                             (ringq_lower_packed64); 0: none */
    uint32_t floor_gen_bits; /* its generation bits, 1..63 when floor_off is set */
    size_t tail_seg_off;  /* u64 seq of the segment appends go to (control page): the wait sleeps
                             on only while it is this segment's (g->seg_seq); 0: never sleeps on */
} ringq_wait_args;

/* Wait for work (spin, then futex as Control.sleep does), then, if the only news is new records
 * at the end of the tail segment (`base`: the caller's mapping of it), lease the first of them
 * in the same call, before returning to the interpreter: a consumer woken for one new job holds
 * its lease a few microseconds after the wake.  It leases only when the records published from
 * a->from on are at most RINGQ_WAIT_FEW, all valid, the first of them still READY (the ones
 * before it taken by other consumers) is plain (kind 1, no carried attempts, no supersede, not
 * delayed: available_ms <= enqueued_us / 1000), never leased and due, no later one has a higher
 * priority, and no job returned to READY meanwhile (the change word is as seen): exactly the job
 * the caller's index would rank first.  When every new record was taken, the wake word moved by
 * exactly 1 (one append's wake-up: other news moves it by 2) and appends still go to this segment
 * (the word at a->tail_seg_off), it sleeps again from there, in the same call, for what is left of
 * the timeout.  A lease taken lowers
 * the floor word at a->floor_off (if set) to its deadline, so that no reaper's scan waits past
 * it.  Returns 0 with out->status RINGQ_CLAIMED (out->slot, out->word; and, if rec is not NULL, the record's fields
 * in *rec, as ringq_claim_run reports a job), RINGQ_CLAIM_ASK (something happened: look with the
 * general path) or RINGQ_CLAIM_NONE (timed out); or an error. */
#define RINGQ_WAIT_FEW 8
int ringq_wait_claim(uint8_t *ctl, size_t ctl_len, uint8_t *base, size_t maplen, const ringq_geom *g,
                     const ringq_wait_args *a, ringq_claim_out *out, ringq_claimed *rec);

/* Ack the lease of `slot` in one call: CAS LEASED(lc, t) to DONE(lc, now_rel), reason kept, then
 * add one to the segment's finished count (RINGQ_SEG_OFF_FINISHED; *finished = the new count) and
 * to the control mapping's acked count (ctl, ctl_len, words->acked).  token is the caller's fencing
 * token (0: any lease, as an ack by bare id).  Returns 0 when acked (*word = the DONE word), 1 for
 * a repeated ack (DONE with that token, unless a cancel ended the job after that lease ended
 * unacked (reason RINGQ_END_RECLAIMED); or any DONE without a token), 2 when refused (not leased, or
 * another token: *word = the word seen, for the caller's message), 3 when the lease carries the
 * cancel flag (the caller ends it as its policy says); nothing is changed unless 0.  Or an error. */
int ringq_ack_slot(uint8_t *base, size_t maplen, const ringq_geom *g, uint32_t slot, uint32_t token,
                   uint64_t now_rel, uint8_t *ctl, size_t ctl_len, const ringq_ctl_words *words,
                   uint64_t *word, uint64_t *finished);

/* A mapped segment and the control page as the per-job calls take them: one argument each instead
 * of three or four.  The Python side builds one per mapping and sets maplen (len) to 0 before it
 * unmaps, so a call through a stale handle fails with RINGQ_EBOUNDS; it holds the segment's mapping
 * while a call through its handle runs, and unmaps the control page only under the queue's lock,
 * which every such call holds. */
typedef struct {
    uint8_t *base;
    size_t maplen;
    const ringq_geom *g;
    int64_t epoch_ms; /* the segment's epoch, ms since the Unix epoch (its state words' time base) */
} ringq_seg_ref;
typedef struct {
    uint8_t *base;
    size_t len;
    const ringq_ctl_words *words;
    size_t deps;  /* u64: the dependents counter, reported after an ack (ringq/engine/deps.py) */
    size_t floor; /* u64: the lease-deadline floor a lease lowers (ringq_lower_packed64); 0: none */
    uint32_t floor_gen_bits; /* its generation bits */
} ringq_ctl_ref;

/* ringq_ack_slot through the handles, at the time CLOCK_REALTIME reads now: the same answers, with
 * out[0] the word (*word above), out[1] the finished count, and out[2] the dependents counter loaded
 * after the CAS (ordered after it, so a dependent published before this ack is seen), the last two
 * when acked.  A nonzero seq is the job's, for a caller that has not looked at the slot: the call
 * then changes nothing and answers RINGQ_ACK_OTHER when the slot's record is not that job's, and
 * RINGQ_ACK_EXPIRED when the word is the lease the token names but its deadline has passed (the
 * caller reclaims such a lease before it decides). */
#define RINGQ_ACK_EXPIRED 4
#define RINGQ_ACK_OTHER   5
int ringq_ack(const ringq_seg_ref *s, const ringq_ctl_ref *c, uint32_t slot, uint32_t token,
              uint64_t seq, uint64_t *out);

/* ringq_claim_run through the segment's handle, due by the time CLOCK_REALTIME reads now and
 * leased for vt_ms from then; next_why[0] and next_why[1] receive *next and *why, and next_why[2]
 * how many it leased (the records of out; 0 for none or an error), which stays there for a
 * caller that must find them again when the return value never reached it (the interpreter's
 * caller, interrupted as the call returned).  When it leased any, it lowers the control page's
 * lease-deadline floor (c->floor) to their deadline, which no lease of the run expires before.
 * The floor word is checked before anything is leased. */
int ringq_take_run(const ringq_seg_ref *s, const ringq_ctl_ref *c, const uint32_t *order,
                   uint32_t n, uint32_t start, const uint8_t *plain, const ringq_run_keys *keys,
                   uint64_t vt_ms, uint64_t owner_base, ringq_claimed *out, uint32_t cap,
                   uint32_t *next_why);

/* ---- appends ------------------------------------------------------------------------------------ */
/* Mutable words of a segment's header page that publishing an append updates (the state file's
 * header page, offsets in the mapping; docs/format.md "state file").  ringq/engine/segment.py checks its
 * own offsets against these. */
#define RINGQ_SEG_OFF_TAIL     128u /* u32: next free slot */
#define RINGQ_SEG_OFF_NRECORDS 160u /* u64: records published (heads below the tail) */
#define RINGQ_SEG_OFF_LAST_SEQ 168u /* u64: seq of the last record published */
#define RINGQ_SEG_OFF_RETIRED  144u /* u32: 1 once retirement began */
#define RINGQ_SEG_OFF_FINISHED 152u /* u64: records that reached DONE or GONE (an ack adds one) */

/* The prologue of an append, under the writer lock: may a batch of n records taking at most
 * `slots` slots be appended to this segment at its stored tail as it is?  It may if the u64 word at
 * tail_seg_off of the control mapping (ctl, ctl_len) names it (equals g->seg_seq), it is not
 * retired, its tail (acquire load) plus `slots` is at most slot_count and the state word at the
 * tail is EMPTY (nothing was published beyond the tail by a writer that died).  Then it reserves
 * n seqs in the u64 word at next_seq_off of the control mapping: the
 * first is the larger of that word and the segment's last seq + 1, and the word becomes first + n
 * (reserved before anything is written: a crash leaves a gap, never a reuse).  Returns 0 and
 * fills *tail and *first_seq; 1 if the caller must look closer (another tail segment, retired, a
 * tail to repair, a batch that may need a rotation): then nothing is reserved; RINGQ_EBOUNDS, RINGQ_EALIGN or RINGQ_EINVAL for bad
 * arguments. */
int ringq_append_reserve(uint8_t *base, size_t maplen, const ringq_geom *g, uint8_t *ctl, size_t ctl_len,
                         size_t tail_seg_off, size_t next_seq_off, uint32_t n, uint64_t slots,
                         uint32_t *tail, uint64_t *first_seq);

/* Write a batch of records into the record file and, when asked, publish them: the write path of
 * every enqueue.  Record i of the batch (0 <= i < n) has the header *tmpl (its priority,
 * max_attempts, attempts_before, kind, enqueued_us, available_ms, supersedes) with seq tmpl->seq + i,
 * codec codecs[i], id_len id_lens[i] (id_lens NULL: every id_len is 0) and payload_len
 * payload_lens[i]; its id and payload bytes follow those of record i-1 in data (data_len bytes in
 * all).  The other fields of *tmpl (magic, crc, lengths, span, codec) are ignored.
 *
 * Starting at record `first`, it lays out the longest run of records that fits both the slots
 * [tail, slot_count) and scratch (scratch_len bytes, the caller's), each at a slot boundary with its
 * header, CRC32C (seeded with (seg_seq, head slot)) and zeroed padding, and pwrite(2)s the run to the
 * record file `fd` at file offset data_file_off + tail * slot_size in one call (retrying short
 * writes and EINTR).  heads[i] receives record i's head slot, *end the slot after the run.
 *
 * If `publish` is non-zero and the run ends the batch (first + count == n), it then publishes the
 * run as ringq_append_publish does, and adds n to the u64 counter at count_off of the control
 * mapping (ctl, ctl_len) unless ctl is NULL; otherwise nothing is published or counted and the
 * caller publishes each run with ringq_append_publish once every run of the batch is written.
 *
 * Returns the number of records in the run: 0 if record `first` does not fit before the
 * segment's end (tail > 0; the caller rotates and calls again).  RINGQ_EBOUNDS if a record can
 * never fit a segment (it would not fit at tail 0), if data is shorter than the records' lengths,
 * tail > slot_count or the counter lies outside the control mapping; RINGQ_EINVAL for a bad argument (NULL pointers, fd < 0, first >= n, a
 * state word EMPTY or CONT, a record longer than the 32-bit length field, scratch too small for
 * record `first`); -errno of a failed pwrite: then nothing is published and the bytes the failed
 * run wrote are overwritten with zeros (best effort), so that no half of it is later taken for
 * records. */
int ringq_append(int fd, uint64_t data_file_off, uint8_t *base, size_t maplen, const ringq_geom *g,
                 uint32_t tail, const ringq_rec_header *tmpl, uint64_t state,
                 const uint8_t *codecs, const uint16_t *id_lens, const uint32_t *payload_lens,
                 uint32_t n, uint32_t first, const uint8_t *data, size_t data_len,
                 uint8_t *scratch, size_t scratch_len, int publish, uint8_t *ctl, size_t ctl_len,
                 size_t count_off, uint32_t *heads, uint32_t *end);

/* A whole uncontended append, from taking the writer lock to releasing it: the common case of an
 * enqueue in one call.  It takes the writer lock with flock(lock_fd, LOCK_EX | LOCK_NB); checks
 * and reserves as ringq_append_reserve does (the segment named in the control page's tail_seg
 * word, nothing past its tail, room for the whole batch); stamps the template with the seqs, the
 * time (CLOCK_REALTIME: enqueued_us, and available_ms = now + delay_ms) and writes and publishes
 * the batch as ringq_append does (READY words whose time is available_ms - epoch_ms, clamped to
 * [0, RINGQ_TIME_MAX]), adding n to the enqueued word; then releases the lock and, if the
 * lock_waiters word is non-zero, bumps lock_wake and wakes one waiter on it (the protocol of
 * ringq/engine/lock.py).  If w->wake is non-zero it wakes consumers, as soon
 * as the batch is published and before the lock is released: adds 1 to the wake word and, if the
 * waiters word is non-zero, wakes every sleeper on it (for a strategy with no sync between
 * publishing and returning, so sleepers hear of the jobs at once).  With
 * writeback non-zero it starts writing the batch's slots back to the disk once the lock is
 * released, as ringq_append_writeback does (a hint for a caller about to sync them: its error is
 * ignored).  *tmpl keeps the seq of the first record and the times, heads[] each head slot, *end
 * the new tail.
 *
 * Returns n when the batch is written and published.  Returns 0, having reserved and written
 * nothing (and holding no lock), when the caller must take the general way: the lock is held
 * elsewhere (or flock failed), the segment is not the tail segment or not as it should be, the
 * batch may not fit before its end, or scratch (scratch_len bytes) cannot hold it.  A negative code
 * as ringq_append's, the lock released: RINGQ_EINVAL for bad arguments (also n == 0 or a negative
 * delay), RINGQ_EBOUNDS for words outside the mappings, -errno of a failed pwrite (the seqs
 * reserved stay unused: a gap). */
int ringq_append_fast(int lock_fd, uint8_t *ctl, size_t ctl_len, const ringq_ctl_words *w, int fd,
                      uint64_t data_file_off, uint8_t *base, size_t maplen, const ringq_geom *g,
                      int64_t epoch_ms, int64_t delay_ms, ringq_rec_header *tmpl, const uint8_t *codecs,
                      const uint16_t *id_lens, const uint32_t *payload_lens, uint32_t n, const uint8_t *data,
                      size_t data_len, uint8_t *scratch, size_t scratch_len, uint32_t *heads, uint32_t *end,
                      int writeback);
/* An express enqueue (the CPython extension's express(), csrc/ext/jobs.c): one job with a plain
 * JSON payload and default arguments, encoded, appended by ringq_append_fast and returned as a
 * Job in one call.  The plan holds ringq_append_fast's arguments for the segment appended to last;
 * the appender sets it whenever that segment or its scratch changes, and uses it under the writer
 * thread lock (for tmpl and scratch). */
typedef struct {
    uint8_t *ctl;                   /* the control mapping and its length */
    size_t ctl_len;
    const ringq_ctl_words *words;   /* its words the append updates (with wake: it wakes consumers) */
    int fd;                         /* the segment's record file */
    uint64_t data_file_off;         /* file offset of slot 0 */
    uint8_t *base;                  /* the segment's mapping, its length and geometry */
    size_t maplen;
    const ringq_geom *g;
    int64_t epoch_ms;
    ringq_rec_header *tmpl;         /* the template header (seq and times come back in it) */
    uint8_t *scratch;               /* the layout scratch and its length */
    size_t scratch_len;
    uint64_t max_record;            /* the largest record the queue stores, header included */
    uint8_t codec;                  /* the JSON codec's id */
    uint8_t kind;                   /* the record kind of a job */
    int writeback;                  /* ringq_append_fast's writeback */
    uint32_t end;                   /* out: the slot after the last express append's record */
} ringq_express_plan;

/* Start writing slots [lo, hi) of a segment's record file (slot 0 at file offset data_file_off)
 * back to the disk, without waiting: sync_file_range(SYNC_FILE_RANGE_WRITE).  A hint that promises
 * nothing -- the sync of ringq_append_sync makes the records durable -- called between the write
 * and that sync so that the disk writes while the caller runs.  Returns 0, RINGQ_EINVAL (fd < 0,
 * lo > hi, hi > slot_count) or -errno of the call (ENOSYS where it is missing). */
int ringq_append_writeback(int fd, uint64_t data_file_off, const ringq_geom *g, uint32_t lo, uint32_t hi);
/* The durable end of an append, after the writer lock is released: force slots [lo, hi) of the
 * segment's record file to disk -- fdatasync(fd) when fd >= 0, else msync(MS_SYNC) of that range
 * of the mapping (the pages covering it) -- then, unless ctl is NULL (a sync alone), add one to
 * the u64 at sync_count_off of the control page and, if w->wake is non-zero, wake consumers as
 * ringq_append_fast does (add 1 to the wake word; wake every sleeper if the waiters word is
 * non-zero).  Nothing is counted nor woken when the sync fails.  hi == lo syncs nothing and still
 * counts and wakes.  Returns 0, RINGQ_EINVAL (lo > hi, hi > slot_count, ctl without w),
 * RINGQ_EBOUNDS for a bad geometry or words outside the mappings, or -errno of the failed sync. */
int ringq_append_sync(uint8_t *base, size_t maplen, const ringq_geom *g, int fd, uint32_t lo, uint32_t hi,
                      uint8_t *ctl, size_t ctl_len, size_t sync_count_off, const ringq_ctl_words *w);
/* Publish n written records whose head slots are heads[0..n) (strictly increasing, each below
 * end; the last record ends at slot `end` <= slot_count): mark every slot between heads CONT,
 * release-store `state` (READY or DEAD; not EMPTY or CONT) into each head's state word in order,
 * then add n to the segment's record count, store last_seq and release-store end as its tail.
 * Returns n, RINGQ_EINVAL or RINGQ_EBOUNDS (nothing is stored then). */
int ringq_append_publish(uint8_t *base, size_t maplen, const ringq_geom *g, const uint32_t *heads,
                         uint32_t n, uint32_t end, uint64_t state, uint64_t last_seq);

/* ---- search ---------------------------------------------------------------------------------- */

/* Read the frames of an error side file (ringq/engine/errtext.py: u32 text length n, u32 CRC32C
 * of the next 8 + n bytes, u32 slot, u32 lease count, n bytes of text) held in buf[0..len), as
 * errtext.read_errors does: from offset 0, each frame's length says where the next starts; a frame
 * whose CRC fails is skipped; a frame cut short by the end of buf ends the scan.  For the i-th
 * valid frame (i < cap) stores slots[i], lcs[i] and match[i]: 1 if its text contains needle[0..nlen)
 * comparing ASCII letters without regard to case (other bytes exactly; nlen 0 always matches), else
 * 0.  Returns the number of valid frames (counting past cap; only cap are stored), or RINGQ_EINVAL. */
int64_t ringq_frames_scan(const uint8_t *buf, size_t len, const uint8_t *needle, size_t nlen,
                          uint32_t *slots, uint32_t *lcs, uint8_t *match, size_t cap);

#endif /* RINGQ_H */
