"""Transfers on a built cluster: the bottleneck link sets the rate, shared links are shared."""

import pytest

from hwmodel.cluster import Cluster
from hwmodel.topology import build_system

GB = 1e9


@pytest.fixture
def two_dgx():
    return Cluster(build_system("dgx-a100", 2))


def test_across_nodes_limited_by_the_hdr_nic(two_dgx):
    act = two_dgx.transfer("n0.gpu0", "n1.gpu0", 1 * GB)
    two_dgx.env.run()
    _, lat = two_dgx.path("n0.gpu0", "n1.gpu0")
    assert act.end_time == pytest.approx(lat + 1 * GB / 25e9, rel=1e-3)  # HDR: 200 Gb/s = 25 GB/s


def test_within_a_node_limited_by_nvlink(two_dgx):
    act = two_dgx.transfer("n0.gpu0", "n0.gpu5", 3 * GB)
    two_dgx.env.run()
    _, lat = two_dgx.path("n0.gpu0", "n0.gpu5")
    assert act.end_time == pytest.approx(lat + 3 * GB / 300e9, rel=1e-3)  # 12 NVLink3 x 25 GB/s


def test_eight_transfers_through_one_nic_get_an_eighth_each(two_dgx):
    # every GPU of node 1 receives from node 0's GPU 0: all leave through n0.nic0
    acts = [two_dgx.transfer("n0.gpu0", f"n1.gpu{i}", 1 * GB) for i in range(8)]
    two_dgx.env.run(until=0.01)
    nic = two_dgx.links[("n0.nic0", "su0.leaf0")]
    assert all(a.rate == pytest.approx(25e9 / 8) for a in acts)
    assert nic.load == pytest.approx(25e9)
    two_dgx.env.run()
    assert nic.carried == pytest.approx(8 * GB)


def test_negative_size_and_unknown_gpu_are_rejected(two_dgx):
    with pytest.raises(ValueError, match="size_bytes"):
        two_dgx.transfer("n0.gpu0", "n1.gpu0", -1)
    with pytest.raises(ValueError, match="n7.gpu0"):
        two_dgx.transfer("n0.gpu0", "n7.gpu0", 1)
