# Only the cffi hook lives here; everything else is declared in pyproject.toml.
from setuptools import setup

setup(cffi_modules=["ringq/engine/_build_native.py:ffibuilder"])
