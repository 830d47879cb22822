/* crashrec: an LD_PRELOAD recorder of every call by which a process changes the files of one
 * directory, or their durability, for the power-loss enumeration of tests/crashstates.py.
 *
 * Loaded into a workload process started by the tests with
 *     LD_PRELOAD=crashrec.so RINGQ_CRASHREC_TRACE=FILE RINGQ_CRASHREC_DIR=DIR
 * it interposes the libc entry points that Python's os module, its io module, its mmap module and
 * ringq's C helper call (open/openat/creat with O_CREAT or O_TRUNC, write, pwrite, writev, pwritev,
 * ftruncate, fallocate, posix_fallocate, fsync, fdatasync, msync, rename, link, unlink, mkdir,
 * and mmap/munmap to know the shared file mappings), performs each call unchanged, and appends an
 * event to FILE for those that touch a file under DIR: the bytes a write wrote, the range a sync
 * covered, the names an operation on the directory changed.  Before each logged call it compares
 * every writable MAP_SHARED mapping of a file under DIR with its copy from the last call and logs
 * each page that changed (state words change by CAS, never by a call this shim could see).
 * crashrec_note() lets the workload put its own markers (an enqueue returned) in the same order.
 *
 * Every logged call runs under one mutex, so the trace is a total order consistent with what the
 * calls did.  A thread already inside the shim (a signal handler that writes, or the shim's own
 * I/O) passes straight through to libc, so nothing recurses or deadlocks.  The environment
 * variables are removed at load, so processes the workload starts are not recorded, and a forked
 * child stops recording (its writes would interleave with the parent's).
 *
 * Event layout (little-endian): struct ev below, then path, path2 and data bytes.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

enum {
    EV_OPEN = 1,     /* path, ino, a = flags, b = 1 if the call created the file */
    EV_WRITE = 2,    /* ino, a = file offset, data = the bytes written */
    EV_TRUNCATE = 3, /* ino, a = new size */
    EV_FALLOCATE = 4,/* ino, a = mode, b = offset, c = length */
    EV_FSYNC = 5,    /* ino, a = 1 for fdatasync; mode = st_mode (a directory's fsync) */
    EV_MSYNC = 6,    /* ino, a = file offset, b = end offset, c = flags */
    EV_RENAME = 7,   /* path -> path2 */
    EV_LINK = 8,     /* path -> path2 */
    EV_UNLINK = 9,   /* path */
    EV_MKDIR = 10,   /* path, ino of the new directory */
    EV_PAGE = 11,    /* ino, a = file offset, data = the page as it is now in the mapping */
    EV_NOTE = 12,    /* data = the workload's marker */
    EV_MMAP = 13,    /* ino, a = file offset, b = length, c = prot */
    EV_END = 14,
};

struct ev {
    uint32_t type;
    uint32_t pathlen;
    uint32_t path2len;
    uint32_t mode;
    int64_t a, b, c;
    uint64_t ino;
    uint64_t datalen;
};

#define PAGE 4096
#define MAX_MAPS 512

struct mapping {
    uint8_t *addr;
    size_t len;
    uint64_t ino;
    int64_t off;
    int writable;
    uint8_t *shadow; /* the mapping's content at the last logged call (writable ones only) */
};

static int trace_fd = -1;
static int enabled;
static char dir[PATH_MAX];
static size_t dirlen;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static __thread int inside;
static struct mapping maps[MAX_MAPS];

#define REAL(ret, name, args)                                   \
    static ret(*real_##name) args;                              \
    static void load_##name(void) {                             \
        if (!real_##name) real_##name = dlsym(RTLD_NEXT, #name);\
    }

REAL(int, open, (const char *, int, ...))
REAL(int, openat, (int, const char *, int, ...))
REAL(ssize_t, write, (int, const void *, size_t))
REAL(ssize_t, pwrite, (int, const void *, size_t, off_t))
REAL(ssize_t, writev, (int, const struct iovec *, int))
REAL(ssize_t, pwritev, (int, const struct iovec *, int, off_t))
REAL(ssize_t, pwritev2, (int, const struct iovec *, int, off_t, int))
REAL(int, ftruncate, (int, off_t))
REAL(int, fallocate, (int, int, off_t, off_t))
REAL(int, posix_fallocate, (int, off_t, off_t))
REAL(int, fsync, (int))
REAL(int, fdatasync, (int))
REAL(int, msync, (void *, size_t, int))
REAL(int, rename, (const char *, const char *))
REAL(int, renameat, (int, const char *, int, const char *))
REAL(int, renameat2, (int, const char *, int, const char *, unsigned int))
REAL(int, link, (const char *, const char *))
REAL(int, linkat, (int, const char *, int, const char *, int))
REAL(int, unlink, (const char *))
REAL(int, unlinkat, (int, const char *, int))
REAL(int, mkdir, (const char *, mode_t))
REAL(int, mkdirat, (int, const char *, mode_t))
REAL(void *, mmap, (void *, size_t, int, int, int, off_t))
REAL(int, munmap, (void *, size_t))

/* ---- the trace ------------------------------------------------------------------------------- */

static void put_all(const struct iovec *iov, int n) {
    /* One writev per event; a short write (a signal) finishes with the rest. */
    struct iovec v[5];
    memcpy(v, iov, sizeof(struct iovec) * (size_t)n);
    int i = 0;
    while (i < n) {
        ssize_t w = syscall(SYS_writev, trace_fd, &v[i], n - i);
        if (w < 0) {
            if (errno == EINTR) continue;
            return;
        }
        while (i < n && (size_t)w >= v[i].iov_len) {
            w -= (ssize_t)v[i].iov_len;
            i++;
        }
        if (i < n) {
            v[i].iov_base = (uint8_t *)v[i].iov_base + w;
            v[i].iov_len -= (size_t)w;
        }
    }
}

static void emit(struct ev *e, const char *p1, const char *p2, const void *data) {
    struct iovec iov[4];
    int n = 0;
    e->pathlen = p1 ? (uint32_t)strlen(p1) : 0;
    e->path2len = p2 ? (uint32_t)strlen(p2) : 0;
    iov[n].iov_base = e;
    iov[n++].iov_len = sizeof *e;
    if (e->pathlen) {
        iov[n].iov_base = (void *)p1;
        iov[n++].iov_len = e->pathlen;
    }
    if (e->path2len) {
        iov[n].iov_base = (void *)p2;
        iov[n++].iov_len = e->path2len;
    }
    if (e->datalen) {
        iov[n].iov_base = (void *)data;
        iov[n++].iov_len = (size_t)e->datalen;
    }
    put_all(iov, n);
}

/* ---- which files are ours -------------------------------------------------------------------- */

static int under_dir(const char *path) {
    return strncmp(path, dir, dirlen) == 0 && (path[dirlen] == '/' || path[dirlen] == '\0' ||
                                               path[dirlen] == ' ');
}

/* The path ``fd`` refers to, if it is under DIR (a removed file reads "... (deleted)"). */
static int fd_in_dir(int fd, uint64_t *ino, uint32_t *mode) {
    char link[64], target[PATH_MAX];
    if (fd < 0 || fd == trace_fd) return 0;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = syscall(SYS_readlink, link, target, sizeof target - 1);
    if (n <= 0) return 0;
    target[n] = 0;
    if (!under_dir(target)) return 0;
    struct stat st;
    if (fstat(fd, &st) != 0) return 0;
    *ino = (uint64_t)st.st_ino;
    *mode = (uint32_t)st.st_mode;
    return 1;
}

/* ``path`` relative to ``dirfd`` as an absolute path, in ``out``. */
static void resolve(int dirfd, const char *path, char *out) {
    if (path[0] == '/') {
        snprintf(out, PATH_MAX, "%s", path);
        return;
    }
    char base[PATH_MAX];
    if (dirfd == AT_FDCWD) {
        if (!getcwd(base, sizeof base)) base[0] = 0;
    } else {
        char link[64];
        snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
        ssize_t n = syscall(SYS_readlink, link, base, sizeof base - 1);
        base[n > 0 ? n : 0] = 0;
    }
    snprintf(out, PATH_MAX, "%s/%s", base, path);
}

/* ---- writable shared mappings ---------------------------------------------------------------- */

static void copy_words(uint8_t *dst, const uint8_t *src, size_t len) {
    /* 8-byte loads: a word another thread CASes meanwhile is copied whole, old or new. */
    for (size_t i = 0; i < len; i += 8)
        *(uint64_t *)(dst + i) = __atomic_load_n((const uint64_t *)(src + i), __ATOMIC_ACQUIRE);
}

static void snapshot_maps(void) {
    uint8_t page[PAGE];
    for (int i = 0; i < MAX_MAPS; i++) {
        struct mapping *m = &maps[i];
        if (!m->addr || !m->writable) continue;
        for (size_t off = 0; off < m->len; off += PAGE) {
            size_t n = m->len - off < PAGE ? m->len - off : PAGE;
            copy_words(page, m->addr + off, n);
            if (memcmp(page, m->shadow + off, n) == 0) continue;
            memcpy(m->shadow + off, page, n);
            struct ev e = {.type = EV_PAGE, .ino = m->ino, .a = m->off + (int64_t)off, .datalen = n};
            emit(&e, NULL, NULL, page);
        }
    }
}

static void drop_maps(uint8_t *lo, size_t len) {
    uint8_t *hi = lo + len;
    for (int i = 0; i < MAX_MAPS; i++) {
        struct mapping *m = &maps[i];
        if (!m->addr || m->addr >= hi || m->addr + m->len <= lo) continue;
        free(m->shadow);
        memset(m, 0, sizeof *m);
    }
}

static void add_map(uint8_t *addr, size_t len, uint64_t ino, int64_t off, int prot) {
    for (int i = 0; i < MAX_MAPS; i++) {
        struct mapping *m = &maps[i];
        if (m->addr) continue;
        m->addr = addr;
        m->len = (len + 7) & ~(size_t)7;
        m->ino = ino;
        m->off = off;
        m->writable = (prot & PROT_WRITE) != 0;
        if (m->writable) {
            /* The mapping shows the file as it is, and the trace already holds how it got so.
             * (A mapping is whole pages, so reading up to the next multiple of 8 stays inside.) */
            m->shadow = malloc(m->len);
            if (m->shadow) copy_words(m->shadow, addr, m->len);
            else m->writable = 0;
        }
        struct ev e = {.type = EV_MMAP, .ino = ino, .a = off, .b = (int64_t)len, .c = prot};
        emit(&e, NULL, NULL, NULL);
        return;
    }
}

/* ---- entry and exit of a logged call ----------------------------------------------------------- */

/* Callers have checked ``enabled`` and ``inside``; the mappings' changes so far come first. */
static void begin(void) {
    inside = 1;
    pthread_mutex_lock(&mu);
    snapshot_maps();
}

static void end(void) {
    pthread_mutex_unlock(&mu);
    inside = 0;
}

static void child_after_fork(void) {
    enabled = 0;
    pthread_mutex_init(&mu, NULL);
}

__attribute__((constructor)) static void crashrec_init(void) {
    const char *t = getenv("RINGQ_CRASHREC_TRACE");
    const char *d = getenv("RINGQ_CRASHREC_DIR");
    if (!t || !d || strlen(d) >= sizeof dir) return;
    snprintf(dir, sizeof dir, "%s", d);
    dirlen = strlen(dir);
    trace_fd = (int)syscall(SYS_openat, AT_FDCWD, t, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    unsetenv("RINGQ_CRASHREC_TRACE");
    unsetenv("RINGQ_CRASHREC_DIR");
    unsetenv("LD_PRELOAD");
    if (trace_fd < 0) return;
    pthread_atfork(NULL, NULL, child_after_fork);
    enabled = 1;
}

__attribute__((destructor)) static void crashrec_fini(void) {
    if (!enabled || inside) return;
    inside = 1;
    pthread_mutex_lock(&mu);
    snapshot_maps();
    struct ev e = {.type = EV_END};
    emit(&e, NULL, NULL, NULL);
    enabled = 0;
    pthread_mutex_unlock(&mu);
    inside = 0;
}

/* The workload's own marker, in order with the calls (exported for ctypes). */
void crashrec_note(const char *text, size_t len) {
    if (!enabled || inside) return;
    begin();
    struct ev e = {.type = EV_NOTE, .datalen = len};
    emit(&e, NULL, NULL, text);
    end();
}

/* ---- opens ----------------------------------------------------------------------------------- */

static int do_open(int dirfd, const char *path, int flags, mode_t mode, int at) {
    load_openat();
    load_open();
    char full[PATH_MAX];
    if (!enabled || inside || !(flags & (O_CREAT | O_TRUNC)))
        return at ? real_openat(dirfd, path, flags, mode) : real_open(path, flags, mode);
    resolve(at ? dirfd : AT_FDCWD, path, full);
    if (!under_dir(full)) return at ? real_openat(dirfd, path, flags, mode) : real_open(path, flags, mode);
    begin();
    struct stat st;
    int existed = fstatat(AT_FDCWD, full, &st, AT_SYMLINK_NOFOLLOW) == 0;
    int fd = at ? real_openat(dirfd, path, flags, mode) : real_open(path, flags, mode);
    int saved = errno;
    if (fd >= 0 && fstat(fd, &st) == 0) {
        struct ev e = {.type = EV_OPEN, .ino = (uint64_t)st.st_ino, .a = flags, .b = !existed,
                       .mode = (uint32_t)st.st_mode};
        emit(&e, full, NULL, NULL);
    }
    end();
    errno = saved;
    return fd;
}

static mode_t mode_arg(int flags, va_list ap) {
    return (flags & (O_CREAT | __O_TMPFILE)) ? (mode_t)va_arg(ap, int) : 0;
}

int open(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t m = mode_arg(flags, ap);
    va_end(ap);
    return do_open(AT_FDCWD, path, flags, m, 0);
}

int open64(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t m = mode_arg(flags, ap);
    va_end(ap);
    return do_open(AT_FDCWD, path, flags, m, 0);
}

int openat(int dirfd, const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t m = mode_arg(flags, ap);
    va_end(ap);
    return do_open(dirfd, path, flags, m, 1);
}

int openat64(int dirfd, const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t m = mode_arg(flags, ap);
    va_end(ap);
    return do_open(dirfd, path, flags, m, 1);
}

int creat(const char *path, mode_t mode) { return do_open(AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode, 0); }
int creat64(const char *path, mode_t mode) { return do_open(AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode, 0); }
int __open_2(const char *path, int flags) { return do_open(AT_FDCWD, path, flags, 0, 0); }
int __open64_2(const char *path, int flags) { return do_open(AT_FDCWD, path, flags, 0, 0); }
int __openat_2(int dirfd, const char *path, int flags) { return do_open(dirfd, path, flags, 0, 1); }
int __openat64_2(int dirfd, const char *path, int flags) { return do_open(dirfd, path, flags, 0, 1); }

/* ---- writes ---------------------------------------------------------------------------------- */

/* Log ``n`` bytes gathered from ``iov`` written at ``off`` of the file behind ``fd``. */
static void log_write(uint64_t ino, int64_t off, const struct iovec *iov, int cnt, size_t n) {
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) return;
    size_t done = 0;
    for (int i = 0; i < cnt && done < n; i++) {
        size_t k = iov[i].iov_len < n - done ? iov[i].iov_len : n - done;
        memcpy(buf + done, iov[i].iov_base, k);
        done += k;
    }
    struct ev e = {.type = EV_WRITE, .ino = ino, .a = off, .datalen = n};
    emit(&e, NULL, NULL, buf);
    free(buf);
}

/* Where a write without an offset lands: the file position, or the end for O_APPEND. */
static int64_t current_offset(int fd) {
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0 && (fl & O_APPEND)) {
        struct stat st;
        return fstat(fd, &st) == 0 ? (int64_t)st.st_size : 0;
    }
    return (int64_t)lseek(fd, 0, SEEK_CUR);
}

static ssize_t do_writev(int fd, const struct iovec *iov, int cnt, off_t off, int flags, int kind) {
    /* kind: 0 write/writev (file position), 1 pwrite/pwritev, 2 pwritev2 */
    uint64_t ino;
    uint32_t mode;
    load_writev();
    load_pwritev();
    load_pwritev2();
    if (!enabled || inside || !fd_in_dir(fd, &ino, &mode)) goto plain;
    begin();
    int64_t at = kind == 0 || (kind == 2 && off == -1) ? current_offset(fd) : (int64_t)off;
    ssize_t r = kind == 0 ? real_writev(fd, iov, cnt)
                : kind == 1 ? real_pwritev(fd, iov, cnt, off)
                            : real_pwritev2(fd, iov, cnt, off, flags);
    int saved = errno;
    if (r > 0) log_write(ino, at, iov, cnt, (size_t)r);
    if (r >= 0 && kind == 2 && (flags & (RWF_DSYNC | RWF_SYNC))) {
        struct ev e = {.type = EV_FSYNC, .ino = ino, .a = 1, .mode = mode};
        emit(&e, NULL, NULL, NULL);
    }
    end();
    errno = saved;
    return r;
plain:
    return kind == 0 ? real_writev(fd, iov, cnt)
           : kind == 1 ? real_pwritev(fd, iov, cnt, off)
                       : real_pwritev2(fd, iov, cnt, off, flags);
}

ssize_t write(int fd, const void *buf, size_t n) {
    uint64_t ino;
    uint32_t mode;
    load_write();
    if (!enabled || inside || !fd_in_dir(fd, &ino, &mode)) return real_write(fd, buf, n);
    struct iovec v = {(void *)buf, n};
    return do_writev(fd, &v, 1, 0, 0, 0);
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) {
    uint64_t ino;
    uint32_t mode;
    load_pwrite();
    if (!enabled || inside || !fd_in_dir(fd, &ino, &mode)) return real_pwrite(fd, buf, n, off);
    struct iovec v = {(void *)buf, n};
    return do_writev(fd, &v, 1, off, 0, 1);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off) { return pwrite(fd, buf, n, off); }
ssize_t writev(int fd, const struct iovec *iov, int cnt) { return do_writev(fd, iov, cnt, 0, 0, 0); }
ssize_t pwritev(int fd, const struct iovec *iov, int cnt, off_t off) { return do_writev(fd, iov, cnt, off, 0, 1); }
ssize_t pwritev64(int fd, const struct iovec *iov, int cnt, off_t off) { return do_writev(fd, iov, cnt, off, 0, 1); }
ssize_t pwritev2(int fd, const struct iovec *iov, int cnt, off_t off, int fl) { return do_writev(fd, iov, cnt, off, fl, 2); }
ssize_t pwritev64v2(int fd, const struct iovec *iov, int cnt, off_t off, int fl) { return do_writev(fd, iov, cnt, off, fl, 2); }

/* ---- size and allocation --------------------------------------------------------------------- */

int ftruncate(int fd, off_t len) {
    uint64_t ino;
    uint32_t mode;
    load_ftruncate();
    if (!enabled || inside || !fd_in_dir(fd, &ino, &mode)) return real_ftruncate(fd, len);
    begin();
    int r = real_ftruncate(fd, len);
    int saved = errno;
    if (r == 0) {
        struct ev e = {.type = EV_TRUNCATE, .ino = ino, .a = (int64_t)len};
        emit(&e, NULL, NULL, NULL);
    }
    end();
    errno = saved;
    return r;
}

int ftruncate64(int fd, off_t len) { return ftruncate(fd, len); }

static int do_fallocate(int fd, int mode, off_t off, off_t len, int posix) {
    uint64_t ino;
    uint32_t st_mode;
    load_fallocate();
    load_posix_fallocate();
    if (!enabled || inside || !fd_in_dir(fd, &ino, &st_mode))
        return posix ? real_posix_fallocate(fd, off, len) : real_fallocate(fd, mode, off, len);
    begin();
    int r = posix ? real_posix_fallocate(fd, off, len) : real_fallocate(fd, mode, off, len);
    int saved = errno;
    if (r == 0) {
        struct ev e = {.type = EV_FALLOCATE, .ino = ino, .a = mode, .b = (int64_t)off, .c = (int64_t)len};
        emit(&e, NULL, NULL, NULL);
    }
    end();
    errno = saved;
    return r;
}

int fallocate(int fd, int mode, off_t off, off_t len) { return do_fallocate(fd, mode, off, len, 0); }
int fallocate64(int fd, int mode, off_t off, off_t len) { return do_fallocate(fd, mode, off, len, 0); }
int posix_fallocate(int fd, off_t off, off_t len) { return do_fallocate(fd, 0, off, len, 1); }
int posix_fallocate64(int fd, off_t off, off_t len) { return do_fallocate(fd, 0, off, len, 1); }

/* ---- syncs ----------------------------------------------------------------------------------- */

static int do_fsync(int fd, int data) {
    uint64_t ino;
    uint32_t mode;
    load_fsync();
    load_fdatasync();
    if (!enabled || inside || !fd_in_dir(fd, &ino, &mode)) return data ? real_fdatasync(fd) : real_fsync(fd);
    begin();
    int r = data ? real_fdatasync(fd) : real_fsync(fd);
    int saved = errno;
    if (r == 0) {
        struct ev e = {.type = EV_FSYNC, .ino = ino, .a = data, .mode = mode};
        emit(&e, NULL, NULL, NULL);
    }
    end();
    errno = saved;
    return r;
}

int fsync(int fd) { return do_fsync(fd, 0); }
int fdatasync(int fd) { return do_fsync(fd, 1); }

int msync(void *addr, size_t len, int flags) {
    load_msync();
    if (!enabled || inside) return real_msync(addr, len, flags);
    begin();
    int r = real_msync(addr, len, flags);
    int saved = errno;
    if (r == 0) {
        uint8_t *lo = addr, *hi = (uint8_t *)addr + len;
        for (int i = 0; i < MAX_MAPS; i++) {
            struct mapping *m = &maps[i];
            if (!m->addr || m->addr >= hi || m->addr + m->len <= lo) continue;
            uint8_t *s = lo > m->addr ? lo : m->addr;
            uint8_t *t = hi < m->addr + m->len ? hi : m->addr + m->len;
            struct ev e = {.type = EV_MSYNC, .ino = m->ino, .a = m->off + (s - m->addr),
                           .b = m->off + (t - m->addr), .c = flags};
            emit(&e, NULL, NULL, NULL);
        }
    }
    end();
    errno = saved;
    return r;
}

/* ---- names ----------------------------------------------------------------------------------- */

static int do_names(int type, int fd1, const char *p1, int fd2, const char *p2, int r_of_call(void *), void *ctx) {
    char a[PATH_MAX], b[PATH_MAX];
    if (!enabled || inside) return r_of_call(ctx);
    resolve(fd1, p1, a);
    if (p2) resolve(fd2, p2, b);
    if (!under_dir(a) && !(p2 && under_dir(b))) return r_of_call(ctx);
    begin();
    int r = r_of_call(ctx);
    int saved = errno;
    if (r == 0) {
        struct ev e = {.type = (uint32_t)type};
        if (type == EV_MKDIR) {
            struct stat st;
            if (fstatat(AT_FDCWD, a, &st, AT_SYMLINK_NOFOLLOW) == 0) e.ino = (uint64_t)st.st_ino;
        }
        emit(&e, a, p2 ? b : NULL, NULL);
    }
    end();
    errno = saved;
    return r;
}

struct call2 {
    int fd1, fd2, flags;
    const char *p1, *p2;
    unsigned int uflags;
    mode_t mode;
};

static int call_rename(void *c) { struct call2 *x = c; load_rename(); return real_rename(x->p1, x->p2); }
static int call_renameat(void *c) { struct call2 *x = c; load_renameat(); return real_renameat(x->fd1, x->p1, x->fd2, x->p2); }
static int call_renameat2(void *c) { struct call2 *x = c; load_renameat2(); return real_renameat2(x->fd1, x->p1, x->fd2, x->p2, x->uflags); }
static int call_link(void *c) { struct call2 *x = c; load_link(); return real_link(x->p1, x->p2); }
static int call_linkat(void *c) { struct call2 *x = c; load_linkat(); return real_linkat(x->fd1, x->p1, x->fd2, x->p2, x->flags); }
static int call_unlink(void *c) { struct call2 *x = c; load_unlink(); return real_unlink(x->p1); }
static int call_unlinkat(void *c) { struct call2 *x = c; load_unlinkat(); return real_unlinkat(x->fd1, x->p1, x->flags); }
static int call_mkdir(void *c) { struct call2 *x = c; load_mkdir(); return real_mkdir(x->p1, x->mode); }
static int call_mkdirat(void *c) { struct call2 *x = c; load_mkdirat(); return real_mkdirat(x->fd1, x->p1, x->mode); }

int rename(const char *a, const char *b) {
    struct call2 c = {.fd1 = AT_FDCWD, .fd2 = AT_FDCWD, .p1 = a, .p2 = b};
    return do_names(EV_RENAME, AT_FDCWD, a, AT_FDCWD, b, call_rename, &c);
}
int renameat(int fa, const char *a, int fb, const char *b) {
    struct call2 c = {.fd1 = fa, .fd2 = fb, .p1 = a, .p2 = b};
    return do_names(EV_RENAME, fa, a, fb, b, call_renameat, &c);
}
int renameat2(int fa, const char *a, int fb, const char *b, unsigned int fl) {
    struct call2 c = {.fd1 = fa, .fd2 = fb, .p1 = a, .p2 = b, .uflags = fl};
    return do_names(EV_RENAME, fa, a, fb, b, call_renameat2, &c);
}
int link(const char *a, const char *b) {
    struct call2 c = {.p1 = a, .p2 = b};
    return do_names(EV_LINK, AT_FDCWD, a, AT_FDCWD, b, call_link, &c);
}
int linkat(int fa, const char *a, int fb, const char *b, int fl) {
    struct call2 c = {.fd1 = fa, .fd2 = fb, .p1 = a, .p2 = b, .flags = fl};
    return do_names(EV_LINK, fa, a, fb, b, call_linkat, &c);
}
int unlink(const char *a) {
    struct call2 c = {.p1 = a};
    return do_names(EV_UNLINK, AT_FDCWD, a, AT_FDCWD, NULL, call_unlink, &c);
}
int unlinkat(int fa, const char *a, int fl) {
    struct call2 c = {.fd1 = fa, .p1 = a, .flags = fl};
    return do_names(EV_UNLINK, fa, a, AT_FDCWD, NULL, call_unlinkat, &c);
}
int mkdir(const char *a, mode_t m) {
    struct call2 c = {.p1 = a, .mode = m};
    return do_names(EV_MKDIR, AT_FDCWD, a, AT_FDCWD, NULL, call_mkdir, &c);
}
int mkdirat(int fa, const char *a, mode_t m) {
    struct call2 c = {.fd1 = fa, .p1 = a, .mode = m};
    return do_names(EV_MKDIR, fa, a, AT_FDCWD, NULL, call_mkdirat, &c);
}

/* ---- mappings -------------------------------------------------------------------------------- */

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    uint64_t ino;
    uint32_t mode;
    load_mmap();
    /* Private and anonymous mappings that replace nothing (the allocator's arenas) pass at once. */
    if (!enabled || inside || (!(flags & MAP_FIXED) && (fd < 0 || !(flags & MAP_SHARED))))
        return real_mmap(addr, len, prot, flags, fd, off);
    begin();
    if (flags & MAP_FIXED) drop_maps(addr, len);
    void *p = real_mmap(addr, len, prot, flags, fd, off);
    int saved = errno;
    if (p != MAP_FAILED && (flags & MAP_SHARED) && !(flags & MAP_ANONYMOUS) && fd_in_dir(fd, &ino, &mode))
        add_map(p, len, ino, (int64_t)off, prot);
    end();
    errno = saved;
    return p;
}

void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    return mmap(addr, len, prot, flags, fd, off);
}

int munmap(void *addr, size_t len) {
    load_munmap();
    if (!enabled || inside) return real_munmap(addr, len);
    /* Under the mutex, so that no other thread's snapshot reads the pages as they go. */
    inside = 1;
    pthread_mutex_lock(&mu);
    uint8_t *lo = addr;
    for (int i = 0; i < MAX_MAPS; i++)
        if (maps[i].addr && maps[i].addr < lo + len && maps[i].addr + maps[i].len > lo) {
            snapshot_maps();
            break;
        }
    drop_maps(addr, len);
    int r = real_munmap(addr, len);
    int saved = errno;
    end();
    errno = saved;
    return r;
}
