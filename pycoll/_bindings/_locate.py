"""Where to find an NCCL-ABI library: the search policy behind :func:`pycoll._bindings.load`.

Pure Python (no extension needed, so it can be imported and tested on its own). It only decides
what to try, in which order; opening a candidate is the extension's job.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable, Iterable, Iterator

from pycoll import _settings
from pycoll.errors import LibraryError

__all__ = [
    "ENV_VAR",
    "HOST_LIBRARY",
    "KEYWORDS",
    "Nothing",
    "already_loaded",
    "candidates",
    "normalize_spec",
    "pathfinder_nccl",
    "wheel_nccl_paths",
]

#: The keywords load() resolves by searching; anything else is one path or linker name.
KEYWORDS = ("nccl", "rccl", "host")

#: The environment variable load(None) reads (default "nccl").
ENV_VAR = "PYCOLL_NCCL_LIBRARY"

#: The host library's file, built next to the bindings (pycoll/_bindings/).
HOST_LIBRARY = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "libpycoll_host.so"
)


class Nothing(str):
    """A candidate that is not there: the str says why (e.g. "not installed")."""


Target = str | Callable[[], str] | Nothing


def normalize_spec(spec: object) -> str:
    """load()'s argument as a non-empty str: None -> $PYCOLL_NCCL_LIBRARY or "nccl"; paths and bytes decoded."""
    if spec is None:
        spec = _settings.get(ENV_VAR)
    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if isinstance(spec, bytes):
        spec = os.fsdecode(spec)
    if not isinstance(spec, str):
        raise TypeError(f"spec must be a str or path, not {type(spec).__name__}")
    if not spec:
        raise ValueError("spec must not be empty")
    return spec


def already_loaded(prefix: str, loaded_objects: Iterable[str]) -> list[str]:
    """The loaded objects whose file name starts with ``prefix`` (e.g. "libnccl.so")."""
    return [p for p in loaded_objects if os.path.basename(p).startswith(prefix)]


def pathfinder_nccl() -> str:
    """libnccl of the nvidia-nccl wheel, found (and loaded) by cuda.pathfinder; LibraryError if not."""
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib
    except ImportError:
        raise LibraryError("cuda.pathfinder is not installed") from None
    try:
        return load_nvidia_dynamic_lib("nccl").abs_path
    except Exception as exc:  # its own DynamicLibNotFoundError, or anything else it raises
        raise LibraryError(f"cuda.pathfinder: {type(exc).__name__}: {exc}") from None


def wheel_nccl_paths() -> list[str]:
    """lib/libnccl.so.2 of every nvidia.nccl package directory found (import system, then sys.path)."""
    dirs: list[str] = []
    try:
        spec = importlib.util.find_spec("nvidia.nccl")
        if spec is not None and spec.submodule_search_locations:
            dirs.extend(spec.submodule_search_locations)
    except (ImportError, ValueError):
        pass
    dirs.extend(os.path.join(p, "nvidia", "nccl") for p in sys.path if p)
    seen: list[str] = []
    for d in dirs:
        candidate = os.path.join(d, "lib", "libnccl.so.2")
        if candidate not in seen and os.path.exists(candidate):
            seen.append(candidate)
    return seen


def _or_nothing(label: str, paths: list[str], why: str) -> Iterator[tuple[str, Target]]:
    if paths:
        yield from ((label, p) for p in paths)
    else:
        yield (label, Nothing(why))


def candidates(
    spec: str, loaded_objects: Iterable[str] = ()
) -> Iterator[tuple[str, Target]]:
    """(label, target) pairs to try in order for a keyword ``spec``.

    ``target`` is a path or linker name, a callable returning one (it may raise LibraryError), or
    a :class:`Nothing` saying why there is nothing to try; ``loaded_objects`` are the paths of
    the shared objects already in the process.
    """
    loaded_objects = list(loaded_objects)
    if spec == "nccl":
        yield from _or_nothing(
            "already loaded", already_loaded("libnccl.so", loaded_objects), "none"
        )
        yield ("cuda.pathfinder", pathfinder_nccl)
        yield from _or_nothing("nvidia-nccl wheel", wheel_nccl_paths(), "not installed")
        yield ("system", "libnccl.so.2")
    elif spec == "rccl":
        yield from _or_nothing(
            "already loaded", already_loaded("librccl.so", loaded_objects), "none"
        )
        yield ("system", "librccl.so.1")
        roots = [os.environ.get("ROCM_PATH"), "/opt/rocm"]
        for root in dict.fromkeys(r for r in roots if r):
            yield (f"{root}/lib", os.path.join(root, "lib", "librccl.so.1"))
    elif spec == "host":
        yield ("pycoll", HOST_LIBRARY)
