"""The compiled parts: commitlog._native, the leader's record builder and the scrubber's record walk in C, and
protocol._native, the remoting codec's JSON header reader. Optional: where they do not build, commitlog.records,
commitlog.scrub_walk and protocol.codec use their Python twins (the references the C ones are tested against)."""

from setuptools import Extension, setup

_FLAGS = ["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"]

setup(ext_modules=[Extension("commitlog._native", ["commitlog/_native.c"], optional=True, extra_compile_args=_FLAGS),
                   Extension("protocol._native", ["protocol/_native.c"], optional=True, extra_compile_args=_FLAGS)])
