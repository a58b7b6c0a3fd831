"""A user's spine count checked at both ends of the cables: at most one spine per leaf uplink port, and
enough spines for the uplinks the nodes present use at the spine switch's radix (a newcomer's 64 leaves x 8
uplinks on one 64-port spine was accepted, and was the fastest setting)."""

import pytest

from hwmodel.topology import build_system


def _spines(topo) -> int:
    return len(topo.nodes_of_kind("ib_switch", tier="spine"))


def test_64_leaves_of_8_uplinks_need_8_spines_of_64_ports():
    """64 DGX H100, one per leaf: 64 x 8 = 512 uplinks, 512 / 64 ports = 8 spines, also the most (8 uplinks)."""
    with pytest.raises(ValueError) as err:
        build_system("dgx-h100", 64, fabric="fat_tree", nodes_per_leaf=1, num_spines=7)
    assert str(err.value) == ("spines = 7: the nodes present use 512 leaf uplinks (64 leaves, up to 8 each: the NICs "
                              "under a leaf / oversubscription), more than 7 QM9700 spine(s) of 64 ports take; "
                              "allowed 8 only")
    topo = build_system("dgx-h100", 64, fabric="fat_tree", nodes_per_leaf=1, num_spines=8)
    assert _spines(topo) == 8 and topo.graph.graph["spines_allowed"] == (8, 8)


@pytest.mark.parametrize("nodes, fewest", [(1, 1), (5, 1), (6, 2), (10, 2), (20, 4)])
def test_a_partly_filled_scalable_unit_counts_the_uplinks_its_nodes_use(nodes, fewest):
    """Rail-optimised DGX A100 (SU of 20 nodes, 8 leaves of 20 uplinks, 40-port QM8700): a leaf uses one
    uplink per node present, so the fewest spines is ceil(8 x nodes / 40) -- one DGX takes one spine (a full
    SU's cabling, ceil(8 x 20 / 40) = 4, would refuse it), and at most 20 (one per uplink port)."""
    topo = build_system("dgx-a100", nodes, num_spines=fewest)
    assert _spines(topo) == fewest and topo.graph.graph["spines_allowed"] == (fewest, 20)
    if fewest > 1:
        with pytest.raises(ValueError, match=rf"^spines = {fewest - 1}: the nodes present use {8 * nodes} leaf "
                                             rf"uplinks \(8 leaves, up to {nodes} each.*; allowed {fewest}\.\.20$"):
            build_system("dgx-a100", nodes, num_spines=fewest - 1)


def test_oversubscription_halves_the_uplinks_a_leaf_uses():
    """2:1 -- 64 DGX H100, one a leaf: 4 uplinks each, 256 / 64 = 4 spines at least, 4 at most."""
    assert _spines(build_system("dgx-h100", 64, fabric="fat_tree", nodes_per_leaf=1, oversubscription=2,
                                num_spines=4)) == 4
    with pytest.raises(ValueError, match=r"^spines = 3: the nodes present use 256 leaf uplinks .*allowed 4 only$"):
        build_system("dgx-h100", 64, fabric="fat_tree", nodes_per_leaf=1, oversubscription=2, num_spines=3)


def test_three_tiers_count_the_uplinks_of_one_pod():
    """32 DGX H100, one a leaf, pods of 16 leaves: a pod's spines take 16 x 8 = 128 uplinks, 2 spines at least."""
    kw = {"fabric": "fat_tree", "nodes_per_leaf": 1, "leaves_per_pod": 16}
    with pytest.raises(ValueError, match=r"^spines = 1: the nodes present use 128 leaf uplinks \(16 leaves a pod, "
                                         r"up to 8 each.*allowed 2\.\.8$"):
        build_system("dgx-h100", 32, num_spines=1, **kw)
    assert _spines(build_system("dgx-h100", 32, num_spines=2, **kw)) == 2 * 2  # two per pod


def test_the_default_count_is_unchanged_and_unchecked():
    """The default fills the ports as before (a catalog fabric's prediction stays): one DGX A100 gets a full
    SU's 4 spines, two SUs 16 x 20 / 40 = 8 (which does not divide a leaf's 20 uplinks: the model splits them
    evenly, as it does for a given count)."""
    assert _spines(build_system("dgx-a100", 1)) == 4
    two = build_system("dgx-a100", 40)
    assert _spines(two) == 8 and "spines_allowed" not in two.graph.graph
