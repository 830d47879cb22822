# The cffi hook and the CPython extensions live here; everything else is declared in
# pyproject.toml.
import importlib.util
import pathlib

from setuptools import Extension, setup

_spec = importlib.util.spec_from_file_location(
    "_build_native", pathlib.Path(__file__).parent / "ringq" / "engine" / "_build_native.py"
)
native = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(native)

setup(
    cffi_modules=["ringq/engine/_build_native.py:ffibuilder"],
    ext_modules=[
        # The Job objects of a run of jobs leased in C (csrc/ext/jobs.c): cffi's helper cannot
        # make Python objects.  The helper's flags (RINGQ_CFLAGS for a sanitizer build).
        Extension(
            "ringq.engine._jobs",
            sources=["csrc/ext/jobs.c"],
            include_dirs=["csrc"],
            extra_compile_args=native.COMPILE_ARGS,
            extra_link_args=native.LINK_ARGS,
        ),
        # The queue lock's context manager and the writer lock's entry and exit, with no bytecode
        # between taking a lock and returning (csrc/ext/guard.c): a signal handler's exception
        # cannot leave either held.
        Extension(
            "ringq.engine._guard",
            sources=["csrc/ext/guard.c"],
            include_dirs=["csrc"],
            extra_compile_args=native.COMPILE_ARGS,
            extra_link_args=native.LINK_ARGS,
        ),
    ],
)
