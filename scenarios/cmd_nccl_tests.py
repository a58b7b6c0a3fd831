"""``trainsim nccl-tests``: nccl-tests' performance table, simulated on the hardware model.

    trainsim nccl-tests all_reduce -b 8 -e 8G -f 2 -g 8 --nodes 1 --system dgx-a100

Arguments follow nccl-tests 2.19.6 (``-b`` minbytes, ``-e`` maxbytes, ``-f`` stepfactor, ``-i`` stepbytes,
``-g`` GPUs per thread, ``-d`` datatype); the collective is a binary name (``all_reduce_perf``) or a
collective name (``all_reduce``, ``allreduce``). One process per node drives ``-g`` GPUs, so the
communicator has ``g x nodes`` ranks. ``--algo`` / ``--proto`` override NCCL's tuner like
``NCCL_ALGO`` / ``NCCL_PROTO``; ``--tuner-config FILE`` applies tuner-plugin rules in the format of
NCCL's example tuner plugin (``NCCL_TUNER_CONFIG_FILE``, :mod:`hwmodel.nccl.tuner_config`). The table
is nccl-tests' out-of-place half plus the algorithm and protocol chosen per size
(:func:`hwmodel.nccl.nccltests.format_table`); times come from
:func:`hwmodel.nccl.engine.simulate_nccl_tests` (host enqueue cost included for ``-g > 1``).

The cluster is ``--system`` with ``--nodes``, ``--nic``, ``--fabric``, ``--oversubscription`` and
``--nodes-per-leaf`` (the ``[system]`` keys of a scenario), or ``--scenario``'s ``[system]`` (those
options, when given, override it), so one collective can be compared across topologies. As nccl-tests,
a size that leaves a rank no element (``-b 0``) is refused.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from hwmodel import calibration_overlay
from hwmodel.nccl import nccltests as N
from hwmodel.nccl.calibration import CurveKey, recording_corrections
from hwmodel.nccl.channels import MAXCHANNELS as MAX_CHANNELS_NOTE
from hwmodel.nccl.engine import FIDELITIES, simulate_nccl_tests
from hwmodel.nccl.tuner import NCCL_VERSION
from hwmodel.nccl.tuner_config import TunerConfigError, load_tuner_config
from hwmodel.topology import FABRICS, known_systems
from scenarios.cli import UserError, output_file

IB_KEYS = ("nccl_ib_qps_per_connection", "nccl_ib_adaptive_routing")
"""The ``[simulation]`` keys nccl-tests takes from a scenario (NCCL's IB knobs, :mod:`hwmodel.ecmp`)."""

def register(subparsers) -> None:
    p = subparsers.add_parser(
        "nccl-tests", help="simulate an nccl-tests sweep (all_reduce_perf, all_gather_perf, ...)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("collective", help="all_reduce, all_gather, reduce_scatter, broadcast, reduce, "
                                      "alltoall, sendrecv (or the nccl-tests binary name, e.g. all_reduce_perf)")
    p.add_argument("-b", "--minbytes", default="32M", help="smallest size, bytes with K/M/G suffix (default 32M)")
    p.add_argument("-e", "--maxbytes", default="32M", help="largest size (default 32M)")
    p.add_argument("-f", "--stepfactor", type=int, default=2, help="multiply the size by this (default 2)")
    p.add_argument("-i", "--stepbytes", default=None, help="add this many bytes per step when -f 1")
    p.add_argument("-g", "--ngpus", type=int, default=1, help="GPUs driven by each process/thread (default 1)")
    p.add_argument("-d", "--datatype", default="float", help="nccl-tests type: float (default), half, bfloat16, ...")
    p.add_argument("--nodes", type=int, default=None, help="nodes, one process each (default 1)")
    p.add_argument("--system", default=None, help=f"one of {', '.join(known_systems())} (default dgx-a100)")
    p.add_argument("--nic", default=None, help="another NIC (trainsim list nics), as [system] nic")
    p.add_argument("--fabric", default=None, choices=FABRICS, help="the inter-node fabric, as [system] fabric")
    p.add_argument("--oversubscription", type=float, default=None, metavar="K",
                   help="k:1 at the leaf uplinks, as [system] oversubscription")
    p.add_argument("--nodes-per-leaf", type=int, default=None, metavar="N",
                   help="nodes under each leaf switch (fat_tree), as [system] nodes_per_leaf")
    p.add_argument("--scenario", default=None, metavar="SCENARIO",
                   help="take the cluster from this scenario's [system] (a TOML file or catalog name)")
    p.add_argument("--algo", default=None,
                   help="force NCCL's algorithm: ring, tree, nvls, nvls_tree (NCCL_ALGO; nvls_tree = NVLSTree)")
    p.add_argument("--proto", default=None, help="force NCCL's protocol: simple, ll, ll128 (NCCL_PROTO)")
    p.add_argument("--tuner-config", metavar="FILE", default=None,
                   help="NCCL tuner-plugin rules (NCCL_TUNER_CONFIG_FILE CSV format: collective_type,min_bytes,"
                        "max_bytes,algorithm,protocol,channels,nNodes,nRanks[,numPipeOps,regBuff]); the first "
                        "matching rule overrides NCCL's model")
    p.add_argument("--fidelity", default="flow", choices=FIDELITIES,
                   help="flow (default), step, or chunked (NCCL's chunk/slice pipeline)")
    p.add_argument("--ib-qps-per-connection", type=int, default=None, metavar="N",
                   help="NCCL_IB_QPS_PER_CONNECTION: QPs per connection, each hashed onto the fabric on its own "
                        "(default: the scenario's [simulation] nccl_ib_qps_per_connection, else 1)")
    p.add_argument("--ib-adaptive-routing", action=argparse.BooleanOptionalAction, default=None,
                   help="NCCL_IB_ADAPTIVE_ROUTING: the fabric spreads each flow evenly over every equal-cost path "
                        "instead of hashing it onto one (default: the scenario's [simulation] "
                        "nccl_ib_adaptive_routing, else off)")
    p.add_argument("--json", metavar="PATH", default=None, help="also write the rows as JSON to PATH")
    p.set_defaults(func=run)


def _system(args: argparse.Namespace) -> tuple[dict, Path | None, int, bool]:
    """The ``[system]`` section the options describe (from ``--scenario``, then the options), the
    folder its relative paths are taken from, and the QPs per NCCL connection (``--ib-qps-per-connection``,
    else the scenario's ``[simulation] nccl_ib_qps_per_connection``, else NCCL's default 1) and whether
    the fabric routes adaptively (``--ib-adaptive-routing``, else the scenario's, else off)."""
    from scenarios.scenario import parse_scenario

    system: dict = {"name": "dgx-a100"}
    simulation: dict = {}
    base_dir = None
    if args.scenario is not None:
        from scenarios.cmd_run import load

        path = Path(args.scenario)
        if path.suffix == ".toml" and path.is_file() and "model" not in _read_toml(path):  # [system] is enough
            system, base_dir = dict(_read_toml(path).get("system", {})), path.parent
            simulation = {k: v for k, v in _read_toml(path).get("simulation", {}).items()
                          if k in IB_KEYS}
        else:
            sc = load(None if args.scenario == "default" and not Path("default").exists() else args.scenario, [])
            system, base_dir = dict(sc.system), Path(sc.source).parent if Path(sc.source).is_file() else None
            simulation = {k: v for k, v in sc.simulation.items() if k in IB_KEYS}
    if args.ib_qps_per_connection is not None:
        simulation["nccl_ib_qps_per_connection"] = args.ib_qps_per_connection
    if args.ib_adaptive_routing is not None:
        simulation["nccl_ib_adaptive_routing"] = args.ib_adaptive_routing
    for key, value in (("name", args.system), ("nodes", args.nodes), ("nic", args.nic), ("fabric", args.fabric),
                       ("oversubscription", args.oversubscription), ("nodes_per_leaf", args.nodes_per_leaf)):
        if value is not None:
            system[key] = value
    # the scenario schema checks them (finite, >= 1, ...): one set of rules for both commands
    parse_scenario({"system": system, "model": {"name": "gpt-1.7b"}, "simulation": simulation})
    return system, base_dir, int(simulation.get("nccl_ib_qps_per_connection", 1)), \
        bool(simulation.get("nccl_ib_adaptive_routing", False))


def run(args: argparse.Namespace) -> int:
    coll = N.canonical_collective(args.collective)
    from scenarios.notes import what_if_notes
    from scenarios.runner import build_topology
    from scenarios.scenario import MAX_NODES

    if args.nodes is not None and not 1 <= args.nodes <= MAX_NODES:
        raise UserError(f"--nodes must be in 1..{MAX_NODES} (the largest system trainsim is built to simulate), "
                        f"got {args.nodes}")
    if args.ngpus < 1:
        raise UserError(f"-g must be >= 1, got {args.ngpus}")
    json_path = output_file("--json", args.json) if args.json else None
    system, base_dir, qps, adaptive = _system(args)
    topo = build_topology(system, base_dir)
    # what the cluster's keys and the IB knobs change nothing here, as `run` says it (a node, a leaf, a spine)
    for line in what_if_notes(system, topo, base_dir, simulation={"nccl_ib_qps_per_connection": qps,
                                                                   "nccl_ib_adaptive_routing": adaptive}):
        print(f"# note: {line}", file=sys.stderr)
    nodes = topo.num_nodes
    per_node = topo.gpus_per_node
    if args.ngpus > per_node:
        raise UserError(f"-g {args.ngpus}: a {topo.name} node has only {per_node} GPUs")
    if args.stepfactor < 1:
        raise UserError(f"-f must be >= 1, got {args.stepfactor}")
    sizes = N.size_sweep(args.minbytes, args.maxbytes, args.stepfactor, args.stepbytes)
    ranks = args.ngpus * nodes
    empty = [s for s in sizes if N.element_count(coll, s, args.datatype, ranks) == 0]
    if empty:
        raise UserError(f"{coll} of {empty[0]} bytes: 0 elements of {args.datatype} per rank on {ranks} rank(s); "
                        f"nccl-tests does not run an empty collective: give -b of at least one element per rank")
    gpus = [g for node in range(nodes) for g in topo.gpus_of_node(node)[:args.ngpus]]
    rules = None
    if args.tuner_config:
        try:
            rules = load_tuner_config(args.tuner_config)
        except TunerConfigError as exc:
            raise UserError(f"--tuner-config: {exc}") from None
    if rules is not None:
        wide = [r for r in rules.rules if r.channels > MAX_CHANNELS_NOTE]
        if wide:
            print(f"# note: tuner rule(s) ask for up to {max(r.channels for r in wide)} channels; NCCL (and trainsim) "
                  f"clamp channels to the communicator's ({MAX_CHANNELS_NOTE} at most)", file=sys.stderr)
    with recording_corrections() as used_curves:
        rows = simulate_nccl_tests(topo, coll, sizes, gpus_per_thread=args.ngpus, dtype=args.datatype,
                                   algorithm=args.algo, protocol=args.proto, fidelity=args.fidelity,
                                   gpus=gpus, tuner_config=rules, ib_qps_per_connection=qps,
                                   ib_adaptive_routing=adaptive)
    profile = calibration_overlay.active()
    applying = _profile_applies(profile, topo, args.fidelity, used_curves) if profile else ()
    print(f"# trainsim nccl-tests: {topo.name}, {nodes} node(s) x {args.ngpus} GPU(s), "
          f"fidelity {args.fidelity}, NCCL {NCCL_VERSION} tuning model"
          + (f", NCCL_ALGO={args.algo}" if args.algo else "")
          + (f", NCCL_PROTO={args.proto}" if args.proto else "")
          + (f", tuner rules {args.tuner_config} ({len(rules)})" if rules is not None else "")
          + (f", calibration {profile.name} ({profile.path}: {', '.join(applying) or 'nothing for this GPU'})"
             if profile else ""))
    print(N.format_table(rows, n_threads=1, n_gpus=args.ngpus,
                         step_factor=args.stepfactor if args.stepfactor > 1 else None,
                         min_bytes=N.parse_size(args.minbytes), max_bytes=N.parse_size(args.maxbytes)), end="")
    if json_path:
        path = json_path
        try:
            path.write_text(json.dumps(N.rows_to_json(rows), indent=1) + "\n")
        except OSError as exc:
            raise UserError(f"cannot write {path}: {exc.strerror}") from None
    return 0


def _profile_applies(profile: calibration_overlay.Overlay, topo: Any, fidelity: str,
                     used_curves: set[CurveKey]) -> tuple[str, ...]:
    """The constants of ``profile`` that apply to ``topo``'s GPU (as ``run`` lists them); warns on stderr,
    as ``run`` does, when none does or when a busbw correction the sweep applied (``used_curves``, from
    :func:`~hwmodel.nccl.calibration.recording_corrections`) was fitted under another fidelity."""
    from hwmodel.costmodel import Calibration
    from hwmodel.nccl.calibration import fidelity_warning, group_size_warning

    gpu = topo.gpu_spec
    applying = profile.applying_to(gpu.name, Calibration.architecture_of(gpu))
    if not applying:
        print(f"# warning: calibration {profile.name} ({profile.path}): changes nothing for this run on {gpu.name}; "
              f"its {len(profile.changed)} constant(s) are for other GPUs", file=sys.stderr)
    elif used_curves:
        for warning in (fidelity_warning(profile.name, fidelity, used_curves),
                        group_size_warning(profile.name, used_curves)):
            if warning:
                print(f"# warning: {warning}", file=sys.stderr)
    return applying


def _read_toml(path: Path) -> dict:
    """A scenario file's tables (a file with only ``[system]`` describes a cluster for nccl-tests).

    Raises:
        ValueError: the file is not valid TOML (naming it).
    """
    import tomllib

    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML: {exc}") from None
