"""The one compiled part: commitlog._native, the leader's record builder and the scrubber's record walk in C.
Optional: where it does not build, commitlog.records and commitlog.scrub_walk use their Python twins (the
references the C ones are tested against)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("commitlog._native", ["commitlog/_native.c"], optional=True,
                             extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"])])
