"""The GPU tests' hook: a failure's traceback is written when the test ends, not with the summary at the
end of the run, so that a crash of the whole process (a segfault inside a GPU library) still leaves the
tracebacks of every earlier failure in the log (benchmarks/gpu_check.sh keeps that log)."""

from __future__ import annotations

from typing import Any

_config: Any = None


def pytest_configure(config: Any) -> None:
    global _config
    _config = config


def pytest_runtest_logreport(report: Any) -> None:
    terminal = _config.pluginmanager.getplugin("terminalreporter") if _config is not None else None
    if report.failed and terminal is not None:
        terminal.write_line("")
        terminal.write_sep("!", f"{report.nodeid} failed ({report.when})")
        terminal.write_line(report.longreprtext)
        terminal.flush()
