"""Build of the compiled record codec (tidewire.records._speedups, Cython).

Everything else about the package is declared in pyproject.toml. The extension is optional:
on a machine without a C compiler the build goes on without it and tidewire runs its
pure-Python twin (tidewire.records.IMPLEMENTATION says which one runs).
"""

from __future__ import annotations

from Cython.Build import cythonize
from setuptools import Extension, setup

setup(
    ext_modules=cythonize(
        [
            Extension(
                "tidewire.records._speedups",
                ["src/tidewire/records/_speedups.pyx"],
                optional=True,
            )
        ],
        language_level=3,
    ),
)
