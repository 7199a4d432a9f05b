"""Alias of :mod:`pycoll.tools.bench` (pycoll-bench), kept so that ``python -m pycoll.bench`` and imports work.

Assigning one of the names below here (as a test's monkeypatch does) also assigns it in the module of
:mod:`pycoll.tools.bench` that defines and uses it.
"""

import sys

if __name__ == "__main__":
    from pycoll.tools.bench.cli import main

    sys.exit(main())

import types

from .tools.bench import __all__, arrays, cases, cli, report, runner, spec  # noqa: F401

_OWNERS = {
    spec: ("COLLECTIVES", "DTYPES", "REDOPS", "CollSpec", "DType", "parse_size", "format_size", "size_steps",
           "EXIT_OK", "EXIT_WRONG", "EXIT_USAGE", "EXIT_FAILED", "MODES", "_collectives", "_pick", "_size_plan",
           "_element_count"),
    arrays: ("_ArrayLib", "_NumpyKit", "_TorchKit", "_CupyKit", "_make_kit"),
    cases: ("Case", "build_case", "_pattern", "_reduce_ref", "_count_wrong", "_exact_sums", "_layout"),
    runner: ("Measurement", "measure", "_Runner", "_comm_call", "_raw_call"),
    report: ("write_plot", "_Reporter", "_TableReporter", "_EventReporter"),
    cli: ("main", "_parser", "_check_args", "_run_rank", "_launch"),
}
_OWNER_OF = {name: module for module, names in _OWNERS.items() for name in names}
globals().update({name: getattr(module, name) for name, module in _OWNER_OF.items()})


class _Alias(types.ModuleType):
    def __setattr__(self, name: str, value: object) -> None:
        owner = _OWNER_OF.get(name)
        if owner is not None:
            setattr(owner, name, value)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Alias
