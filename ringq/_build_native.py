"""cffi build script for ``ringq._native`` (API / out-of-line mode).

``pip install .`` runs this through setuptools' ``cffi_modules`` hook; ``python
ringq/_build_native.py`` builds in place for development.  Set ``RINGQ_CFLAGS`` to add compiler
flags (the sanitizer test build uses ``-fsanitize=address,undefined``).
"""

import os
import pathlib
import shlex

from cffi import FFI

HERE = pathlib.Path(__file__).resolve().parent
CSRC = HERE.parent / "csrc"

CDEF = """
#define RINGQ_EBOUNDS ...
#define RINGQ_EALIGN ...
#define RINGQ_EINVAL ...
#define RINGQ_ECORRUPT ...
#define RINGQ_ENOFUTEX ...
#define RINGQ_REC_MAGIC ...
#define RINGQ_REC_HEADER ...
#define RINGQ_STATE_ENTRY ...
#define RINGQ_ST_EMPTY ...
#define RINGQ_ST_READY ...
#define RINGQ_ST_LEASED ...
#define RINGQ_ST_DONE ...
#define RINGQ_ST_DEAD ...
#define RINGQ_ST_GONE ...
#define RINGQ_ST_CONT ...
#define RINGQ_ST_BAD ...
#define RINGQ_WHY_NONE ...
#define RINGQ_WHY_EXPIRED ...
#define RINGQ_WHY_DIED ...
#define RINGQ_WHY_PURGED ...

typedef struct {
    uint64_t seg_seq;
    uint64_t state_off;
    uint64_t data_off;
    uint32_t slot_size;
    uint32_t slot_count;
} ringq_geom;

typedef struct {
    uint32_t slot;
    uint32_t span;
    int32_t  status;
    int32_t  priority;
    uint64_t seq;
    int64_t  enqueued_us;
    int64_t  available_ms;
    uint64_t supersedes;
    uint64_t state;
    uint32_t record_len;
    uint32_t payload_len;
    uint16_t max_attempts;
    uint16_t attempts_before;
    uint16_t id_len;
    uint8_t  codec;
    uint8_t  kind;
} ringq_rec_info;

uint32_t ringq_crc32c(uint32_t crc, const uint8_t *buf, size_t len);
uint32_t ringq_crc32c_sw(uint32_t crc, const uint8_t *buf, size_t len);
uint32_t ringq_crc32c_hw(uint32_t crc, const uint8_t *buf, size_t len);
int ringq_crc32c_hw_available(void);

int ringq_load64(const uint8_t *base, size_t maplen, size_t off, uint64_t *out);
int ringq_store64(uint8_t *base, size_t maplen, size_t off, uint64_t value);
int ringq_cas64(uint8_t *base, size_t maplen, size_t off, uint64_t expected, uint64_t desired,
                uint64_t *actual);
int ringq_fetch_add64(uint8_t *base, size_t maplen, size_t off, uint64_t delta, uint64_t *prev);
int ringq_load32(const uint8_t *base, size_t maplen, size_t off, uint32_t *out);
int ringq_store32(uint8_t *base, size_t maplen, size_t off, uint32_t value);
int ringq_cas32(uint8_t *base, size_t maplen, size_t off, uint32_t expected, uint32_t desired,
                uint32_t *actual);
int ringq_fetch_add32(uint8_t *base, size_t maplen, size_t off, uint32_t delta, uint32_t *prev);

int ringq_futex_wait(uint8_t *base, size_t maplen, size_t off, uint32_t expected, int64_t timeout_ns);
int ringq_futex_wake(uint8_t *base, size_t maplen, size_t off, int n);
int ringq_futex_available(void);

int ringq_msync(uint8_t *base, size_t maplen, size_t off, size_t len);

int ringq_owner_trylock(int fd, uint32_t idx);
int ringq_owner_unlock(int fd, uint32_t idx);
int ringq_owner_probe(int fd, uint32_t idx);

int ringq_rec_write(uint8_t *base, size_t maplen, const ringq_geom *g, uint32_t slot,
                    const uint8_t *rec, uint32_t len, uint64_t state);
int ringq_rec_check(const uint8_t *base, size_t maplen, const ringq_geom *g, uint32_t slot,
                    ringq_rec_info *out);
int ringq_seg_scan(const uint8_t *base, size_t maplen, const ringq_geom *g, uint32_t from, uint32_t to,
                   ringq_rec_info *out, uint32_t cap, uint32_t *next);
int ringq_next_ready(const uint8_t *base, size_t maplen, const ringq_geom *g, const uint32_t *order,
                     uint32_t n, uint32_t start, uint64_t *state);
"""

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "ringq._native",
    '#include "ringq.h"',
    sources=[os.path.relpath(CSRC / "ringq.c")],
    include_dirs=[os.path.relpath(CSRC)],
    extra_compile_args=["-std=gnu11", "-O2", "-Wall", "-Wextra", *shlex.split(os.environ.get("RINGQ_CFLAGS", ""))],
    extra_link_args=shlex.split(os.environ.get("RINGQ_LDFLAGS", "")),
)

if __name__ == "__main__":
    os.chdir(HERE.parent)
    ffibuilder.compile(verbose=True)
