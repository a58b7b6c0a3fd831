"""``trainsim list``: what can be named in a scenario.

    trainsim list              # everything
    trainsim list zoo          # models ([model] name), with sizes
    trainsim list systems      # clusters ([system] name)
    trainsim list gpus         # GPUs ([system] gpu) with their main figures
    trainsim list nics         # NICs ([system] nic)
    trainsim list scenarios    # the catalog (trainsim run NAME / trainsim sweep NAME)
"""

from __future__ import annotations

import argparse

TOPICS = ("zoo", "systems", "gpus", "nics", "scenarios")


def register(subparsers) -> None:
    p = subparsers.add_parser("list", help="list zoo models, systems, GPUs, NICs and catalog scenarios",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("topic", nargs="?", choices=TOPICS, default=None, help="what to list (default: everything)")
    p.set_defaults(func=run)


def zoo_table() -> str:
    """Zoo models: architecture, shape and parameter count (computed, and as published)."""
    from workload.memory import parameter_count
    from workload.zoo import get_model_config, known_models

    lines = [f"{'model':<14} {'arch':<8} {'layers':>6} {'hidden':>6} {'heads':>5} {'seq':>5} {'params':>10} "
             f"{'published':>10}  source"]
    for name in known_models():
        c = get_model_config(name)
        if hasattr(c, "hidden_size"):
            n = parameter_count(c).total
            heads = c.num_attention_heads if not c.num_query_groups or c.num_query_groups == c.num_attention_heads \
                else f"{c.num_attention_heads}/{c.num_query_groups}"
            shape = f"{c.num_layers:>6} {c.hidden_size:>6} {heads!s:>5} {c.seq_length:>5} {_count(n):>10}"
        else:
            shape = f"{sum(c.blocks_per_stage):>6} {'-':>6} {'-':>5} {'-':>5} {'-':>10}"
        pub = _count(c.published_params * 1e9) if c.published_params else "-"
        arch = c.architecture + (f" {c.num_moe_experts}E" if getattr(c, "num_moe_experts", None) else "")
        lines.append(f"{name:<14} {arch:<8} {shape} {pub:>10}  {c.source}")
    lines.append("heads a/b: a query heads, b key/value groups. Sizes: trainsim's parameter count and the paper's.")
    return "\n".join(lines)


def _count(n: float) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M"


def systems_table() -> str:
    """The named systems: GPU, GPUs per node, NIC."""
    from hwmodel.topology import build_system, known_systems

    lines = [f"{'system':<15} {'GPU':<16} {'GPUs/node':>9}  {'NIC':<16} NVLink per GPU"]
    for name in known_systems():
        t = build_system(name, 1)
        g = t.gpu_spec
        nic = t.nic_spec.name if t.nic_spec is not None else "-"
        nvl = f"{g.nvlink_links} x {g.nvlink_bandwidth_per_link_Bps / 1e9:g} GB/s per direction"
        lines.append(f"{name:<15} {g.name:<16} {t.gpus_per_node:>9}  {nic:<16} {nvl}")
    return "\n".join(lines)


def gpus_table() -> str:
    """GPUs: SMs, dense bf16 peak, HBM capacity and bandwidth, NVLink."""
    from hwmodel.specs import get_gpu, known_gpus

    lines = [f"{'GPU':<16} {'arch':<10} {'SMs':>4} {'bf16 TFLOP/s':>12} {'HBM GB':>7} {'HBM GB/s':>9} "
             f"{'NVLink GB/s':>11}"]
    for name in known_gpus():
        g = get_gpu(name)
        bf16 = f"{g.tensor_flops['bf16'] / 1e12:.0f}" if "bf16" in g.tensor_flops else "-"
        lines.append(f"{g.name:<16} {g.architecture:<10} {g.sm_count:>4} {bf16:>12} {g.hbm_capacity_bytes / 1e9:>7.0f} "
                     f"{g.hbm_bandwidth_Bps / 1e9:>9.0f} {g.nvlink_bandwidth_Bps / 1e9:>11.0f}")
    lines.append("bf16: dense tensor-core peak. NVLink: all links, per direction.")
    return "\n".join(lines)


def nics_table() -> str:
    """NICs: bandwidth per port and direction."""
    from hwmodel.specs import get_nic, known_nics

    lines = [f"{'NIC':<16} {'Gb/s':>5} {'GB/s':>5}"]
    for name in known_nics():
        n = get_nic(name)
        lines.append(f"{n.name:<16} {n.bandwidth_Bps * 8 / 1e9:>5.0f} {n.bandwidth_Bps / 1e9:>5.0f}")
    return "\n".join(lines)


def scenarios_table() -> str:
    """The catalog: name and description; sweep files are marked."""
    from scenarios.catalog import catalog_entries

    entries = catalog_entries()
    width = max((len(n) for n, _, _ in entries), default=8)
    lines = [f"{'scenario':<{width}}  description"]
    for name, desc, is_sweep in entries:
        lines.append(f"{name:<{width}}  {'[sweep] ' if is_sweep else ''}{desc}")
    lines.append("Run one with: trainsim run NAME   (sweeps: trainsim sweep NAME)")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    tables = {"zoo": ("Zoo models", zoo_table), "systems": ("Systems", systems_table), "gpus": ("GPUs", gpus_table),
              "nics": ("NICs", nics_table), "scenarios": ("Catalog scenarios", scenarios_table)}
    topics = [args.topic] if args.topic else list(TOPICS)
    out = []
    for t in topics:
        title, fn = tables[t]
        out.append((f"{title}\n" if len(topics) > 1 else "") + fn())
    print("\n\n".join(out))
    return 0
