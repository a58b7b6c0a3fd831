"""``trainsim list``: what can be named in a scenario.

    trainsim list              # everything
    trainsim list zoo          # models ([model] name), with sizes
    trainsim list systems      # clusters ([system] name)
    trainsim list gpus         # GPUs ([system] gpu) with their main figures
    trainsim list nics         # NICs ([system] nic)
    trainsim list switches     # switches ([system] fabric_switch: the InfiniBand ones)
    trainsim list scenarios    # the catalog (trainsim run NAME / trainsim sweep NAME)
"""

from __future__ import annotations

import argparse

TOPICS = ("zoo", "systems", "gpus", "nics", "switches", "scenarios")


def register(subparsers) -> None:
    p = subparsers.add_parser("list", help="list zoo models, systems, GPUs, NICs, switches and catalog scenarios",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("topic", nargs="?", choices=TOPICS, default=None, help="what to list (default: everything)")
    p.set_defaults(func=run)


def columns(rows: list[tuple[str, ...]], align: str, *, text_last: bool = True) -> list[str]:
    """``rows`` (the header first) as lines of columns as wide as their widest cell (long names push their
    column, not the next), two spaces apart; ``align`` has one ``<`` (left) or ``>`` (right) per column.
    ``text_last``: the last column is free text, not padded."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(align))]
    out = []
    for r in rows:
        cells = [f"{c:{a}{w}}" for c, a, w in zip(r, align, widths, strict=True)]
        if text_last:
            cells[-1] = r[-1]
        out.append("  ".join(cells).rstrip())
    return out


def zoo_table() -> str:
    """Zoo models: architecture, shape and parameter count (computed, and as published)."""
    from workload.memory import parameter_count
    from workload.zoo import get_model_config, known_models

    rows = [("model", "arch", "layers", "hidden", "heads", "seq", "params", "published", "source")]
    for name in known_models():
        c = get_model_config(name)
        if hasattr(c, "hidden_size"):
            heads = c.num_attention_heads if not c.num_query_groups or c.num_query_groups == c.num_attention_heads \
                else f"{c.num_attention_heads}/{c.num_query_groups}"
            shape = (str(c.num_layers), str(c.hidden_size), str(heads), str(c.seq_length),
                     _count(parameter_count(c).total))
        else:
            shape = (str(sum(c.blocks_per_stage)), "-", "-", "-", "-")
        pub = _count(c.published_params * 1e9) if c.published_params else "-"
        arch = c.architecture + (f" {c.num_moe_experts}E" if getattr(c, "num_moe_experts", None) else "")
        rows.append((name, arch, *shape, pub, c.source))
    return "\n".join([*columns(rows, "<<>>>>>><"),
                      "heads a/b: a query heads, b key/value groups. Sizes: trainsim's parameter count and the "
                      "paper's."])


def _count(n: float) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M"


def systems_table() -> str:
    """The named systems: GPU, GPUs per node, NIC."""
    from hwmodel.topology import build_system, known_systems

    rows = [("system", "GPU", "GPUs/node", "NIC", "NVLink per GPU")]
    for name in known_systems():
        t = build_system(name, 1)
        g = t.gpu_spec
        nic = t.nic_spec.name if t.nic_spec is not None else "-"
        nvl = f"{g.nvlink_links} x {g.nvlink_bandwidth_per_link_Bps / 1e9:g} GB/s per direction"
        rows.append((name, g.name, str(t.gpus_per_node), nic, nvl))
    return "\n".join(columns(rows, "<<><<"))


def gpus_table() -> str:
    """GPUs: SMs, dense bf16 peak, HBM capacity and bandwidth, NVLink."""
    from hwmodel.specs import get_gpu, known_gpus

    rows = [("GPU", "arch", "SMs", "bf16 TFLOP/s", "HBM GB", "HBM GB/s", "NVLink GB/s")]
    for name in known_gpus():
        g = get_gpu(name)
        bf16 = f"{g.tensor_flops['bf16'] / 1e12:.0f}" if "bf16" in g.tensor_flops else "-"
        rows.append((g.name, g.architecture, str(g.sm_count), bf16, f"{g.hbm_capacity_bytes / 1e9:.0f}",
                     f"{g.hbm_bandwidth_Bps / 1e9:.0f}", f"{g.nvlink_bandwidth_Bps / 1e9:.0f}"))
    return "\n".join([*columns(rows, "<<>>>>>", text_last=False),
                      "bf16: dense tensor-core peak. NVLink: all links, per direction."])


def _rate(bytes_per_s: float) -> str:
    """A link rate in both units it is quoted in, each with its unit: ``"100 Gb/s = 12.5 GB/s"`` (Gb/s as
    sold, GB/s as NCCL reports; ``%g``: EDR's 12.5 GB/s is not rounded to 12)."""
    return f"{bytes_per_s * 8 / 1e9:g} Gb/s = {bytes_per_s / 1e9:g} GB/s"


def nics_table() -> str:
    """NICs: bandwidth per port and direction, in Gb/s (as sold) and GB/s (as NCCL reports), and aliases."""
    from hwmodel.specs import get_nic, known_nics

    rows = [("NIC", "bandwidth", "aliases")]
    for name in known_nics():
        n = get_nic(name)
        rows.append((n.name, _rate(n.bandwidth_Bps), _aliases("nic", n.name)))
    return "\n".join([*columns(rows, "<<<"), "bandwidth: per port and direction."])


def switches_table() -> str:
    """Switches: kind, ports, port bandwidth and hop latency, and aliases; ``[system] fabric_switch``
    takes the InfiniBand ones."""
    from hwmodel.specs import get_switch, known_switches

    rows = [("switch", "kind", "ports", "port bandwidth", "hop latency", "aliases")]
    for name in known_switches():
        w = get_switch(name)
        rows.append((w.name, w.kind, str(w.radix), _rate(w.port_bandwidth_Bps), f"{w.hop_latency_s * 1e9:g} ns",
                     _aliases("switch", w.name)))
    return "\n".join([*columns(rows, "<<><><"),
                      "kind: ib (InfiniBand: [system] fabric_switch), pcie (in the node), nvswitch. Port bandwidth: "
                      "per direction."])


def _aliases(field: str, canonical: str) -> str:
    """The other names a scenario may give (:func:`hwmodel.specs.aliases_of`), as the data file writes them."""
    from hwmodel.specs import aliases_of

    return ", ".join(aliases_of(field, canonical)) or "-"


def scenarios_table() -> str:
    """The catalog: name and description; sweep files are marked."""
    from scenarios.catalog import catalog_entries

    rows = [("scenario", "description")]
    rows += [(name, ("[sweep] " if is_sweep else "") + desc) for name, desc, is_sweep in catalog_entries()]
    return "\n".join([*columns(rows, "<<"), "Run one with: trainsim run NAME   (sweeps: trainsim sweep NAME)"])


def run(args: argparse.Namespace) -> int:
    tables = {"zoo": ("Zoo models", zoo_table), "systems": ("Systems", systems_table), "gpus": ("GPUs", gpus_table),
              "nics": ("NICs", nics_table), "switches": ("Switches", switches_table),
              "scenarios": ("Catalog scenarios", scenarios_table)}
    topics = [args.topic] if args.topic else list(TOPICS)
    out = []
    for t in topics:
        title, fn = tables[t]
        out.append((f"{title}\n" if len(topics) > 1 else "") + fn())
    print("\n\n".join(out))
    return 0
