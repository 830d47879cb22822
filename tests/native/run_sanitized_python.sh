#!/usr/bin/env bash
# Run pytest files against a copy of ringq whose C helper is built with ASan + UBSan.
#
#   bash tests/native/run_sanitized_python.sh [pytest args...]     (default: the test_crash_* files)
#
# The build goes to a temporary directory (the in-place build and site-packages are untouched).
# ASan must be the first library loaded, so the runtime is LD_PRELOADed into python; leak
# detection is off because the interpreter itself never frees everything.  Manual, not in CI: it
# is several times slower.  CI runs the standalone C harness instead (test_native_sanitized.py).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="$(mktemp -d /tmp/ringq-asan.XXXXXX)"
trap 'rm -rf "$build"' EXIT
cp -r "$root/ringq" "$root/csrc" "$build/"
rm -f "$build"/ringq/engine/_native*.so
(cd "$build" && RINGQ_CFLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
    RINGQ_LDFLAGS="-fsanitize=address,undefined" python ringq/engine/_build_native.py >build.log 2>&1) \
    || { cat "$build/build.log"; exit 1; }
if [ $# -eq 0 ]; then set -- "$root"/tests/test_crash_*.py; fi
cd /tmp  # not the checkout: its in-place build must not shadow the sanitized one
LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)" \
ASAN_OPTIONS=detect_leaks=0 PYTHONPATH="$build" \
    python -m pytest -p no:cacheprovider --rootdir "$root" -c "$root/pyproject.toml" "$@"
