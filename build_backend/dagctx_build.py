"""The build backend: setuptools, with an editable install that is a plain ``.pth``.

The ``dagctx`` namespace has four portions (``protocol/``, ``daemon/``, ``cli/``,
``clients/python/``). For such a layout setuptools' editable wheel installs an import
hook (a meta-path finder appended *after* the path finder), which static tools cannot
follow and which a ``dagctx/`` folder in the current directory shadows. Listing the
four source roots in a ``.pth`` file instead puts them on ``sys.path`` like any
installed package: regular subpackages then always win over a stray namespace folder.
Regular (non-editable) wheels and sdists are setuptools' own, unchanged.
"""

from __future__ import annotations

import base64
import hashlib
import os
import zipfile
from pathlib import Path

from setuptools import build_meta as _setuptools
from setuptools.build_meta import (  # noqa: F401  (the PEP 517/660 hooks we do not change)
    build_sdist,
    build_wheel,
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)

#: The source roots, each holding one portion of the ``dagctx`` namespace package.
SOURCE_ROOTS = ("protocol", "daemon", "cli", "clients/python")


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """Build setuptools' editable wheel, then swap its finder hook for a static ``.pth``."""
    name = _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
    path = Path(wheel_directory, name)
    project = Path.cwd().resolve()
    pth = "".join(f"{project / root}\n" for root in SOURCE_ROOTS).encode()
    with zipfile.ZipFile(path) as src:
        items = [(info, src.read(info)) for info in src.infolist()]
    kept: list[tuple[str, bytes]] = []
    record_name = ""
    for info, data in items:
        base = os.path.basename(info.filename)
        if info.filename.endswith(".dist-info/RECORD"):
            record_name = info.filename
            continue
        if base.startswith("__editable__") and (base.endswith("_finder.py") or base.endswith(".pth")):
            continue  # setuptools' hook and the .pth that installs it
        kept.append((info.filename, data))
    kept.append(("__editable__.dagctx.pth", pth))
    record = "".join(_record_line(n, d) + "\n" for n, d in kept) + f"{record_name},,\n"
    tmp = path.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        for n, d in kept:
            dst.writestr(n, d)
        dst.writestr(record_name, record)
    os.replace(tmp, path)
    return name
