"""Config, CollConfig, UniqueId and the constants of the bindings (no library calls needed)."""

from __future__ import annotations

import ctypes
import pickle

import numpy as np
import pytest

from pycoll._bindings import _nccl

pytestmark = pytest.mark.timeout(60)

INT_MIN = -(2**31)

# research note §1.4: (field, offset) of ncclConfig_t 2.32.3 on x86_64
CONFIG_OFFSETS = [
    ("size", 0), ("magic", 8), ("version", 12), ("blocking", 16), ("cgaClusterSize", 20),
    ("minCTAs", 24), ("maxCTAs", 28), ("netName", 32), ("splitShare", 40), ("trafficClass", 44),
    ("commName", 48), ("collnetEnable", 56), ("CTAPolicy", 60), ("shrinkShare", 64),
    ("nvlsCTAs", 68), ("nChannelsPerNetPeer", 72), ("nvlinkCentricSched", 76),
    ("graphUsageMode", 80), ("numRmaCtx", 84), ("maxP2pPeers", 88), ("graphStreamOrdering", 92),
    ("launchOrderImplicit", 96), ("numRmaSig", 100), ("rmaEagerInit", 104), ("hostCftMode", 108),
    ("nvlsHostMode", 112),
]
STRING_FIELDS = {"netName", "commName"}
HEADER_FIELDS = {"size", "magic", "version"}
INT_FIELDS = [f for f, _ in CONFIG_OFFSETS if f not in STRING_FIELDS | HEADER_FIELDS]


def _read(address, offset, field):
    if field == "size":
        return ctypes.c_size_t.from_address(address + offset).value
    if field in ("magic", "version"):
        return ctypes.c_uint.from_address(address + offset).value
    if field in STRING_FIELDS:
        p = ctypes.c_void_p.from_address(address + offset).value
        return None if p is None else ctypes.string_at(p).decode()
    return ctypes.c_int.from_address(address + offset).value


# --- constants -------------------------------------------------------------------------------
def test_constants():
    assert _nccl.SUCCESS == 0 and _nccl.IN_PROGRESS == 7
    assert _nccl.UNIQUE_ID_BYTES == 128 and _nccl.SPLIT_NOCOLOR == -1
    assert (_nccl.SHRINK_DEFAULT, _nccl.SHRINK_ABORT, _nccl.REVOKE_DEFAULT, _nccl.SUSPEND_MEM) == (0, 1, 0, 1)
    assert _nccl.CONFIG_UNDEF_INT == INT_MIN and _nccl.API_MAGIC == 0xCAFEBEEF
    assert _nccl.HEADER_VERSION == 23203 and _nccl.CONFIG_SIZE == 120
    assert (_nccl.WIN_DEFAULT, _nccl.WIN_COLL_SYMMETRIC, _nccl.WIN_STRICT_ORDERING, _nccl.WIN_GIN_ONLY,
            _nccl.WIN_CFT_COUNTED, _nccl.WIN_REQUIRED_ALIGNMENT) == (0, 1, 2, 4, 8, 4096)
    assert (_nccl.CTA_POLICY_DEFAULT, _nccl.CTA_POLICY_EFFICIENCY, _nccl.CTA_POLICY_ZERO) == (0, 1, 2)
    assert [int(r) for r in _nccl.Result] == list(range(9))
    assert [int(d) for d in _nccl.DataType] == list(range(12))
    assert _nccl.DataType.Bfloat16 == 9 and _nccl.DataType.Float8e5m2 == 11
    assert [int(o) for o in _nccl.RedOp] == list(range(5))
    assert (_nccl.ScalarResidence.Device, _nccl.ScalarResidence.HostImmediate) == (0, 1)
    assert [int(s) for s in _nccl.CommMemStat] == [0, 1, 2, 3]


def test_functions_table_covers_the_symbol_table():
    # every function in the C symbol table has a release, and the table lists nothing else
    assert len(_nccl.FUNCTIONS) == 97  # every nccl* export of libnccl 2.32.3 (tests/bindings/test_exports.py)
    assert _nccl.FUNCTIONS["ncclCommShrink"] == "2.27"
    assert _nccl.FUNCTIONS["ncclCommRevoke"] == "2.28.7"
    assert _nccl.FUNCTIONS["ncclCommInitRankConfig"] == "2.14"
    assert _nccl.FUNCTIONS["ncclAllReduceConfig"] == "2.31"
    assert all(name.startswith("nccl") for name in _nccl.FUNCTIONS)
    assert set(_nccl.RCCL_FUNCTIONS).isdisjoint(_nccl.FUNCTIONS)
    assert all(name.startswith("pycoll") for name in _nccl.HOST_FUNCTIONS)


@pytest.mark.parametrize(
    "code, expected",
    [(23203, (2, 32, 3)), (22703, (2, 27, 3)), (21403, (2, 14, 3)), (2804, (2, 8, 4)), (2708, (2, 7, 8)),
     (20900, (2, 9, 0))],
)
def test_version_tuple(code, expected):
    assert _nccl.version_tuple(code) == expected


# --- Config ----------------------------------------------------------------------------------
def test_config_defaults_equal_the_initializer():
    cfg = _nccl.Config()
    assert cfg.size == 120 and cfg.magic == 0xCAFEBEEF and cfg.version == 23203
    for name in INT_FIELDS:
        assert getattr(cfg, name) == INT_MIN, name
    assert cfg.netName is None and cfg.commName is None
    assert tuple(f for f, _ in CONFIG_OFFSETS) == cfg.FIELDS
    # the raw bytes: exactly what NCCL_CONFIG_INITIALIZER produces (4 bytes of tail padding)
    raw = ctypes.string_at(cfg.address, 120)
    expected = (120).to_bytes(8, "little") + (0xCAFEBEEF).to_bytes(4, "little") + (23203).to_bytes(4, "little")
    assert raw[:16] == expected
    for field, offset in CONFIG_OFFSETS:
        assert _read(cfg.address, offset, field) == getattr(cfg, field), field
        if field in STRING_FIELDS:
            assert raw[offset:offset + 8] == bytes(8)
        elif field not in HEADER_FIELDS:
            assert raw[offset:offset + 4] == INT_MIN.to_bytes(4, "little", signed=True)


def test_config_every_field_round_trips_through_memory():
    cfg = _nccl.Config()
    values = {}
    for i, (field, _offset) in enumerate(CONFIG_OFFSETS):
        if field in STRING_FIELDS:
            value = f"{field}-value"
        elif field == "size":
            value = 96
        elif field in ("magic", "version"):
            value = 0xFFFFFFFF - i
        else:
            value = 1000 + i
        setattr(cfg, field, value)
        values[field] = value
    for field, offset in CONFIG_OFFSETS:
        assert getattr(cfg, field) == values[field], field
        assert _read(cfg.address, offset, field) == values[field], field
    assert cfg.to_dict() == values
    for name in INT_FIELDS:
        setattr(cfg, name, INT_MIN)
        assert getattr(cfg, name) == INT_MIN
        setattr(cfg, name, 2**31 - 1)
        assert getattr(cfg, name) == 2**31 - 1


def test_config_strings_are_kept_alive_and_cleared():
    cfg = _nccl.Config(commName="x" * 1000, netName=b"Socket")
    import gc

    gc.collect()
    assert _read(cfg.address, 48, "commName") == "x" * 1000
    assert cfg.netName == "Socket"
    cfg.commName = None
    assert cfg.commName is None and _read(cfg.address, 48, "commName") is None
    cfg.commName = "héllo"
    assert cfg.commName == "héllo"


def test_config_keywords_copy_dict_pickle_repr():
    cfg = _nccl.Config(blocking=0, splitShare=1, commName="a")
    assert cfg.blocking == 0 and cfg.splitShare == 1 and cfg.commName == "a"
    other = cfg.copy()
    assert other == cfg and other.address != cfg.address
    other.blocking = 1
    assert cfg.blocking == 0 and other != cfg
    back = pickle.loads(pickle.dumps(cfg))
    assert back == cfg and back.commName == "a"
    assert repr(_nccl.Config()) == "Config()"
    assert "blocking=0" in repr(cfg) and "commName='a'" in repr(cfg)
    with pytest.raises(TypeError):
        hash(cfg)


@pytest.mark.parametrize(
    "kwargs, exc, text",
    [
        ({"blocking": 2**31}, ValueError, "Config.blocking"),
        ({"blocking": INT_MIN - 1}, ValueError, "Config.blocking"),
        ({"blocking": "0"}, TypeError, "Config.blocking"),
        ({"blocking": 1.0}, TypeError, "Config.blocking"),
        ({"blocking": None}, TypeError, "Config.blocking"),
        ({"commName": 5}, TypeError, "Config.commName"),
        ({"netName": "a\0b"}, ValueError, "NUL"),
        ({"magic": -1}, ValueError, "Config.magic"),
        ({"version": 2**32}, ValueError, "Config.version"),
        ({"size": -1}, ValueError, "Config.size"),
        ({"nosuchfield": 1}, TypeError, "nosuchfield"),
    ],
)
def test_config_bad_values(kwargs, exc, text):
    with pytest.raises(exc, match=text):
        _nccl.Config(**kwargs)


# --- UniqueId --------------------------------------------------------------------------------
def test_unique_id_value_semantics():
    data = bytes(range(128))
    a = _nccl.UniqueId(data)
    b = _nccl.UniqueId.from_bytes(bytearray(data))
    assert bytes(a) == data and len(bytes(a)) == 128
    assert a == b and hash(a) == hash(b) and not (a != b)  # noqa: SIM202 -- exercises __ne__ on purpose
    assert a != _nccl.UniqueId() and bytes(_nccl.UniqueId()) == bytes(128)
    assert pickle.loads(pickle.dumps(a)) == a
    assert {a: 1}[b] == 1
    assert a.hex() == data.hex()
    assert (a == data) is False  # a UniqueId never equals raw bytes
    assert _nccl.UniqueId(memoryview(data)) == a
    strided = np.frombuffer(bytes(range(256)), np.uint8)[::2]  # bytes-like, 128 bytes, not contiguous
    assert bytes(_nccl.UniqueId(strided)) == bytes(strided)


@pytest.mark.parametrize("n", [0, 1, 127, 129, 256])
def test_unique_id_wrong_length(n):
    with pytest.raises(ValueError, match=f"got {n}"):
        _nccl.UniqueId(bytes(n))


@pytest.mark.parametrize("bad", ["x" * 128, 128, [0] * 128])
def test_unique_id_wrong_type(bad):
    with pytest.raises(TypeError):
        _nccl.UniqueId(bad)


# --- CollConfig (ncclCollConfig_t 2.32) --------------------------------------------------------
COLL_OFFSETS = [
    ("size", 0, "Q"), ("magic", 8, "I"), ("version", 12, "I"), ("ext", 16, "P"), ("minCTAs", 24, "i"),
    ("maxCTAs", 28, "i"), ("nvlsCTAs", 32, "i"), ("cgaClusterSize", 36, "i"), ("algSelection", 40, "s"),
    ("forceAlgSelection", 48, "i"), ("CTAPolicy", 52, "i"), ("userProfilerTag", 56, "Q"),
    ("launchCompletionEvent", 64, "P"),
]


def _read_coll(address, offset, kind):
    import struct

    if kind == "s":
        p = ctypes.c_void_p.from_address(address + offset).value
        return None if p is None else ctypes.string_at(p).decode()
    size = struct.calcsize(kind)
    value = struct.unpack(kind, ctypes.string_at(address + offset, size))[0]
    return value


def test_coll_config_defaults_equal_the_initializer():
    cc = _nccl.CollConfig()
    expected = {"size": 72, "magic": 0xCAFEBEEF, "version": 23203, "ext": 0, "minCTAs": INT_MIN,
                "maxCTAs": INT_MIN, "nvlsCTAs": INT_MIN, "cgaClusterSize": INT_MIN, "algSelection": None,
                "forceAlgSelection": 1, "CTAPolicy": INT_MIN, "userProfilerTag": 0, "launchCompletionEvent": 0}
    assert cc.to_dict() == expected
    for field, offset, kind in COLL_OFFSETS:
        assert _read_coll(cc.address, offset, kind) == expected[field], field


def test_coll_config_round_trip_and_bad_values():
    values = {"ext": 0x1234, "minCTAs": 1, "maxCTAs": 8, "nvlsCTAs": 2, "cgaClusterSize": 4,
              "algSelection": "ring,tree", "forceAlgSelection": 0, "CTAPolicy": 2, "userProfilerTag": 2**64 - 1,
              "launchCompletionEvent": 0xDEAD0}
    cc = _nccl.CollConfig(**values)
    for field, offset, kind in COLL_OFFSETS:
        if field in values:
            assert getattr(cc, field) == values[field]
            assert _read_coll(cc.address, offset, kind) == values[field], field
    assert cc == _nccl.CollConfig(**values) and "algSelection='ring,tree'" in repr(cc)
    with pytest.raises(ValueError, match="userProfilerTag"):
        _nccl.CollConfig(userProfilerTag=-1)
    with pytest.raises(TypeError, match="nope"):
        _nccl.CollConfig(nope=1)
    with pytest.raises(ValueError, match="NUL"):
        _nccl.CollConfig(algSelection="a\0")
