"""Builds the optional C extensions (a pure-Python path exists for each); the project
metadata is in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "canal_server.parse._rowcodec",
            ["server/canal_server/parse/_rowcodec.c"],
            optional=True,
            extra_compile_args=["-O2"],
        ),
        Extension(
            "canal_server.canal._canalcodec",
            ["server/canal_server/canal/_canalcodec.c", "server/canal_server/canal/_canaltext.c"],
            depends=["server/canal_server/canal/_canalcodec.h"],
            optional=True,
            extra_compile_args=["-O2"],
        ),
    ]
)
