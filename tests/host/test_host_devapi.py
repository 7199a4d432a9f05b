"""The device-API host functions on the host library: properties, teams, requirement arithmetic
(checked against the real libnccl where it computes without a GPU), NCCL's invalid-usage error
naming the function for what only a GPU has."""

from __future__ import annotations

import ctypes

import pytest
from helpers.host_util import lib

from pycoll import errors
from pycoll._bindings import _nccl

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def comms():
    l = lib()
    cs = l.comm_init_all(3)
    yield cs
    for c in cs:
        try:
            l.comm_destroy(c)
        except errors.InvalidArgument:
            pass


def _real():
    try:
        return _nccl.load("nccl")
    except Exception:
        return None


def test_struct_sizes_match_the_2_32_3_headers():
    assert _nccl.COMM_PROPERTIES_SIZE == 152
    assert _nccl.DEV_COMM_REQUIREMENTS_SIZE == 120


def test_properties_of_each_rank(comms):
    l = lib()
    hashes = set()
    for r, c in enumerate(comms):
        p = l.comm_query_properties(c)
        assert (p["rank"], p["nRanks"], p["cudaDev"]) == (r, 3, r)
        assert p["size"] == 152 and p["magic"] == _nccl.API_MAGIC and p["version"] == _nccl.HEADER_VERSION
        assert p["deviceApiSupport"] is False and p["multimemSupport"] is False
        assert p["ginType"] == _nccl.GIN_TYPE_NONE and p["ginSupport"] == [] and p["nLsaTeams"] == 1
        hashes.add(p["commHash"])
    assert len(hashes) == 1 and hashes != {0}


def test_properties_of_a_destroyed_comm_raise():
    l = lib()
    (c,) = l.comm_init_all(1)
    l.comm_destroy(c)
    with pytest.raises(errors.InvalidArgument):
        l.comm_query_properties(c)


def test_teams(comms):
    l = lib()
    for r, c in enumerate(comms):
        assert l.team_world(c) == (3, r, 1)
        assert l.team_lsa(c) == (3, r, 1)
        assert l.team_rail(c) == (1, 0, 3)
        world = l.team_world(c)
        assert [l.team_rank_to_world(c, world, k) for k in range(3)] == [0, 1, 2]
        assert l.team_rank_to_lsa(c, world, 2) == 2
        with pytest.raises(ValueError, match="must be < team.n_ranks"):
            l.team_rank_to_world(c, world, 3)
        with pytest.raises(ValueError, match="not a rank of this communicator"):
            l.team_rank_to_world(c, _nccl.Team(3, r, 5), (r + 1) % 3 if r < 2 else 0)
        with pytest.raises(errors.InvalidUsage, match="ncclTeamCft"):
            l.team_cft(c)
        with pytest.raises(errors.InvalidUsage, match="ncclTeamCftMultimem"):
            l.team_cft_multimem(c)
    with pytest.raises(ValueError, match="not 0"):
        l.team_world(0)
    with pytest.raises(TypeError, match="Team"):
        l.team_rank_to_world(comms[0], 5, 0)


@pytest.mark.parametrize("n_blocks,n_slots", [(0, 0), (1, 1), (4, 64), (32, 1000)])
def test_lla2a_requirement_matches_libnccl(n_blocks, n_slots):
    req = lib().lla2a_create_requirement(n_blocks, n_slots)
    assert req.buffer_size == n_blocks * (1 + 2 * n_slots) * 16 and req.buffer_align == 16
    assert req.handle == {"bufHandle": 0, "nSlots": n_slots}
    real = _real()
    if real is not None:
        other = real.lla2a_create_requirement(n_blocks, n_slots)
        assert (other.buffer_size, other.buffer_align, other.handle) == (req.buffer_size, req.buffer_align, req.handle)


@pytest.mark.parametrize("elts,size", [(0, 1), (1, 1), (32, 16), (7, 9), (100, 8)])
def test_lla2a_calc_slots_matches_libnccl(elts, size):
    n = lib().lla2a_calc_slots(elts, size)
    assert n == elts * -(-size // 8)
    real = _real()
    if real is not None:
        assert real.lla2a_calc_slots(elts, size) == n


@pytest.mark.parametrize("team,n", [((1, 0, 1), 1), ((8, 2, 1), 3), ((4, 3, 2), 16)])
def test_lsa_barrier_requirement_matches_libnccl(team, n):
    req = lib().lsa_barrier_create_requirement(team, n)
    assert req.handle["nBarriers"] == n
    real = _real()
    if real is not None:
        other = real.lsa_barrier_create_requirement(team, n)
        assert (other.buffer_size, other.buffer_align, other.handle) == (req.buffer_size, req.buffer_align, req.handle)


def test_device_only_functions_raise_invalid_usage_naming_the_function(comms):
    l = lib()
    c = comms[0]
    with pytest.raises(errors.InvalidUsage, match="ncclDevCommCreate.*deviceApiSupport"):
        l.dev_comm_create(c, _nccl.DevCommRequirements(barrierCount=1))
    with pytest.raises(errors.InvalidUsage, match="ncclGinBarrierCreateRequirement"):
        l.gin_barrier_create_requirement(c, l.team_world(c), 1)
    with pytest.raises(errors.InvalidUsage, match="ncclGinOutboxCreateRequirement"):
        l.gin_outbox_create_requirement(2, 10)
    with pytest.raises(errors.InvalidUsage, match="ncclGinInboxA2ACreateRequirement"):
        l.gin_inbox_a2a_create_requirement(l.team_world(c), 2, 10)
    ps = [l.mem_alloc(4096) for _ in comms]
    for p in ps:
        ctypes.memset(p, 0, 4096)
    l.group_start()  # window registration is collective: every rank of the communicator, in one group
    try:
        wins = [l.comm_window_register(ci, p, 4096)[0] for ci, p in zip(comms, ps, strict=True)]
    finally:
        l.group_end()
    win = wins[0]
    try:
        with pytest.raises(errors.InvalidUsage, match="ncclGetLsaMultimemDevicePointer"):
            l.get_lsa_multimem_device_pointer(win, 0)
        with pytest.raises(errors.InvalidUsage, match="ncclGetMultimemDevicePointer"):
            l.get_multimem_device_pointer(win, 0, 0)
        with pytest.raises(errors.InvalidUsage, match="ncclGetMultimemDeviceLeInfo"):
            l.get_multimem_device_le_info(win, 0)
        with pytest.raises(errors.InvalidUsage, match="ncclGetCftDeviceLeInfo"):
            l.get_cft_device_le_info(win, 0, 0, (1, 0, 1))
        with pytest.raises(errors.InvalidUsage, match="ncclGetPeerDeviceLeInfo"):
            l.get_peer_device_le_info(win, 0, 0)
    finally:
        for ci, w, p in zip(comms, wins, ps, strict=True):
            l.comm_window_deregister(ci, w)
            l.mem_free(p)
    with pytest.raises(errors.InvalidArgument, match="not a registered window"):
        l.get_multimem_device_le_info(0xdead0, 0)
    with pytest.raises(ValueError, match="not 0"):
        l.get_lsa_device_pointer(0, 0, 0)


def test_dev_comm_requirements_initializer_and_fields():
    r = _nccl.DevCommRequirements()
    d = r.to_dict()
    assert d["ginContextCount"] == 4 and d["ginTrafficClass"] == _nccl.CONFIG_UNDEF_INT
    assert d["ginStrongSignalsRequired"] is True and d["ginCustomStride"] == 1 and d["barrierCount"] == 0
    r = _nccl.DevCommRequirements(barrierCount=3, lsaMultimem=True)
    assert r.barrierCount == 3 and r.lsaMultimem is True
    with pytest.raises(TypeError, match="no field"):
        _nccl.DevCommRequirements(bogus=1)
    with pytest.raises(TypeError, match="must be a bool"):
        _nccl.DevCommRequirements(lsaMultimem=1)
    with pytest.raises(TypeError, match="DevRequirement"):
        _nccl.DevCommRequirements(resources=[1])
