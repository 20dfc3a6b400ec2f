"""Build hook for the one compiled part: the Kineto chunk scanner (traceql/ingest/_kscan.c).

Everything else is in pyproject.toml. The extension is optional: where no C compiler is available the build goes on
without it and traceql reads Kineto traces with its pure-Python path (msgspec), which gives the same tables, slower.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "traceql.ingest._kscan",
            ["traceql/ingest/_kscan.c"],
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        )
    ]
)
