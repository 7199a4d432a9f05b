"""Self-check: which NCCL-ABI libraries pycoll finds on this machine.

``python -m pycoll.info`` (or :func:`show_versions`) prints, for "nccl", "rccl", "host" and
``$PYCOLL_NCCL_LIBRARY`` when set: whether the library was found, its path, kind, version and the
declared NCCL functions it lacks. A library that is absent is reported in one line, never with a
traceback; the exit status is 0 either way.
"""

from __future__ import annotations

import platform
import sys
import textwrap
from typing import Any, Dict, List, Optional, TextIO

from .. import _settings

__all__ = ["probe", "probe_all", "show_versions", "main"]

SPECS = ("nccl", "rccl", "host")


def probe(spec: str) -> Dict[str, Any]:
    """Try to load one library; never raises.

    Returns a dict with ``spec``, ``found`` (bool), and either ``path``, ``kind``, ``version``
    (the code), ``version_string`` and ``missing`` (declared functions the library lacks, each
    with the NCCL release that introduced it), or ``error`` (what was tried).
    """
    try:
        from pycoll._bindings import _nccl
    except ImportError as exc:
        return {"spec": spec, "found": False, "error": f"the pycoll bindings are not built: {exc}"}
    try:
        lib = _nccl.load(spec)
    except Exception as exc:  # LibraryError, or anything a broken install throws
        return {"spec": spec, "found": False, "error": str(exc) or type(exc).__name__}
    major, minor, patch = lib.version_tuple
    return {
        "spec": spec,
        "found": True,
        "path": lib.path,
        "kind": lib.kind,
        "version": lib.version,
        "version_string": f"{major}.{minor}.{patch}",
        "missing": {name: _nccl.FUNCTIONS[name] for name in lib.missing},
    }


def probe_all() -> List[Dict[str, Any]]:
    """:func:`probe` for "nccl", "rccl", "host" and ``$PYCOLL_NCCL_LIBRARY`` when set."""
    specs: List[str] = list(SPECS)
    env = _settings.explicit("PYCOLL_NCCL_LIBRARY")
    if env and env not in specs:
        specs.append(env)
    return [probe(spec) for spec in specs]


def _header() -> List[str]:
    import pycoll

    lines = [f"pycoll {pycoll.__version__}"]
    try:
        from pycoll._bindings import _nccl

        major, minor, patch = _nccl.version_tuple(_nccl.HEADER_VERSION)
        lines.append(f"bindings: NCCL {major}.{minor}.{patch} API, {len(_nccl.FUNCTIONS)} functions declared")
    except ImportError as exc:
        lines.append(f"bindings: not built ({exc})")
    lines.append(f"python {platform.python_version()} ({sys.executable}), {platform.system()} {platform.machine()}")
    env = _settings.explicit("PYCOLL_NCCL_LIBRARY")
    lines.append(f"PYCOLL_NCCL_LIBRARY: {env if env else '(not set)'}")
    return lines


def _describe(info: Dict[str, Any]) -> List[str]:
    label = info["spec"]
    if label not in SPECS:
        label = f"$PYCOLL_NCCL_LIBRARY={label}"
    if not info["found"]:
        return [f"{label}: not found", *textwrap.wrap(info["error"], 100, initial_indent="    ",
                                                          subsequent_indent="    ")]
    lines = [
        f"{label}: found",
        f"    path     {info['path']}",
        f"    kind     {info['kind']}",
        f"    version  {info['version_string']} ({info['version']})",
    ]
    missing = info["missing"]
    if not missing:
        lines.append("    lacks    nothing pycoll declares")
    else:
        text = ", ".join(f"{name} ({release})" for name, release in missing.items())
        wrapped = textwrap.wrap(text, 100, initial_indent="             ", subsequent_indent="             ")
        lines.append(f"    lacks    {len(missing)} declared functions:")
        lines.extend(wrapped)
    return lines


def show_versions(file: Optional[TextIO] = None) -> None:
    """Print pycoll's and the libraries' versions and capabilities (to stdout by default)."""
    out = sys.stdout if file is None else file
    lines = _header()
    for info in probe_all():
        lines.append("")
        lines.extend(_describe(info))
    out.write("\n".join(lines) + "\n")


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``python -m pycoll.info``: 0 (whatever it found), 2 for arguments (it takes none but --help)."""
    import argparse

    argparse.ArgumentParser(prog="python -m pycoll.info", description=__doc__.split("\n\n")[0].split("\n")[0]
                            ).parse_args(sys.argv[1:] if argv is None else argv)
    show_versions()
    return 0


if __name__ == "__main__":
    sys.exit(main())
