"""A pool of cache devices in timed runs (``ssd=[...]``, ``fail_ssd=(member, seconds)``): the
same settings as ``sim --ssd A --ssd B --fail-ssd I@SECONDS``."""

import pytest

import tiercache as tc
from conftest import ZIPF


def test_two_ssds_split_the_cache_and_report_each_member():
    r = tc.timed({"size": "50%"}, ZIPF, ssd=["ssd:default", "ssd:default"], queue_depth=4, window_s=0.2)
    members = r.to_dict()["ssd_members"]
    assert len(members) == 2
    assert all(m["ops"] > 0 for m in members)
    assert sum(m["bytes_written"] for m in members) == r.to_dict()["ssd"]["bytes_written"]


def test_a_member_failing_drops_its_lines():
    whole = tc.timed({"size": "50%", "mode": "write-back"}, ZIPF, ssd=["ssd:default"] * 2, queue_depth=4)
    half = whole.to_dict()["elapsed_s"] / 2
    r = tc.timed(
        {"size": "50%", "mode": "write-back"}, ZIPF, ssd=["ssd:default"] * 2, queue_depth=4, fail_ssd=(1, half)
    )
    f = r.to_dict()["ssd_failure"]
    assert f["member"] == 1 and f["at_s"] >= half
    assert f["dropped_clean"] + f["lost_dirty_lines"] > 0
    assert "ssd_failure" not in whole.to_dict()


def test_bad_pool_settings_are_clear_errors():
    with pytest.raises(ValueError, match="two or more cache devices"):
        tc.timed({"size": "50%"}, ZIPF, fail_ssd=(0, 0.0))
    with pytest.raises(ValueError, match="names no cache device"):
        tc.timed({"size": "50%"}, ZIPF, ssd=[])
    with pytest.raises(ValueError, match="member, seconds"):
        tc.timed({"size": "50%"}, ZIPF, ssd=["ssd:default"] * 2, fail_ssd=(1,))


def test_a_write_back_pool_mirrors_dirty_lines_as_serve_does():
    """``dirty_copies`` (default 2 on a write-back pool, as ``serve``): the failed member's dirty
    lines are served from their copies; with one copy they are lost."""
    wb = {"size": "50%", "mode": "write-back"}
    whole = tc.timed(wb, ZIPF, ssd=["ssd:default"] * 2, queue_depth=4)
    half = whole.to_dict()["elapsed_s"] / 2
    two = tc.timed(wb, ZIPF, ssd=["ssd:default"] * 2, queue_depth=4, fail_ssd=(1, half)).to_dict()["ssd_failure"]
    assert two["lost_dirty_lines"] == 0 and two["promoted_dirty_lines"] > 0, two
    one = tc.timed(
        wb, ZIPF, ssd=["ssd:default"] * 2, queue_depth=4, fail_ssd=(1, half), dirty_copies=1
    ).to_dict()["ssd_failure"]
    assert one["promoted_dirty_lines"] == 0 and one["lost_dirty_lines"] > 0, one
    with pytest.raises(ValueError, match="dirty_copies=2"):
        tc.timed(wb, ZIPF, dirty_copies=2)
