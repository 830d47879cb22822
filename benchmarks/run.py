"""The full benchmark run of docs/benchmarks.md: ``python benchmarks/run.py [ringq bench options]``.

A thin wrapper over ``ringq.bench.main(["--full", ...])`` that works from a source checkout
(without installing ringq) and writes into ``benchmarks/out/`` (git-ignored) by default.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from ringq.bench import main  # noqa: E402

if __name__ == "__main__":
    argv = sys.argv[1:]
    if not any(a in ("--smoke", "--full") for a in argv):
        argv = ["--full", *argv]
    if "--out" not in argv:
        argv += ["--out", os.path.join(HERE, "out")]
    sys.exit(main(argv))
