"""Build of the compiled record codec (tidewire.records._speedups, Cython).

Everything else about the package is declared in pyproject.toml. The extension is optional:
on a machine without a C compiler (or without Python's headers, or without Cython when the
build is not isolated) the build goes on without it and tidewire runs its pure-Python twin
(``tidewire --version`` and tidewire.records.IMPLEMENTATION say which one runs).
"""

from __future__ import annotations

from setuptools import Extension, setup

SPEEDUPS = Extension(
    "tidewire.records._speedups", ["src/tidewire/records/_speedups.pyx"], optional=True
)


def extensions() -> list[Extension]:
    try:
        from Cython.Build import cythonize  # noqa: PLC0415 (optional, see the docstring)
    except ImportError:
        print("tidewire: Cython is missing, installing the pure-Python record codec only")
        return []
    built: list[Extension] = cythonize([SPEEDUPS], language_level=3)
    for ext in built:
        ext.optional = True  # cythonize() returns new Extensions, without this flag
    return built


setup(ext_modules=extensions())
