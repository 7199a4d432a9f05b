"""Settings: every PYCOLL_* variable is read in one module, validated there, and documented in README."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
from helpers import REPO

import pycoll
from pycoll import _bindings as B, _settings
from pycoll.errors import LibraryError
from pycoll.launch import discovery

ROOT = REPO


def _readme_table():
    text = open(os.path.join(ROOT, "README.md")).read()
    table = text[text.index("## Environment variables"):]
    table = table[: table.index("\n## ", 5)]
    rows = {}
    for line in table.splitlines():
        if not line.startswith("| `PYCOLL_"):
            continue
        names_cell, meaning = line.split("|")[1:3]
        for name in re.findall(r"`(PYCOLL_[A-Z_]+)`", names_cell):
            rows[name] = meaning.strip()
    return rows


def test_readme_lists_every_setting_with_its_default():
    rows = _readme_table()
    for name, s in _settings.SETTINGS.items():
        assert name in rows, f"README's environment table lacks {name}"
        if s.default is not None and not isinstance(s.default, bool):
            default = f"{s.default:g}" if isinstance(s.default, float) else str(s.default)
            assert default in rows[name], f"README gives {name} another default than {default!r}: {rows[name]!r}"


def test_readme_lists_nothing_unknown():
    launcher = {v for k, v in vars(discovery).items() if k.startswith("ENV_")}
    unknown = set(_readme_table()) - set(_settings.SETTINGS) - launcher  # the host library's are validated too
    assert not unknown, f"README documents variables nothing reads: {sorted(unknown)}"


def test_readme_names_every_logger_and_no_other():
    text = open(os.path.join(ROOT, "README.md")).read()
    para = text[text.index("**Logging.**"):]
    para = para[: para.index("\n\n")]
    documented = set(re.findall(r"`(pycoll(?:\.[a-z_]+)?)`", para)) - {"pycoll"}
    used = set()
    for root, _, files in os.walk(os.path.join(ROOT, "pycoll")):
        for f in files:
            if f.endswith((".py", ".pyx")):
                source = open(os.path.join(root, f)).read()
                used |= set(re.findall(r"""getLogger\(\s*["'](pycoll\.[a-z_]+)["']""", source))
    assert used and documented == used, (sorted(documented - used), sorted(used - documented))


def test_no_module_reads_a_setting_itself():
    """Only _settings reads PYCOLL_* configuration; the launcher's per-rank contract lives in launch/."""
    offenders = []
    pkg = os.path.join(ROOT, "pycoll")
    pattern = re.compile(r"""(environ\.get|getenv|environ\[)\(?\s*["'](PYCOLL_[A-Z_]+)""")
    for root, _, files in os.walk(pkg):
        for f in files:
            if not f.endswith(".py") or f == "_settings.py":
                continue
            path = os.path.join(root, f)
            for i, line in enumerate(open(path), 1):
                for _, name in pattern.findall(line):
                    if name in _settings.SETTINGS:
                        offenders.append(f"{os.path.relpath(path, ROOT)}:{i}: {name}")
    assert not offenders, "settings read outside pycoll._settings:\n" + "\n".join(offenders)


@pytest.mark.parametrize("raw", ["inf", "-inf", "nan", "0", "-1", "soon", "1e999", "1e-400", "-1e-400", "1e-310"])
def test_every_duration_setting_refuses_what_is_no_deadline(raw):
    for name, s in _settings.SETTINGS.items():
        if s.kind != "seconds" or (raw == "0" and s.minimum == 0):
            continue
        with pytest.raises(ValueError, match=re.escape(f"${name}")):
            s.read({name: raw})


def test_values_are_parsed_and_bounded():
    get = _settings.get
    assert get("PYCOLL_TIMEOUT", {}) == 30.0 and get("PYCOLL_TIMEOUT", {"PYCOLL_TIMEOUT": " 2.5 "}) == 2.5
    assert get("PYCOLL_WATCHDOG", {"PYCOLL_WATCHDOG": "off"}) is False
    assert get("PYCOLL_FR_BUFFER_SIZE", {"PYCOLL_FR_BUFFER_SIZE": "0"}) == 0
    with pytest.raises(ValueError, match=r"\$PYCOLL_FR_BUFFER_SIZE must be <= "):
        get("PYCOLL_FR_BUFFER_SIZE", {"PYCOLL_FR_BUFFER_SIZE": str(10**12)})
    with pytest.raises(ValueError, match=r"\$PYCOLL_ON_FAILURE must be one of abort, revoke, report"):
        get("PYCOLL_ON_FAILURE", {"PYCOLL_ON_FAILURE": "explode"})
    with pytest.raises(ValueError, match=r"\$PYCOLL_WATCHDOG must be 0 or 1"):
        get("PYCOLL_WATCHDOG", {"PYCOLL_WATCHDOG": "maybe"})
    with pytest.raises(TypeError, match="timeout must be a number of seconds"):
        _settings.seconds(True, "timeout")
    with pytest.raises(ValueError, match="timeout must be a finite number of seconds"):
        _settings.seconds(float("inf"), "timeout")


def test_bounds_are_said_exactly_and_zero_written_as_zero_is_zero():
    # the limits were printed with :g ("must be <= 1.67772e+07, got 16777217"), and 1e-400, which C's strtod
    # refuses (ERANGE: the host library failed the init with its own text), read as 0 ("for ever")
    for name, raw, text in (("PYCOLL_HOST_STREAM_DEPTH", "16777217", "must be <= 16777216, got 16777217"),
                            ("PYCOLL_HOST_ONESHOT_MAX", "1073741825", "must be <= 1073741824, got 1073741825"),
                            ("PYCOLL_HOST_INIT_TIMEOUT", "10000000.5", "must be <= 10000000 seconds, got 10000000.5"),
                            ("PYCOLL_HOST_INIT_TIMEOUT", "1e-400",
                             "must be a number of seconds, got '1e-400' (too small to represent)")):
        with pytest.raises(ValueError, match=re.escape(f"${name} {text}")):
            _settings.get(name, {name: raw})
    for raw in ("0", "0.000", "0e5", "00"):
        assert _settings.get("PYCOLL_HOST_INIT_TIMEOUT", {"PYCOLL_HOST_INIT_TIMEOUT": raw}) == 0


def test_a_huge_duration_is_refused_naming_the_variable():
    # finite, but past what threads, sockets and clocks can wait for: an OverflowError in a thread before
    with pytest.raises(ValueError, match=r"\$PYCOLL_WATCHDOG_PUBLISH_INTERVAL must be at most 1e\+09 seconds"):
        _settings.get("PYCOLL_WATCHDOG_PUBLISH_INTERVAL", {"PYCOLL_WATCHDOG_PUBLISH_INTERVAL": "1e30"})
    with pytest.raises(ValueError, match="timeout must be at most 1e"):
        _settings.seconds(1e30, "timeout")
    assert _settings.seconds(_settings.MAX_SECONDS, "timeout") == _settings.MAX_SECONDS
    with pytest.raises(ValueError, match=r"got 1000000001\.0$"):  # not rounded to the limit (it said "got 1e+09")
        _settings.seconds(_settings.MAX_SECONDS + 1, "timeout")


def test_every_variable_is_checked_as_a_communicator_is_made(monkeypatch, tmp_path):
    # PYCOLL_ABORT_TIMEOUT is first read when a failure comes: a bad value must not wait for one (it then replaced
    # the failure itself with this ValueError)
    for name, raw in (("PYCOLL_ABORT_TIMEOUT", "abc"), ("PYCOLL_HOST_SPREAD", "2"), ("PYCOLL_HOST_IDLE_DEAD", "x")):
        check = _settings.check_host_library if name.startswith("PYCOLL_HOST_") else _settings.check_all
        with pytest.raises(ValueError, match=rf"\${name} must be"):
            check({name: raw})
        monkeypatch.setenv(name, raw)
        with pytest.raises(ValueError, match=rf"\${name} must be"):
            pycoll.init(0, 1, backend="host")
        monkeypatch.delenv(name)
    # every other way a communicator is made checks them too (init_all's aborts raised the ValueError instead of
    # the failure, and a communicator adopted from a handle could not be aborted)
    lib = pycoll.bindings.load("host")
    handle = lib.comm_init_all(1, [0])[0]
    monkeypatch.setenv("PYCOLL_ABORT_TIMEOUT", "abc")
    for make in (lambda: pycoll.init_all(1, backend="host"), lambda: pycoll.from_handle(handle, library=lib),
                 lambda: pycoll.Communicator.from_handle(handle, library=lib, timeout=5.0)):
        with pytest.raises(ValueError, match=r"\$PYCOLL_ABORT_TIMEOUT must be"):
            make()
    monkeypatch.delenv("PYCOLL_ABORT_TIMEOUT")
    lib.comm_abort(handle)
    # a dump folder that is a file: every dump failed, with a log line only
    (tmp_path / "afile").write_text("")
    monkeypatch.setenv("PYCOLL_FR_DUMP_DIR", str(tmp_path / "afile"))
    with pytest.raises(ValueError, match=r"\$PYCOLL_FR_DUMP_DIR names .*afile', which is not a folder"):
        pycoll.init(0, 1, backend="host")
    monkeypatch.setenv("PYCOLL_FR_DUMP_DIR", str(tmp_path / "afile" / "fr" / "run"))  # under the file: the same
    with pytest.raises(ValueError, match=r"\$PYCOLL_FR_DUMP_DIR names .*run', under .*afile', which is not a folder"):
        pycoll.init(0, 1, backend="host")
    monkeypatch.setenv("PYCOLL_FR_DUMP_DIR", str(tmp_path / "new" / "fr"))  # not there yet: made at the first dump
    pycoll.init(0, 1, backend="host").destroy()
    monkeypatch.delenv("PYCOLL_FR_DUMP_DIR")
    # the same folder given to the recorder or to a dump: accepted, and then every dump failed with a log line only
    # (a manual dump returned []); a number was a bare TypeError
    from pycoll.diagnostics.recorder import FlightRecorder

    rec = FlightRecorder(4)
    for call in (lambda d: rec.configure(dump_dir=d), lambda d: pycoll.dump_flight_recorder("t", dump_dir=d)):
        with pytest.raises(ValueError, match=r"dump_dir names .*afile', which is not a folder"):
            call(str(tmp_path / "afile"))
        with pytest.raises(TypeError, match=r"dump_dir must be a folder's path \(a str or os.PathLike\), got 5"):
            call(5)
    rec.configure(dump_dir=tmp_path / "fr")
    assert rec.dump_dir == str(tmp_path / "fr")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # '~' is the home folder, as the check reads it
    rec.configure(dump_dir="~/fr")
    assert rec.dump_dir == str(tmp_path / "home" / "fr")
    # a text setting with a rule of its own (the dump file prefix: the rank follows it)
    monkeypatch.setenv("PYCOLL_FR_FILE_PREFIX", "rank0")
    with pytest.raises(ValueError, match=r"\$PYCOLL_FR_FILE_PREFIX must be a non-empty file name not ending in a "):
        pycoll.init(0, 1, backend="host")


def test_bad_failpoints_do_not_break_the_import_but_are_named_where_settings_are_checked(tmp_path):
    # a test-only variable: importing pycoll with a typo in it must work (a tool that only imports pycoll), while a
    # communicator's creation and pycoll-run refuse it, naming the entry
    env = {**os.environ, "PYCOLL_FAILPOINTS": "abc"}
    code = ("import pycoll, pycoll.failpoints as fp\nassert not fp._points\n"
            "try:\n    pycoll.init(0, 1, backend='host')\nexcept ValueError as e:\n    print('refused:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "refused: $PYCOLL_FAILPOINTS: 'abc' is not NAME=ACTION" in out.stdout
    script = tmp_path / "rank.py"
    script.write_text("print('ran')\n")
    out = subprocess.run([sys.executable, "-m", "pycoll.launch.launcher", "-n", "1", str(script)], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "ran" not in out.stdout
    assert "$PYCOLL_FAILPOINTS: 'abc' is not NAME=ACTION" in out.stderr
    with pytest.raises(ValueError, match=r"\$PYCOLL_FAILPOINTS: 'x=explode'"):
        _settings.check_all({"PYCOLL_FAILPOINTS": "x=explode"})


def test_a_library_named_by_the_variable_is_said_to_come_from_it(monkeypatch, tmp_path):
    monkeypatch.setenv("PYCOLL_NCCL_LIBRARY", str(tmp_path / "libmissing.so"))
    with pytest.raises(LibraryError, match=r"^\$PYCOLL_NCCL_LIBRARY='.*libmissing\.so': "):
        B.load()


@pytest.mark.parametrize("kw,exc,text", [
    ({"on_failure": "explode"}, ValueError, "on_failure must be one of"),
    ({"global_ranks": [0, 0]}, ValueError, "global_ranks must be distinct ints"),
    ({"global_ranks": "ab"}, TypeError, "global_ranks must be a sequence of ints"),
    ({"generation": -1}, ValueError, "generation must be an int >= 0"),
    ({"failure_callbacks": [5]}, TypeError, "failure_callbacks must be callables"),
    ({"failure_callbacks": 5}, TypeError, r"failure_callbacks must be a sequence \(a list or tuple\) of callables"),
    ({"failure_callbacks": print}, TypeError, r"failure_callbacks must be a sequence .* \(one: \[...\]\)"),
    ({"failure_callbacks": iter([print])}, TypeError, "failure_callbacks must be a sequence"),
    ({"config": {"blocking": True}}, TypeError, "config must be a pycoll.CommConfig"),
    ({"give_up": 5}, TypeError, "give_up must be a callable"),
])
def test_what_the_communicator_keeps_is_refused_before_the_collective_init(kw, exc, text):
    # refused after the init had made the communicator (its peers then had one whose member never took part); rank 1
    # never comes here: refused at once, not after the init's timeout
    t0 = time.monotonic()
    with pytest.raises(exc, match=text):
        pycoll.init(0, 2, unique_id=pycoll.get_unique_id(backend="host"), backend="host", init_timeout=2, **kw)
    assert time.monotonic() - t0 < 1.0


def test_arguments_named_in_their_errors(monkeypatch, caplog):
    uid = pycoll.get_unique_id(backend="host")
    for name in (None, 123, ""):  # a str of the wrong value is a ValueError
        with pytest.raises(ValueError if name == "" else TypeError, match="name must be a non-empty str"):
            pycoll.init(0, 1, unique_id=uid, backend="host", name=name)
    c = pycoll.init(0, 1, unique_id=uid, backend="host")
    try:
        with pytest.raises(TypeError, match=r"shrink: exclude must be a sequence of ranks, got 3 \(one rank: \[3\]\)"):
            c.shrink(3)  # "'int' object is not iterable"
        # refused before split's exchange of colors (they were refused after it, each having used it up)
        seq = c.progress().coll_enqueued
        for kw, text in (({"color": 1 << 31}, "color must be below 2\\*\\*31"),
                         ({"color": 0, "key": -(1 << 40)}, "key must fit NCCL's int")):
            with pytest.raises(ValueError, match=text):
                c.split(**kw)
        assert c.progress().coll_enqueued == seq
        assert c.split(pycoll.bindings.SPLIT_NOCOLOR) is None  # NCCL's spelling of None
    finally:
        c.destroy()
    # NCCL reads it with atoi: '01' and '+1' make it blocking as '1' does, and the warning says so
    for value in ("01", "+1", " 1x"):
        monkeypatch.setenv("NCCL_COMM_BLOCKING", value)
        caplog.clear()
        with caplog.at_level("WARNING", logger="pycoll"):
            pycoll.init(0, 1, unique_id=pycoll.get_unique_id(backend="host"), backend="host").destroy()
        assert any("makes every NCCL call block" in r.getMessage() for r in caplog.records), value
    # ... and applies 0 or 1 only: 2 was said to make every call block, which it does not
    for value in ("2", "-1"):
        monkeypatch.setenv("NCCL_COMM_BLOCKING", value)
        caplog.clear()
        with caplog.at_level("WARNING", logger="pycoll"):
            pycoll.init(0, 1, unique_id=pycoll.get_unique_id(backend="host"), backend="host").destroy()
        assert [r.getMessage() for r in caplog.records if "NCCL_COMM_BLOCKING" in r.getMessage()] == [
            f"NCCL_COMM_BLOCKING={value!r} is ignored (the library applies 0 or 1 only)"], value


def test_init_uses_the_library_the_variable_names(monkeypatch, tmp_path):
    """init() went on to the backend's own library (the wheel's NCCL), silently, whatever the variable named."""
    import shutil

    from pycoll import create

    copy = tmp_path / "libmyhost.so"
    shutil.copy(B.load("host").path, copy)
    monkeypatch.delenv("PYCOLL_BACKEND", raising=False)
    monkeypatch.setenv("PYCOLL_NCCL_LIBRARY", str(copy))
    backend, lib = create.load_library("auto")
    assert (backend, lib.path) == ("host", str(copy))
    assert create.load_library("host")[1].path == str(copy)
    with pytest.raises(ValueError, match=r"PYCOLL_NCCL_LIBRARY='.*libmyhost.so' is a host library, but the backend "
                                         r"asked for is 'nccl'"):
        create.load_library("nccl")
    monkeypatch.setenv("PYCOLL_NCCL_LIBRARY", str(tmp_path / "libmissing.so"))
    with pytest.raises(LibraryError, match=r"^\$PYCOLL_NCCL_LIBRARY='.*libmissing\.so': "):
        pycoll.init(0, 1)
