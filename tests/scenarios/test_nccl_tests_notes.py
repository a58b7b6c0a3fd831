"""`trainsim nccl-tests` says, as `run` does, which cluster keys and IB knobs change nothing here."""

from scenarios.cli import main


def test_ib_knobs_on_one_node_are_noted(capsys):
    assert main(["nccl-tests", "all_reduce", "-b", "1M", "-e", "1M", "--nodes", "1", "--ib-adaptive-routing",
                 "--ib-qps-per-connection", "4", "--oversubscription", "4"]) == 0
    err = capsys.readouterr().err
    assert "# note: oversubscription = 4 has no effect: one node, no inter-node traffic" in err
    assert "# note: [simulation] nccl_ib_adaptive_routing = true changes nothing here: one node" in err
    assert "# note: [simulation] nccl_ib_qps_per_connection = 4 changes nothing here: one node" in err


def test_one_spine_is_noted_and_four_are_not(capsys, tmp_path):
    assert main(["nccl-tests", "all_reduce", "-b", "1M", "-e", "1M", "--nodes", "4", "--fabric", "fat_tree",
                 "--nodes-per-leaf", "1", "--ib-adaptive-routing"]) == 0  # (4 leaves need one spine)
    assert "adaptive_routing = true changes nothing here: with one spine" in capsys.readouterr().err
    cluster = tmp_path / "four-spines.toml"
    cluster.write_text('[system]\nname = "dgx-h100"\nnodes = 4\nfabric = "fat_tree"\nnodes_per_leaf = 1\nspines = 4\n')
    assert main(["nccl-tests", "all_reduce", "-b", "1M", "-e", "1M", "--scenario", str(cluster),
                 "--ib-adaptive-routing"]) == 0
    assert "# note" not in capsys.readouterr().err
