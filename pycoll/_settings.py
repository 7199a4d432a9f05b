"""Reading pycoll's ``PYCOLL_*`` environment variables (an unset or empty variable gives the default)."""

from __future__ import annotations

import os


def env_seconds(name: str, default: float, *, positive: bool = True) -> float:
    """A duration in seconds: > 0 (``positive``) or >= 0; ValueError naming the variable otherwise."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"${name} must be a number of seconds, got {raw!r}") from None
    if not (value > 0 if positive else value >= 0):
        raise ValueError(f"${name} must be {'> 0' if positive else '>= 0'} seconds, got {raw!r}")
    return value


def env_int(name: str, default: int, lo: int = 0) -> int:
    """An integer >= ``lo``; ValueError naming the variable otherwise."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"${name} must be an integer, got {raw!r}") from None
    if value < lo:
        raise ValueError(f"${name} must be >= {lo}, got {value}")
    return value


def env_bool(name: str, default: bool) -> bool:
    """A switch: 1/true/yes/on or 0/false/no/off."""
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"${name} must be 0 or 1, got {raw!r}")
