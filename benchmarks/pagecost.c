/*
 * pagecost: what one durable small write costs, depending on how its bytes reach the file.
 *
 * The question it answers: does syncing a file cost more once a page of it was dirtied through a
 * writable shared mapping, compared with the raw pwrite + fdatasync floor?  Every variant writes
 * N records of R bytes (default 6,000 x 128) into its own preallocated, zero-filled files, and all
 * variants run in ONE interleaved loop: records [i, i+C) of every variant (C = 50 by default), in
 * an order that rotates from chunk to chunk, before records [i+C, ...) of any.  A chunk lasts a
 * few milliseconds, so a disk or a neighbour slowing down hits every variant alike, while within a
 * chunk each variant writes back to back as one producer does.
 *
 * Build and run (plain C, no dependencies; the directory must be on the file system to measure):
 *
 *     gcc -O2 -o /tmp/pagecost benchmarks/pagecost.c && /tmp/pagecost DIR
 *
 * Options: -n N (records per variant), -r R (record bytes), -c C (chunk), -s BYTES (smallest
 * file: 4 MiB), -z BYTES (size of the writes that zero-fill the files: 1 MiB), --evict (drop the
 * files from the page cache after the fill), -v NAME,... (run only these variants and the floor),
 * --json (one JSON object on stdout instead of the table).  The files go into a fresh
 * subdirectory of DIR (default: the current directory), removed at the end.  Per variant it
 * prints ops/s, p50 and p99 latency, the ratios to the floor, and how many KiB the block device
 * wrote per operation (from its sysfs counters: every process's writes, so rough on a busy disk).
 *
 * Why -z and --evict matter: the defaults make the files the way ringq makes a segment (4 MiB,
 * zero-filled with 1 MiB writes, used while still in the page cache).  On Linux 6.18 / ext4 a sync
 * after a store through a writable mapping of such a file then writes about as much as one fill
 * write (KiB/op ~ 1,000), while a sync after pwrite writes a few KiB.  With -z 4096, or --evict
 * (the pages come back through page faults), it writes a few KiB either way and costs about the
 * same.  That is what one expects if the page cache holds the file in folios as large as the
 * writes that filled it, and a write fault through a mapping dirties its whole folio.
 *
 * Variants (the "state word" is the 8-byte word a reader polls to see a record is published):
 *   floor      pwrite of the record + fdatasync
 *   mmap       memcpy of the record through a writable MAP_SHARED mapping, release-store of the
 *              state word in the same file (a state table before the slots, as ringq format 1),
 *              msync(MS_SYNC) from the state word's page to the record's end
 *   pw+word    pwrite of the record, 8-byte store through a writable mapping of the SAME file,
 *              fdatasync
 *   pw+pw      control for pw+word: the 8-byte word written with pwrite into the same file (two
 *              dirty pages, no mapping), fdatasync
 *   ro+msync   pwrite into a file that is mapped PROT_READ only, state word stored through a
 *              writable mapping of a DIFFERENT file (not synced), msync(MS_SYNC) of the record's
 *              range of the read-only mapping
 *   ro+fdsync  as ro+msync, fdatasync instead of msync
 *   dsync      pwritev2(RWF_DSYNC) of the record (state word in a different file, not synced)
 *   ro+state   as ro+msync, then msync(MS_SYNC) of the state word's page too (two syncs: what
 *              an enqueue costs if its state file must be durable as well)
 *   ro+jrnl    as ro+msync, then a 16-byte entry appended to a journal with pwrite + fdatasync
 *              (two syncs: the same durability with the state change journaled instead)
 *   ack-map    an ack alone: release-store of a state word through a writable mapping, then
 *              msync(MS_SYNC) of its page
 *   ack-jrnl   an ack alone: a 16-byte entry appended with pwrite + fdatasync
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096UL
#define STATE_ENTRY 16 /* bytes per slot in the state table: state word + owner word */
#define JOURNAL_ENTRY 16

enum kind { FLOOR, MMAP, PW_WORD, PW_PW, RO_MSYNC, RO_FDSYNC, DSYNC, RO_STATE, RO_JRNL, ACK_MAP, ACK_JRNL, NKIND };

static const char *const NAMES[NKIND] = {"floor", "mmap", "pw+word", "pw+pw", "ro+msync", "ro+fdsync",
                                         "dsync", "ro+state", "ro+jrnl", "ack-map", "ack-jrnl"};
static const char *const WHAT[NKIND] = {
    "pwrite + fdatasync (the floor)",
    "memcpy via writable mapping + state word in same file, msync",
    "pwrite + 8-byte store via writable map of same file, fdatasync",
    "pwrite + 8-byte pwrite into same file (no mapping), fdatasync",
    "pwrite into PROT_READ-mapped file, state word in other file, msync",
    "as ro+msync with fdatasync instead of msync",
    "pwritev2(RWF_DSYNC), state word in other file",
    "ro+msync, then msync of the state file's page too",
    "ro+msync, then 16-byte journal entry pwrite + fdatasync",
    "ack alone: store via writable mapping + msync of its page",
    "ack alone: 16-byte journal entry pwrite + fdatasync",
};
static const int SYNCS[NKIND] = {1, 1, 1, 1, 1, 1, 1, 2, 2, 1, 1};

struct file {
    int fd;
    size_t size;
    unsigned char *map; /* NULL when the variant does not map the file */
};

struct variant {
    int available;
    const char *why_not;
    struct file data;  /* records (and, for MMAP / PW_WORD, the state table in front of them) */
    struct file state; /* the state table in a file of its own */
    struct file jrnl;  /* append-only journal */
    double *lat_us;
    double dev_bytes; /* bytes the device wrote during this variant's chunks (all processes) */
    long dev_ops;     /* operations those chunks held */
};

static char dir_path[4096];
static int n_records = 6000, rec_size = 128, chunk = 50, warmup;
/* Every file is at least this big (-s): 4 MiB, the slot area of a default ringq segment. */
static size_t min_file = 4UL << 20;
/* Zero-fill write size (-z): 1 MiB, as ringq's segment creation.  It decides the size of the page
 * cache folios that hold the file afterwards, and a store through a writable mapping dirties a
 * whole folio (see the comment at the top). */
static size_t fill_chunk = 1UL << 20;
/* --evict: drop the files' pages from the page cache after the fill, so that the loop (and the
 * prefault of the mappings) reads them back, in folios the kernel's readahead chooses. */
static int evict;
static const char *only = NULL; /* comma-separated variant names, or NULL for all */

static void die(const char *what)
{
    fprintf(stderr, "pagecost: %s: %s\n", what, strerror(errno));
    exit(1);
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static size_t round_page(size_t n) { return (n + PAGE - 1) & ~(PAGE - 1); }

/* A file of `size` bytes, every byte written as zero and fsynced, so that no later sync has to
 * allocate blocks or convert unwritten extents: only the data written by the loop is measured. */
static struct file make_file(const char *name, size_t size, int prot)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir_path, name);
    if (size < min_file)
        size = round_page(min_file);
    struct file f = {.size = size, .map = NULL};
    f.fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (f.fd < 0)
        die(path);
    static unsigned char *zeros;
    if (!zeros && !(zeros = calloc(1, fill_chunk)))
        die("calloc");
    for (size_t off = 0; off < size;) {
        size_t n = size - off < fill_chunk ? size - off : fill_chunk;
        ssize_t w = pwrite(f.fd, zeros, n, (off_t)off);
        if (w < 0)
            die("zero-fill");
        off += (size_t)w;
    }
    if (fsync(f.fd) != 0)
        die("fsync");
    if (evict && posix_fadvise(f.fd, 0, 0, POSIX_FADV_DONTNEED) != 0)
        die("posix_fadvise");
    if (prot) {
        f.map = mmap(NULL, size, prot, MAP_SHARED, f.fd, 0);
        if (f.map == MAP_FAILED)
            die("mmap");
        /* Fault every page in once, as a long-lived reader would have. */
        volatile unsigned char sink = 0;
        for (size_t off = 0; off < size; off += PAGE)
            sink ^= f.map[off];
        (void)sink;
    }
    return f;
}

static void full_pwrite(int fd, const void *buf, size_t n, off_t off)
{
    ssize_t w = pwrite(fd, buf, n, off);
    if (w != (ssize_t)n)
        die("pwrite");
}

static void msync_range(unsigned char *base, size_t from, size_t to)
{
    size_t start = from & ~(PAGE - 1);
    if (msync(base + start, to - start, MS_SYNC) != 0)
        die("msync");
}

static void store_word(unsigned char *map, size_t off, uint64_t value)
{
    __atomic_store_n((uint64_t *)(map + off), value, __ATOMIC_RELEASE);
}

static void journal_append(struct file *j, long i, uint64_t word)
{
    unsigned char entry[JOURNAL_ENTRY];
    uint64_t pos = (uint64_t)i;
    memcpy(entry, &pos, 8);
    memcpy(entry + 8, &word, 8);
    full_pwrite(j->fd, entry, sizeof entry, (off_t)i * JOURNAL_ENTRY);
    if (fdatasync(j->fd) != 0)
        die("fdatasync journal");
}

/* Record i of variant k; its bytes carry i so that every write changes the page. */
static void one_op(int k, struct variant *v, long i, unsigned char *rec)
{
    size_t table = round_page((size_t)(n_records + warmup) * STATE_ENTRY);
    size_t roff = (size_t)i * (size_t)rec_size, soff = (size_t)i * STATE_ENTRY;
    uint64_t word = ((uint64_t)i << 8) | 1; /* "READY", tagged with the slot */
    memcpy(rec, &i, sizeof i);
    switch (k) {
    case FLOOR:
        full_pwrite(v->data.fd, rec, rec_size, (off_t)roff);
        if (fdatasync(v->data.fd) != 0)
            die("fdatasync");
        break;
    case MMAP:
        memcpy(v->data.map + table + roff, rec, rec_size);
        store_word(v->data.map, soff, word);
        msync_range(v->data.map, soff, table + roff + rec_size);
        break;
    case PW_WORD:
        full_pwrite(v->data.fd, rec, rec_size, (off_t)(table + roff));
        store_word(v->data.map, soff, word);
        if (fdatasync(v->data.fd) != 0)
            die("fdatasync");
        break;
    case PW_PW:
        full_pwrite(v->data.fd, rec, rec_size, (off_t)(table + roff));
        full_pwrite(v->data.fd, &word, sizeof word, (off_t)soff);
        if (fdatasync(v->data.fd) != 0)
            die("fdatasync");
        break;
    case RO_MSYNC:
    case RO_STATE:
    case RO_JRNL:
        full_pwrite(v->data.fd, rec, rec_size, (off_t)roff);
        store_word(v->state.map, soff, word);
        msync_range(v->data.map, roff, roff + rec_size);
        if (k == RO_STATE)
            msync_range(v->state.map, soff, soff + 8);
        else if (k == RO_JRNL)
            journal_append(&v->jrnl, i, word);
        break;
    case RO_FDSYNC:
        full_pwrite(v->data.fd, rec, rec_size, (off_t)roff);
        store_word(v->state.map, soff, word);
        if (fdatasync(v->data.fd) != 0)
            die("fdatasync");
        break;
    case DSYNC: {
#ifdef RWF_DSYNC
        struct iovec iov = {.iov_base = rec, .iov_len = (size_t)rec_size};
        if (pwritev2(v->data.fd, &iov, 1, (off_t)roff, RWF_DSYNC) != rec_size)
            die("pwritev2");
        store_word(v->state.map, soff, word);
#endif
        break;
    }
    case ACK_MAP:
        store_word(v->state.map, soff, word | 2);
        msync_range(v->state.map, soff, soff + 8);
        break;
    case ACK_JRNL:
        journal_append(&v->jrnl, i, word | 2);
        break;
    }
}

static void setup(int k, struct variant *v)
{
    long total = n_records + warmup;
    size_t recs = round_page((size_t)total * (size_t)rec_size);
    size_t table = round_page((size_t)total * STATE_ENTRY);
    size_t jrnl = round_page((size_t)total * JOURNAL_ENTRY);
    char name[64];
    v->available = 1;
    snprintf(name, sizeof name, "%s.data", NAMES[k]);
    switch (k) {
    case FLOOR:
        v->data = make_file(name, recs, 0);
        break;
    case MMAP:
    case PW_WORD:
        v->data = make_file(name, table + recs, PROT_READ | PROT_WRITE);
        break;
    case PW_PW:
        v->data = make_file(name, table + recs, 0);
        break;
    case RO_MSYNC:
    case RO_FDSYNC:
    case DSYNC:
    case RO_STATE:
    case RO_JRNL:
        v->data = make_file(name, recs, PROT_READ);
        snprintf(name, sizeof name, "%s.state", NAMES[k]);
        v->state = make_file(name, table, PROT_READ | PROT_WRITE);
        if (k == RO_JRNL) {
            snprintf(name, sizeof name, "%s.jrnl", NAMES[k]);
            v->jrnl = make_file(name, jrnl, 0);
        }
        break;
    case ACK_MAP:
        snprintf(name, sizeof name, "%s.state", NAMES[k]);
        v->state = make_file(name, table, PROT_READ | PROT_WRITE);
        break;
    case ACK_JRNL:
        snprintf(name, sizeof name, "%s.jrnl", NAMES[k]);
        v->jrnl = make_file(name, jrnl, 0);
        break;
    }
    if (k == DSYNC) {
#ifdef RWF_DSYNC
        unsigned char probe[1] = {0};
        struct iovec iov = {.iov_base = probe, .iov_len = 1};
        if (pwritev2(v->data.fd, &iov, 1, (off_t)(recs - 1), RWF_DSYNC) != 1) {
            v->available = 0;
            v->why_not = strerror(errno);
        }
#else
        v->available = 0;
        v->why_not = "RWF_DSYNC not known to this C library";
#endif
    }
    v->lat_us = calloc((size_t)n_records, sizeof(double));
    if (!v->lat_us)
        die("calloc");
}

static void close_file(struct file *f, const char *name, const char *suffix)
{
    if (f->map)
        munmap(f->map, f->size);
    if (f->size) {
        close(f->fd);
        char path[4200];
        snprintf(path, sizeof path, "%s/%s.%s", dir_path, name, suffix);
        unlink(path);
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double percentile(const double *sorted, int n, double p)
{
    int idx = (int)(p * (n - 1) + 0.5);
    return sorted[idx];
}

static const char *fs_name(long type)
{
    switch ((unsigned long)type) {
    case 0xEF53: return "ext2/3/4";
    case 0x58465342: return "xfs";
    case 0x9123683E: return "btrfs";
    case 0x01021994: return "tmpfs";
    case 0x2FC12FC1: return "zfs";
    case 0x794C7630: return "overlayfs";
    case 0x6969: return "nfs";
    case 0xF2F52010: return "f2fs";
    default: return "unknown";
    }
}

/* True if `name` is in the comma-separated list given with -v (or no list was given). */
static int selected(const char *name)
{
    if (!only)
        return 1;
    size_t n = strlen(name);
    for (const char *p = only; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && !strncmp(p, name, n))
            return 1;
        p += len + (end ? 1 : 0);
    }
    return 0;
}

/* Sectors written so far by the block device holding the directory (field 7 of its sysfs stat
 * file), or -1 where there is none (tmpfs) or it cannot be read.  Device-wide: it counts every
 * process's writes, so it is a rough figure on a busy machine. */
static char dev_stat_path[128];

static long long device_sectors_written(void)
{
    if (!dev_stat_path[0])
        return -1;
    FILE *fh = fopen(dev_stat_path, "r");
    if (!fh)
        return -1;
    long long f[7];
    int got = fscanf(fh, "%lld %lld %lld %lld %lld %lld %lld", &f[0], &f[1], &f[2], &f[3], &f[4], &f[5], &f[6]);
    fclose(fh);
    return got == 7 ? f[6] : -1;
}

static void usage(void)
{
    fprintf(stderr, "usage: pagecost [-n RECORDS] [-r RECORD_BYTES] [-c CHUNK] [-s MIN_FILE_BYTES] [-z FILL_WRITE_BYTES] [-v VARIANT,...] [--evict] [--json] [DIR]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    const char *parent = ".";
    int json = 0;
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--json"))
            json = 1;
        else if (!strcmp(argv[a], "--evict"))
            evict = 1;
        else if (!strcmp(argv[a], "-n") && a + 1 < argc)
            n_records = atoi(argv[++a]);
        else if (!strcmp(argv[a], "-r") && a + 1 < argc)
            rec_size = atoi(argv[++a]);
        else if (!strcmp(argv[a], "-c") && a + 1 < argc)
            chunk = atoi(argv[++a]);
        else if (!strcmp(argv[a], "-s") && a + 1 < argc)
            min_file = strtoull(argv[++a], NULL, 0);
        else if (!strcmp(argv[a], "-z") && a + 1 < argc)
            fill_chunk = strtoull(argv[++a], NULL, 0);
        else if (!strcmp(argv[a], "-v") && a + 1 < argc)
            only = argv[++a];
        else if (argv[a][0] == '-')
            usage();
        else
            parent = argv[a];
    }
    if (n_records < 1 || rec_size < 16 || rec_size > 65536 || chunk < 1 || fill_chunk < 1 ||
        fill_chunk > (1UL << 30) || min_file > (1UL << 34))
        usage();
    warmup = n_records / 20 > 0 ? n_records / 20 : 1;

    snprintf(dir_path, sizeof dir_path, "%s/pagecost.XXXXXX", parent);
    if (!mkdtemp(dir_path))
        die(dir_path);
    struct statfs sfs;
    if (statfs(dir_path, &sfs) != 0)
        die("statfs");
    const char *fs = fs_name((long)sfs.f_type);
    struct stat dst;
    if (stat(dir_path, &dst) == 0 && major(dst.st_dev) != 0)
        snprintf(dev_stat_path, sizeof dev_stat_path, "/sys/dev/block/%u:%u/stat", major(dst.st_dev),
                 minor(dst.st_dev));
    if (!strcmp(fs, "tmpfs"))
        fprintf(stderr, "pagecost: note: %s is on tmpfs; nothing here reaches a disk\n", dir_path);

    struct variant v[NKIND];
    memset(v, 0, sizeof v);
    for (int k = 0; k < NKIND; k++) {
        setup(k, &v[k]);
        if (k != FLOOR && !selected(NAMES[k])) {
            v[k].available = 0;
            v[k].why_not = "not selected (-v)";
        }
    }
    /* Start the loop with nothing of anyone's earlier writes waiting for write-back. */
    sync();

    unsigned char *rec = malloc((size_t)rec_size);
    if (!rec)
        die("malloc");
    for (int b = 0; b < rec_size; b++)
        rec[b] = (unsigned char)(0x41 + b % 26);

    /* Interleaved in chunks: records [i, i+chunk) of every variant, in an order that rotates from
     * one chunk to the next, before records [i+chunk, ...) of any.  Within a chunk a variant runs
     * its writes back to back, as one producer does; the chunks are short (milliseconds), so a disk
     * or a neighbour slowing down hits every variant alike.  The first `warmup` records of each
     * file are written but not counted. */
    long total = n_records + warmup;
    for (long i = 0, round = 0; i < total; i += chunk, round++) {
        long end = i + chunk < total ? i + chunk : total;
        for (int j = 0; j < NKIND; j++) {
            int k = (int)((round + j) % NKIND);
            if (!v[k].available)
                continue;
            long long sectors = i >= warmup ? device_sectors_written() : -1;
            for (long r = i; r < end; r++) {
                double t0 = now_us();
                one_op(k, &v[k], r, rec);
                double dt = now_us() - t0;
                if (r >= warmup)
                    v[k].lat_us[r - warmup] = dt;
            }
            long long after = sectors >= 0 ? device_sectors_written() : -1;
            if (sectors >= 0 && after >= sectors) {
                v[k].dev_bytes += (double)(after - sectors) * 512;
                v[k].dev_ops += end - i;
            }
        }
    }

    double floor_ops = 0, floor_p50 = 0;
    double ops[NKIND], p50[NKIND], p99[NKIND];
    for (int k = 0; k < NKIND; k++) {
        if (!v[k].available)
            continue;
        double sum = 0;
        for (int i = 0; i < n_records; i++)
            sum += v[k].lat_us[i];
        qsort(v[k].lat_us, (size_t)n_records, sizeof(double), cmp_double);
        ops[k] = n_records / (sum / 1e6);
        p50[k] = percentile(v[k].lat_us, n_records, 0.50);
        p99[k] = percentile(v[k].lat_us, n_records, 0.99);
        if (k == FLOOR) {
            floor_ops = ops[k];
            floor_p50 = p50[k];
        }
    }

    struct utsname un;
    uname(&un);
    if (json) {
        printf("{\"records\": %d, \"record_bytes\": %d, \"chunk\": %d, \"warmup\": %d, "
               "\"min_file_bytes\": %zu, \"fill_write_bytes\": %zu, \"evicted\": %s, \"kernel\": \"%s %s\", "
               "\"fs_type\": \"%s\", \"fs_magic\": \"0x%lx\", \"variants\": [",
               n_records, rec_size, chunk, warmup, min_file, fill_chunk, evict ? "true" : "false", un.sysname, un.release, fs,
               (unsigned long)sfs.f_type);
        int first = 1;
        for (int k = 0; k < NKIND; k++) {
            printf("%s\n  {\"name\": \"%s\", \"what\": \"%s\", \"syncs_per_op\": %d, ",
                   first ? "" : ",", NAMES[k], WHAT[k], SYNCS[k]);
            first = 0;
            if (!v[k].available)
                printf("\"available\": false, \"why_not\": \"%s\"}", v[k].why_not);
            else
            {
                printf("\"available\": true, \"ops_per_s\": %.1f, \"p50_us\": %.1f, "
                       "\"p99_us\": %.1f, \"ratio_to_floor\": %.3f, \"p50_ratio_to_floor\": %.3f, "
                       "\"device_kib_per_op\": ",
                       ops[k], p50[k], p99[k], ops[k] / floor_ops, floor_p50 / p50[k]);
                if (v[k].dev_ops)
                    printf("%.1f}", v[k].dev_bytes / v[k].dev_ops / 1024);
                else
                    printf("null}");
            }
        }
        printf("\n]}\n");
    } else {
        printf("pagecost: %d records of %d bytes per variant (+%d warm-up), interleaved in chunks "
               "of %d\n", n_records, rec_size, warmup, chunk);
        printf("files of at least %zu bytes, zero-filled with writes of %zu bytes%s\n", min_file,
               fill_chunk, evict ? ", then evicted from the page cache" : "");
        printf("kernel %s %s, file system %s (magic 0x%lx), directory %s\n\n", un.sysname,
               un.release, fs, (unsigned long)sfs.f_type, parent);
        printf("%-10s %10s %9s %9s %8s %8s %6s %8s  %s\n", "variant", "ops/s", "p50 us", "p99 us",
               "x floor", "p50 x", "syncs", "KiB/op", "what");
        for (int k = 0; k < NKIND; k++) {
            if (!v[k].available) {
                printf("%-10s %10s %9s %9s %8s %8s %6d %8s  %s (unavailable: %s)\n", NAMES[k], "-",
                       "-", "-", "-", "-", SYNCS[k], "-", WHAT[k], v[k].why_not);
                continue;
            }
            char kib[32] = "-";
            if (v[k].dev_ops)
                snprintf(kib, sizeof kib, "%.0f", v[k].dev_bytes / v[k].dev_ops / 1024);
            printf("%-10s %10.0f %9.1f %9.1f %8.2f %8.2f %6d %8s  %s\n", NAMES[k], ops[k], p50[k],
                   p99[k], ops[k] / floor_ops, floor_p50 / p50[k], SYNCS[k], kib, WHAT[k]);
        }
        printf("\nx floor: ops/s over the floor's ops/s; p50 x: the floor's p50 over this p50.\n"
               "KiB/op: what the disk wrote (data and journal, all processes) per operation.\n");
    }

    for (int k = 0; k < NKIND; k++) {
        close_file(&v[k].data, NAMES[k], "data");
        close_file(&v[k].state, NAMES[k], "state");
        close_file(&v[k].jrnl, NAMES[k], "jrnl");
        free(v[k].lat_us);
    }
    free(rec);
    if (rmdir(dir_path) != 0)
        die("rmdir");
    return 0;
}
