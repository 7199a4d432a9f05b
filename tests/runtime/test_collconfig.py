"""The collectives' per-call ``config=`` (pycoll.CollConfig -> ncclCollConfig_t and its vendor chain)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import pycoll
from pycoll import _bindings as B, collconfig

pytestmark = pytest.mark.timeout(60)


def test_prepare_fills_the_struct_and_the_vendor_chain():
    cfg = pycoll.CollConfig(min_ctas=2, max_ctas=8, alg_selection="ring,simple", force_alg_selection=False,
                            cta_policy=1, user_profiler_tag=1 << 40,
                            vendor_options=(pycoll.VendorOption(7, 1, 42), pycoll.VendorOption(7, 2, "x"),
                                            pycoll.VendorOption(9, 3, 0x1000, raw=True)))
    prep = collconfig.prepare(cfg)  # holds the chain: keep it while the address is used
    (c,) = prep
    d = c.to_dict()
    assert (d["minCTAs"], d["maxCTAs"], d["algSelection"], d["forceAlgSelection"], d["CTAPolicy"]) == \
        (2, 8, "ring,simple", 0, 1)
    assert d["userProfilerTag"] == 1 << 40 and d["nvlsCTAs"] == B.CONFIG_UNDEF_INT
    node = collconfig._Ext.from_address(d["ext"])
    seen = []
    while True:
        seen.append((node.key.vendorId, node.key.optionId))
        if not node.next:
            break
        node = node.next.contents
    assert seen == [(7, 1), (7, 2), (9, 3)]
    assert collconfig.prepare(None) == ()
    assert ctypes.sizeof(collconfig._Ext) == 24


@pytest.mark.parametrize("kwargs,text", [
    ({"min_ctas": -1}, "min_ctas"), ({"min_ctas": 4, "max_ctas": 2}, "min_ctas"),
    ({"alg_selection": 3}, "alg_selection"), ({"force_alg_selection": 1}, "force_alg_selection"),
    ({"user_profiler_tag": -1}, "user_profiler_tag"), ({"launch_completion_event": 0}, "launch_completion_event"),
    ({"vendor_options": (1,)}, "VendorOption"),
])
def test_bad_configs(kwargs, text):
    with pytest.raises((ValueError, TypeError), match=text):
        pycoll.CollConfig(**kwargs)
    with pytest.raises(ValueError, match="C int"):
        pycoll.VendorOption(1, 2, 1 << 40)
    with pytest.raises(ValueError, match="NUL"):
        pycoll.VendorOption(1, 2, "a\0b")


def test_a_config_of_another_kind_is_refused_naming_both_classes():
    # the bindings' CollConfig has the same class name: the message must not read "a CollConfig, not CollConfig"
    with pytest.raises(TypeError, match=r"must be a pycoll\.CollConfig or None, not pycoll\.bindings\.CollConfig "
                                        r"\(the raw ncclCollConfig_t .*min_ctas="):
        collconfig.prepare(B.CollConfig(minCTAs=2))
    with pytest.raises(TypeError, match=r"must be a pycoll\.CollConfig or None, not dict$"):
        collconfig.prepare({"min_ctas": 2})


def test_every_collective_takes_a_config():
    comms = pycoll.init_all(2, backend="host", timeout=20)
    cfg = pycoll.CollConfig(max_ctas=4, vendor_options=(pycoll.VendorOption(1, 1, 1),))
    try:
        def run(op):
            with comms[0].group():
                works = [op(c) for c in comms]
            for w in works:
                w.wait()
        xs = [np.full(4, r + 1.0, np.float32) for r in range(2)]
        run(lambda c: c.all_reduce(xs[c.rank], config=cfg, async_op=True))
        assert xs[0].tolist() == [3.0] * 4
        xs[1][:] = 5.0
        run(lambda c: c.broadcast(xs[c.rank], root=1, config=cfg, async_op=True))
        assert xs[0].tolist() == [5.0] * 4
        run(lambda c: c.reduce(xs[c.rank], root=0, config=cfg, async_op=True))
        outs = [np.zeros(8, np.float32) for _ in range(2)]
        run(lambda c: c.all_gather(xs[c.rank], outs[c.rank], config=cfg, async_op=True))
        run(lambda c: c.reduce_scatter(outs[c.rank], xs[c.rank], config=cfg, async_op=True))
        run(lambda c: c.all_to_all(outs[c.rank], config=cfg, async_op=True))
        run(lambda c: c.gather(xs[c.rank], outs[c.rank] if c.rank == 0 else None, root=0, config=cfg, async_op=True))
        run(lambda c: c.scatter(outs[c.rank] if c.rank == 0 else None, xs[c.rank], root=0, config=cfg,
                                async_op=True))
        assert all(c.failure is None and not c.outstanding() for c in comms)
        with pytest.raises(TypeError, match="CollConfig"):
            comms[0].all_reduce(xs[0], config={"max_ctas": 4})
    finally:
        for c in comms:
            c.abort()
