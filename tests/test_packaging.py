"""Every file slotkit reads at run time ships in its wheel."""

from __future__ import annotations

import fnmatch
import sys
from pathlib import Path

import pytest

# tomllib is in the standard library from Python 3.11 on.
tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "slotkit"


def _package_data() -> dict[str, list[str]]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    return dict(config["tool"]["setuptools"]["package-data"])


def _data_files() -> list[Path]:
    """Files under slotkit/ that setuptools does not pick up as modules."""
    return [
        path
        for path in PACKAGE.rglob("*")
        if path.is_file() and path.suffix not in {".py", ".pyc"} and "__pycache__" not in path.parts
    ]


def test_every_data_file_is_declared_as_package_data() -> None:
    """A wheel built without script.lua crawled nothing with THROTTLING_REDIS_URL set."""
    declared = _package_data()
    missing = []
    for path in _data_files():
        package = ".".join(path.parent.relative_to(REPO).parts)
        patterns = declared.get(package, [])
        if not any(fnmatch.fnmatch(path.name, pattern) for pattern in patterns):
            missing.append(str(path.relative_to(REPO)))
    assert not missing, f"not in [tool.setuptools.package-data]: {missing}"


def test_the_shared_script_is_among_them() -> None:
    assert (PACKAGE / "shared" / "script.lua") in _data_files()
