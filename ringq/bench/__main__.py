"""``python -m ringq.bench``: the benchmark harness (see ringq/bench/__init__.py)."""

import sys

from . import main

sys.exit(main(sys.argv[1:]))
