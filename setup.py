"""The one compiled part: commitlog._native, the leader's record builder in C. Optional: where it does not
build, commitlog.records uses its Python builder (the reference the C one is tested against)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("commitlog._native", ["commitlog/_native.c"], optional=True,
                             extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"])])
