"""Builds the optional C row decoder; the project metadata is in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "canal_server.parse._rowcodec",
            ["server/canal_server/parse/_rowcodec.c"],
            optional=True,
            extra_compile_args=["-O2"],
        )
    ]
)
