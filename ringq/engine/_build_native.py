"""cffi build script for ``ringq.engine._native`` (API / out-of-line mode).

``pip install .`` runs this through setuptools' ``cffi_modules`` hook; ``python
ringq/engine/_build_native.py`` builds in place for development.  Set ``RINGQ_CFLAGS`` to add compiler
flags (the sanitizer test build uses ``-fsanitize=address,undefined``).
"""

import os
import pathlib
import re
import shlex

from cffi import FFI

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]  # the project: csrc/ beside ringq/
CSRC = ROOT / "csrc"

HEADER = CSRC / "ringq.h"
_DEFINE = re.compile(r"^#define\s+(RINGQ_[A-Z0-9_]+)\s+\S")


def cdef_from_header(text: str) -> str:
    """The cffi ``cdef`` for ``csrc/ringq.h``, derived from the header itself so that the two can
    never disagree: each ``#define RINGQ_X value`` becomes ``#define RINGQ_X ...`` (cffi takes the
    value from the compiled header), other preprocessor lines (guards, includes) are dropped, and
    the declarations (types, prototypes) are kept as written."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    out = []
    for line in text.splitlines():
        m = _DEFINE.match(line.strip())
        if m:
            out.append(f"#define {m.group(1)} ...")
        elif not line.lstrip().startswith("#"):
            out.append(line)
    return "\n".join(out)


# Every C file of the helper (ringq.c: atomics, futex, CRC, records; one file per operation family
# besides it); ringq_internal.h holds what they share.
SOURCES = sorted(os.path.relpath(p) for p in CSRC.glob("*.c"))

CDEF = cdef_from_header(HEADER.read_text(encoding="utf-8"))

# The compiler and linker flags of every C file of the package (this helper, and the job builder
# of setup.py); RINGQ_CFLAGS and RINGQ_LDFLAGS add to them.
COMPILE_ARGS = [
    "-std=gnu11",
    "-O2",
    "-Wall",
    "-Wextra",
    *shlex.split(os.environ.get("RINGQ_CFLAGS", "")),
]
LINK_ARGS = shlex.split(os.environ.get("RINGQ_LDFLAGS", ""))

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "ringq.engine._native",
    '#include "ringq.h"',
    sources=SOURCES,
    include_dirs=[os.path.relpath(CSRC)],
    extra_compile_args=COMPILE_ARGS,
    extra_link_args=LINK_ARGS,
)

if __name__ == "__main__":
    os.chdir(ROOT)
    ffibuilder.compile(verbose=True)
