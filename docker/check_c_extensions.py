"""Image build check: every package and every C extension of the source tree imports.

``python check_c_extensions.py SRC`` reads the package map of ``SRC/pyproject.toml``
(``[tool.setuptools] package-dir``, or ``packages.find.where``), imports every package,
then finds every ``*.c`` file under each package directory that defines a module
(``PyInit_<name>``) and imports the extension module built from it
(``server/canal_server/parse/_rowcodec.c`` -> ``canal_server.parse._rowcodec``).
setup.py builds the extensions as optional, so without this check a missing compiler
gives an image that silently runs the pure-Python row decoder. Run it from a directory
outside SRC, with the interpreter that has the packages installed. Exit 0 when all
import, 1 naming each failure, 2 on bad usage.
"""

from __future__ import annotations

import importlib
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

__all__ = ["c_extension_modules", "main", "package_dirs"]


def package_dirs(src: Path) -> dict[str, Path]:
    """Top-level import package -> its directory, as pyproject.toml maps them."""
    tool: dict[str, Any] = tomllib.loads((src / "pyproject.toml").read_text())
    setuptools = tool.get("tool", {}).get("setuptools", {})
    mapping = setuptools.get("package-dir") or {}
    if mapping:
        return {name: src / path for name, path in mapping.items() if name}
    packages = setuptools.get("packages")
    where = packages.get("find", {}).get("where", ["."]) if isinstance(packages, dict) else []
    found: dict[str, Path] = {}
    for root in where:
        for init in sorted((src / root).glob("*/__init__.py")):
            found[init.parent.name] = init.parent
    return found


def c_extension_modules(src: Path) -> list[tuple[str, Path]]:
    """(module name, C source) for every ``*.c`` file under the package directories that
    defines a module (its ``PyInit_<name>``); other C files are parts of one of those."""
    modules = []
    for package, directory in sorted(package_dirs(src).items()):
        for source in sorted(directory.rglob("*.c")):
            init = re.search(r"\bPyInit_(\w+)\s*\(", source.read_text(errors="replace"))
            if init is None:
                continue
            parts = source.relative_to(directory).parent.parts
            modules.append((".".join((package, *parts, init.group(1))), source))
    return modules


def _try_import(name: str) -> str | None:
    """The error of ``import name``, or None when it imports."""
    try:
        module = importlib.import_module(name)
    except Exception as exc:  # any failure to import is what this check reports
        return f"{type(exc).__name__}: {exc}"
    print(f"ok  {name}  ({getattr(module, '__file__', '?')})")
    return None


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not (Path(argv[0]) / "pyproject.toml").is_file():
        print("usage: check_c_extensions.py SRC  (SRC holds pyproject.toml)", file=sys.stderr)
        return 2
    src = Path(argv[0]).resolve()
    failures = []
    for package in sorted(package_dirs(src)):
        if (error := _try_import(package)) is not None:
            failures.append(f"package {package} does not import: {error}")
    extensions = c_extension_modules(src)
    if not extensions:
        failures.append(f"no C sources under the packages of {src}: nothing to check")
    for name, source in extensions:
        if (error := _try_import(name)) is not None:
            where = source.relative_to(src)
            failures.append(f"C extension {name} (from {where}) was not built: {error}")
    for failure in failures:
        print(f"check_c_extensions: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
