"""The benchmark harness: durability strategies, the physical limit and peer queues, in one run.

``ringq bench`` (``main(argv)``) runs the short version; ``benchmarks/run.py`` the full one
(``--full``); ``--smoke`` runs tiny sizes in a few seconds (tests/test_bench_smoke.py).  Every run
prints a Markdown table, writes every figure and the environment to ``results.json`` in ``--out``
and, if matplotlib is installed, PNG plots next to it.

Methodology (also in docs/benchmarks.md): every scenario runs in this one process or in fresh
child processes, in one scratch directory on one file system (``--dir``); the physical limit (a
raw ``pwrite`` of a small record into a preallocated file + ``fdatasync``) is measured at the
start and again at the end of the run, and every durable throughput is also given as a ratio to
its mean.  Latencies are per call, ``time.perf_counter_ns`` around the call.  Peers are driven
through their own public APIs with the same payloads; a peer that is not installed is skipped
with a line saying so.
"""

from .driver import main
from .harness import FLOOR, MMAP_STORE, Row, Sizes

__all__ = ["main", "FLOOR", "MMAP_STORE", "Row", "Sizes"]
