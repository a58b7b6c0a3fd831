"""A communicator as NCCL's tuning model sees it, and NCCL's topology search for its channels.

Shared machinery of every collective algorithm (:mod:`hwmodel.nccl.algorithms`), reproducing NCCL
2.30.7 (commit ``5067397c``) in pure Python:

* :class:`CommTopology` is what NCCL's tuning model knows about a communicator: ranks, nodes, GPU
  generation, intra-node link type, CPU vendor and the three search graphs (ring, tree, NVLS; the
  NVLS graph also serves NVLSTree, ``graphs[NCCL_ALGO_NVLS_TREE] = nvlsGraph`` in ``src/init.cc``, and
  the tree graph serves PAT, ``graphs[NCCL_ALGO_PAT] = treeGraph``).
* :meth:`CommTopology.from_system` derives the search graphs the way ``src/graph/search.cc``
  (``ncclTopoCompute``, ``ncclTopoDupChannels``) and ``src/graph/connect.cc`` (``ncclTopoPostset``)
  would for a DGX-like node (NVSwitch, one NIC per GPU). The real search is a depth-first walk over
  the topology with timeouts; here it is a closed-form capacity count (documented on each helper).
* Protocol names and thread constants shared by the per-operation channel rules.

Units: bandwidths in bytes/s and times in seconds in every public field and return value. NCCL's
tables are in GB/s (1e9 B/s) and are converted at the boundary; ``_GBPS`` names hold NCCL's numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

PROTOCOLS: tuple[str, ...] = ("ll", "ll128", "simple")
"""Protocols in NCCL's ``NCCL_PROTO_*`` order (LL, LL128, Simple)."""

PROTOCOL_INDEX: dict[str, int] = {p: i for i, p in enumerate(PROTOCOLS)}
"""Column of a protocol in NCCL's ``[algorithm][protocol]`` tables."""

GB = 1e9
"""Bytes per GB as NCCL's tables and nccl-tests count it (1e9)."""

ARCHITECTURES: tuple[str, ...] = ("volta", "ampere", "hopper", "blackwell")
"""GPU generations in NCCL's ``compCapIndex`` order (tuning.cc: Volta 0, Ampere 1, Hopper 2,
Blackwell 3; sm < 80 -> Volta, 80-89 -> Ampere, 90-99 -> Hopper, >= 100 -> Blackwell)."""

MAXCHANNELS = 64
"""``MAXCHANNELS`` (nccl ``src/include/device.h``, 2.30.7): upper bound on channels per communicator."""

RING_SEARCH_MAX_CHANNELS = MAXCHANNELS // 2
"""Ring graph ``maxChannels = MAXCHANNELS/2`` = 32 (nccl ``src/init.cc`` l.1177, 2.30.7)."""

NVLS_MAX_ARITY = 32
"""``NCCL_MAX_NVLS_ARITY`` (device.h, 2.30.7): NVLS search channels <= min(32, GPUs per node)."""

NVLS_CHANNELS: dict[str, int] = {"hopper": 16, "blackwell": 24}
"""Runtime NVLS channels for a single node (nccl ``src/transport/nvls.cc`` 2.30.7:
``NVLS_NCHANNELS_SM90 16``, ``NVLS_NCHANNELS_SM100_NVL 24``; multi-node Blackwell uses 32)."""

NVLS_CHANNELS_SM100_MULTINODE = 32
"""``NVLS_NCHANNELS_SM100`` (nvls.cc 2.30.7), used when nNodes > 1 on Blackwell before
``ncclNvlsTreeSm100Tuning`` adjusts it (see :func:`nvls_runtime_channels`)."""

NVLINK_BW_PER_LINK_GBPS: dict[str, float] = {"volta": 20.0, "ampere": 20.0, "hopper": 20.6, "blackwell": 40.1}
"""NCCL's app-level NVLink bandwidth per link and direction, GB/s (nccl ``src/graph/topo.h`` 2.30.7:
``SM70_NVLINK_BW 20``, ``SM80_NVLINK_BW 20``, ``SM90_NVLINK_BW 20.6``, ``SM100_NVLINK_BW 40.1``)."""

PCI_BW_GBPS = 12.0
"""``PCI_BW`` (topo.h 2.30.7), GB/s: Ring/Simple uses 256 threads when ``bwIntra*nChannels <= PCI_BW``."""

DEFAULT_PCIE_BW_GBPS: dict[str, float] = {"volta": 12.0, "ampere": 24.0, "hopper": 48.0, "blackwell": 48.0}
"""NCCL's PCIe x16 bandwidth per direction, GB/s: ``width*speed/80`` with Gen3 12, Gen4 24, Gen5 48
(nccl ``src/graph/topo.cc`` ``kvDictPciGen``, 2.30.7). Generation per GPU: V100 Gen3, A100 Gen4,
H100/B200 Gen5 (hardware_nccl.md §2.6, §7)."""

# Search speed arrays, GB/s per channel (nccl src/graph/search.cc 2.30.7).
SPEED_ARRAY_INTRA: dict[str, tuple[float, ...]] = {
    "volta": (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
    "ampere": (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
    "hopper": (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0),
    "blackwell": (90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0),
}
"""``speedArrayIntra`` (sm < 90), ``sm90SpeedArrayIntra``, ``sm100SpeedArrayIntra`` (search.cc, 2.30.7)."""

SPEED_ARRAY_INTER: dict[str, tuple[float, ...]] = {
    "volta": (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.4, 1.2,
              0.24, 0.12),
    "ampere": (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.4, 1.2,
               0.24, 0.12),
    "hopper": (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24,
               0.12),
    "blackwell": (96.0, 86.0, 80.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0,
                  3.0, 2.4, 1.2, 0.24, 0.12),
}
"""``speedArrayInter``, ``sm90SpeedArrayInter``, ``sm100SpeedArrayInter`` (search.cc, 2.30.7)."""

# Thread counts (nccl src/include/device.h and src/graph/tuning.cc ncclTopoTuneModel, 2.30.7).
WARP_SIZE = 32
NCCL_MAX_NTHREADS = 640
NCCL_SIMPLE_MAX_NTHREADS = 512
NCCL_LL_MAX_NTHREADS = 512
NCCL_LL128_MAX_NTHREADS = 640

THREAD_THRESHOLD_BYTES: dict[str, int] = {"ll": 8, "ll128": 8, "simple": 64}
"""Bytes of work per thread before NCCL adds threads/channels (nccl ``src/include/comm.h`` 2.30.7:
``NCCL_LL_THREAD_THRESHOLD 8``, ``NCCL_LL128_THREAD_THRESHOLD 8``, ``NCCL_SIMPLE_THREAD_THRESHOLD 64``).
Ring LL multiplies by nRanks (tuning.cc)."""

_EPS = 1e-9


def arch_from_compute_capability(cc: str | int | float | tuple[int, int]) -> str:
    """GPU generation name from a compute capability, as NCCL's ``compCapIndex`` (tuning.cc 2.30.7).

    Accepts a generation name (``"ampere"``), ``(8, 0)``, ``8.0``, ``"8.0"``, ``80`` or ``"sm80"``.

    Raises:
        ValueError: unknown name or a compute capability below 7.0 (NCCL's model starts at Volta).
    """
    if isinstance(cc, str):
        s = cc.strip().lower()
        if s in ARCHITECTURES:
            return s
        s = s.removeprefix("sm_").removeprefix("sm")
        try:
            value = float(s)
        except ValueError:
            raise ValueError(f"unknown GPU architecture {cc!r}; allowed: {', '.join(ARCHITECTURES)} "
                             "or a compute capability such as 8.0 / sm80") from None
        cc = value
    if isinstance(cc, tuple):
        major, minor = cc
        num = 10 * int(major) + int(minor)
    elif isinstance(cc, float) and cc < 20:
        num = int(round(cc * 10))
    else:
        num = int(cc)
    if num < 70:
        raise ValueError(f"compute capability {cc!r} is below 7.0; NCCL's model covers Volta and later")
    if num >= 100:
        return "blackwell"
    if num >= 90:
        return "hopper"
    if num >= 80:
        return "ampere"
    return "volta"


@dataclass(frozen=True, slots=True)
class SearchGraph:
    """One NCCL search graph (``struct ncclTopoGraph``) as the tuning model reads it.

    ``n_channels`` and the per-channel bandwidths are the values *after* ``ncclTopoDupChannels``
    but *before* ``ncclTopoPostset`` doubles the communicator's channels (tuning.cc uses these).
    """

    n_channels: int
    """Search channels (``graph->nChannels``)."""
    bw_intra_Bps: float
    """Per-channel intra-node bandwidth (``graph->bwIntra``), bytes/s."""
    bw_inter_Bps: float
    """Per-channel inter-node bandwidth (``graph->bwInter``), bytes/s."""

    @property
    def bw_intra_GBps(self) -> float:
        return self.bw_intra_Bps / GB

    @property
    def bw_inter_GBps(self) -> float:
        return self.bw_inter_Bps / GB


@dataclass(frozen=True, slots=True)
class CommTopology:
    """What NCCL 2.30.7's tuning model needs to know about one communicator's placement.

    Build it with :meth:`from_system` for DGX-like nodes, or directly to reproduce a particular
    ``NCCL_DEBUG=INFO`` graph dump (``Pattern 4, crossNic 0, nChannels 12, bw 20.000000/20.000000``
    gives ``SearchGraph(12, 20e9, 20e9)``).
    """

    n_ranks: int
    n_nodes: int
    gpu_arch: str
    """One of :data:`ARCHITECTURES` (NCCL's ``compCapIndex``)."""
    ring: SearchGraph
    tree: SearchGraph
    n_channels: int
    """Collective channels of the communicator (``comm->nChannels`` after ``ncclTopoPostset``)."""
    intra_link: str = "nvlink"
    """``nvlink`` or ``pci``: NCCL's ``graph->typeIntra == LINK_NVL`` selects the NVLINK latency row."""
    cpu_vendor: str = "intel"
    """``intel``, ``amd`` or ``other``: ``llMaxBws`` row for multi-node and ``getNetOverhead``."""
    nvls: SearchGraph | None = None
    """NVLS search graph (NVLink SHARP); ``None`` where NVLS is unavailable."""
    nvls_channels: int = 0
    """Runtime NVLS/NVLSTree channels (``comm->nvlsChannels``, :func:`nvls_runtime_channels`): Hopper
    16; Blackwell 24 on one node, 24 or 32 on several (nvls.cc)."""
    latency_inter_s: float = 0.0
    """``graph->latencyInter`` in seconds: the NIC latency NCCL reads from the net plugin (0 for IB,
    ``props->latency = 0`` in ``src/transport/net_ib/init.cc``)."""
    same_channels: bool = True
    """``graph->sameChannels`` of the ring graph (Broadcast/Reduce latency)."""
    tree_pattern: str = "balanced_tree"
    """``comm->maxTreePattern``: ``balanced_tree`` (Ampere default), ``split_tree`` or ``tree`` (the
    simple TREE pattern costs x0.85 Tree bandwidth in tuning.cc)."""
    ll128_enabled: bool = True
    """LL128 default enable (tuning.cc): needs intra-node paths up to NVB (NVLink) and GPU-NIC paths
    up to PXB (PXN on Hopper+). False on PCIe-only nodes."""
    p2p_read: bool = False
    """NVLink peers exchange Simple data by P2P *read*: ``ncclTopoCheckP2p`` (``src/graph/paths.cc`` 2.30.7;
    older releases have the same rule) sets ``read = 1`` only on an NVLink path between two GPUs of compute
    capability 8.0 ("Enable P2P Read for Ampere/NVLink only"), and the P2P transport then places the Simple
    FIFO on the sender (``p2p.cc``: the receiver's buffer holds every protocol but Simple), so the receiving
    channel pulls each slice across NVLink itself. True on A100 NVLink nodes; Hopper and later write."""
    nvlink_links: int = 0
    """NVLinks per GPU (12 A100, 18 H100); P2P channels to an NVLink peer are ``2*links``."""
    nics_per_gpu: int = 1
    """NICs local to each GPU (``ncclTopoGetLocalNetCountByBw``), for P2P over the network."""
    nic_bw_Bps: float = 0.0
    """Bandwidth of one NIC as NCCL computes it (``speed*width/8000`` GB/s), bytes/s."""

    def __post_init__(self) -> None:
        if self.n_ranks < 1 or self.n_nodes < 1 or self.n_nodes > self.n_ranks:
            raise ValueError(f"need 1 <= n_nodes <= n_ranks, got {self.n_ranks} ranks, {self.n_nodes} nodes")
        if self.gpu_arch not in ARCHITECTURES:
            raise ValueError(f"unknown gpu_arch {self.gpu_arch!r}; allowed: {', '.join(ARCHITECTURES)}")
        if self.intra_link not in ("nvlink", "pci"):
            raise ValueError(f"unknown intra_link {self.intra_link!r}; allowed: nvlink, pci")
        if self.cpu_vendor not in ("intel", "amd", "other"):
            raise ValueError(f"unknown cpu_vendor {self.cpu_vendor!r}; allowed: intel, amd, other")
        if self.tree_pattern not in ("balanced_tree", "split_tree", "tree"):
            raise ValueError(
                f"unknown tree_pattern {self.tree_pattern!r}; allowed: balanced_tree, split_tree, tree"
            )

    @property
    def ppn(self) -> float:
        """Ranks per node, ``(float)nRanks/nNodes`` as in tuning.cc."""
        return self.n_ranks / self.n_nodes

    @property
    def arch_index(self) -> int:
        """NCCL's ``compCapIndex`` (0 Volta .. 3 Blackwell)."""
        return ARCHITECTURES.index(self.gpu_arch)

    @property
    def nvls_available(self) -> bool:
        """NVLS usable: NVSwitch gen3+ (Hopper or later), >= 2 NVLS channels, and a single node
        (multi-node NVLS needs CollNet/IB SHARP, which tuning.cc disables without ``collnetEnable``)."""
        return self.nvls is not None and self.nvls.n_channels >= 2 and self.n_nodes == 1

    @property
    def nvls_heads(self) -> int:
        """NVLS heads per node (``channel->nvls.nHeads``, connect.cc ``connectNvls``): the distinct first
        GPUs of the NVLS graph's channels, i.e. its channel count -- every GPU on one node, one GPU per
        NIC (the NIC's local GPU, search.cc ``ncclTopoSearchRecNet``) on several. Each head reduces and
        forwards ``1/nHeads`` of the buffer. 0 without an NVLS graph."""
        return self.nvls.n_channels if self.nvls is not None else 0

    @property
    def nvls_tree_available(self) -> bool:
        """NVLSTree usable: an NVLS graph with >= 2 channels (tuning.cc "NVLS/NVLStree needs at least 2
        channels") and several nodes (tuning.cc "Disable NVLS Tree on a single node"). No CollNet needed."""
        return self.nvls is not None and self.nvls.n_channels >= 2 and self.n_nodes > 1

    @classmethod
    def from_system(
        cls,
        gpu_arch: str | int | float | tuple[int, int],
        n_nodes: int,
        ppn: int,
        nvlink_bw_per_gpu_GBps: float,
        nic_bw_GBps: float = 25.0,
        nics_per_node: int = 8,
        cpu_vendor: str = "intel",
        *,
        pcie_bw_GBps: float | None = None,
        nvswitch: bool = True,
        nvswitch_gen: int | None = None,
        latency_inter_s: float = 0.0,
        max_channels: int | None = None,
        n_ranks: int | None = None,
        p2p_read: bool | None = None,
    ) -> CommTopology:
        # Over 80 lines only through its docstring (the search rules and two worked examples, kept next
        # to the code they describe); the body is about 60 lines of one straight-line derivation.
        """Derive NCCL's search graphs and channel counts for ``n_nodes`` DGX-like nodes.

        Args:
            gpu_arch: ``volta``/``ampere``/``hopper``/``blackwell`` or a compute capability.
            n_nodes: nodes in the communicator.
            ppn: ranks (GPUs) per node in the communicator.
            nvlink_bw_per_gpu_GBps: NCCL's app-level NVLink bandwidth per GPU and direction, GB/s
                (``system->totalBw``: links x ``SMxx_NVLINK_BW``; DGX A100 12 x 20 = 240, DGX H100
                18 x 20.6 = 370.8). 0 means a PCIe-only node.
            nic_bw_GBps: bandwidth of one NIC, GB/s (HDR 25, NDR 50; net_ib/init.cc).
            nics_per_node: compute NICs per node (DGX: 8, one per GPU).
            cpu_vendor: ``intel``, ``amd`` or ``other`` (DGX A100: AMD EPYC; DGX H100: Intel Xeon).
            pcie_bw_GBps: GPU/NIC PCIe bandwidth, GB/s; default from the generation
                (:data:`DEFAULT_PCIE_BW_GBPS`).
            nvswitch: GPUs hang off NVSwitches (needed for NVLS).
            nvswitch_gen: NVSwitch generation if known; overrides ``nvswitch`` (0 = none). NVLS needs
                generation >= 3 (NVLink SHARP, Hopper's NVSwitch; hardware_nccl.md §2.2).
            latency_inter_s: ``graph->latencyInter`` in seconds (0 for InfiniBand).
            max_channels: ``NCCL_MAX_NCHANNELS`` / ``maxCTAs`` cap applied last (connect.cc).
            n_ranks: communicator size when nodes hold different numbers of its ranks (``ppn`` is then
                the largest count); default ``n_nodes * ppn``.
            p2p_read: NVLink peers use P2P read (:attr:`p2p_read`); default: an NVLink node of compute
                capability 8.0 (``gpu_arch`` given as 8.0, or the name ``ampere``, which stands for the A100;
                pass False for an sm86 part).

        Rules (all NCCL 2.30.7):

        1. Ring search (``ncclTopoCompute``, search.cc): walk the speed array from the first speed
           <= ``maxBw`` (largest single path: GPU-GPU intra-node, GPU-NIC inter-node); at each speed
           count how many channels fit -- intra-node ``floor(totalBw/speed)`` (every ring channel
           leaves each GPU once over NVLink/PCIe); inter-node one ring per ``floor(min(nic, pcie)/speed)``
           on each of ``min(nics, ppn)`` NICs, and ``nCh*speed*(ppn-1)/ppn <= totalBw`` on NVLink.
           Keep the best ``nCh*speed``; stop when it reaches ``totalBw`` or the next speed is <= 0.49
           of the best (the search's give-up rule). Capped at 32 (``MAXCHANNELS/2``).
        2. ``ncclTopoDupChannels`` (search.cc l.1036): double channels, halve speeds when
           ``bwIntra >= 25`` unless ``cc > 80 and bwIntra < 50 and nCh > 4``.
        3. Tree graph: NCCL searches it with ``min=maxChannels`` = ring channels; we reuse the ring
           graph (NCCL may raise the tree's ``bwIntra`` up to 2x ``bwInter`` for <= 2 nodes; not modelled).
        4. ``ncclTopoPostset`` (connect.cc l.440-506): ``nChannels = min(64, 2*min(ring, tree))``, then
           x2 again when sm90+, multi-node, ``bwIntra > 45`` and ``nChannels < 16``; then the cap.
        5. NVLS (single node, Hopper+, NVSwitch, ppn >= 2): ``nCh = min(32, ppn)`` channels (one head per
           GPU, ``minChannels = maxChannels`` intra-node); ``bwIntra`` = first intra speed with
           ``(nCh+1)*speed <= totalBw`` (every channel loads each GPU once and its head twice,
           ``ncclTopoSearchTryNvls``; ``nCh = ppn`` on today's 8-GPU nodes, 32 on an NVL72); pass 2
           raises ``bwInter`` up the array while it is below ``2*bwIntra``. Runtime channels from
           nvls.cc (Hopper 16, Blackwell 24).
        6. NVLS graph on several nodes (used by NVLSTree; Hopper+, NVSwitch, ppn >= 2 -- ``ncclNvlsInit``
           needs 2 local GPUs): see :func:`_search_nvls_multinode`. Each channel starts at a NIC
           (``ncclTopoSearchRecNet``: NIC bandwidth >= speed, one channel per NIC, its local GPU is the
           head) and loads NVLink as in rule 5, so ``k`` channels fit at speed ``s`` while
           ``(k+1)*s <= totalBw``; the speeds are the *inter* array from ``min(nic, pcie)`` down,
           ``minChannels = 1``, and the search stops at ``min(32, ppn)`` channels. Pass 2 raises
           ``bwInter`` while it stays within ``min(nic, pcie)`` and below ``2*bwIntra``. Runtime
           channels: :func:`nvls_runtime_channels`.

        Results: DGX A100 x1 -> ring 12 @ 20 GB/s, 24 channels; DGX H100 x1 -> 12 @ 30, 24 channels,
        NVLS 8 @ 40/60 with 16 runtime channels; DGX A100 multi-node -> 8 @ 24, 16 channels;
        DGX H100 multi-node -> 8 @ 48, 16 channels (hardware_nccl.md §3.2).

        Worked example, NVLS graph of DGX H100 x N (N >= 2; 8 NDR NICs at 50 GB/s, PCIe Gen5 48 GB/s,
        totalBw = 18 x 20.6 = 370.8 GB/s): pass 1 walks ``sm90SpeedArrayInter`` from 48 (= min(50, 48)):
        48 -> ``370.8/48 = 7.7`` so 6 channels (288); 45 -> 7 (315, kept: more channels); 42 -> 7 (not
        better); 40 -> ``9 x 40 = 360 <= 370.8``, 8 channels = one per NIC = ``maxChannels``, done.
        Pass 2 raises ``bwInter`` 40 -> 42 -> 45 -> 48 (each <= 48 and < 2 x 40; the array ends).
        Graph: **8 channels, bwIntra 40, bwInter 48 GB/s**, 8 heads, 16 runtime channels.
        DGX B200 x N (NVLink5 18 x 40.1 = 721.8 GB/s, 8 NDR NICs, PCIe 48): ``sm100SpeedArrayInter``
        from 48: ``721.8/48 - 1 = 14`` channels fit, capped at the 8 NICs = ``maxChannels``, done at 48;
        pass 2 tries ``bwInter`` 80 > 48 (the NIC refuses) and a higher ``bwIntra`` (still refused).
        Graph: **8 channels, bwIntra 48, bwInter 48 GB/s**, 8 heads; runtime channels 32 on 2 nodes,
        24 on more (``ncclNvlsTreeSm100Tuning``, NIC path 48 GB/s).
        """
        arch = arch_from_compute_capability(gpu_arch)
        if n_nodes < 1 or ppn < 1:
            raise ValueError(f"n_nodes and ppn must be >= 1, got {n_nodes}, {ppn}")
        if nvswitch_gen is not None:
            nvswitch = nvswitch_gen >= 3
        ranks = n_nodes * ppn if n_ranks is None else int(n_ranks)
        if not n_nodes <= ranks <= n_nodes * ppn:
            raise ValueError(f"n_ranks={ranks} outside [{n_nodes}, {n_nodes * ppn}] (n_nodes .. n_nodes*ppn)")
        pcie = DEFAULT_PCIE_BW_GBPS[arch] if pcie_bw_GBps is None else float(pcie_bw_GBps)
        has_nvlink = nvlink_bw_per_gpu_GBps > 0
        total_bw = float(nvlink_bw_per_gpu_GBps) if has_nvlink else pcie
        cc_min = {"volta": 70, "ampere": 80, "hopper": 90, "blackwell": 100}[arch]

        if n_nodes == 1:
            n_ch, speed = _search_intra(SPEED_ARRAY_INTRA[arch], total_bw, total_bw)
        else:
            if nics_per_node < 1 or nic_bw_GBps <= 0:
                raise ValueError("a multi-node communicator needs nics_per_node >= 1 and nic_bw_GBps > 0")
            n_ch, speed = _search_inter(
                SPEED_ARRAY_INTER[arch], total_bw, min(nic_bw_GBps, pcie), min(nics_per_node, ppn), ppn
            )
        bw_intra = bw_inter = speed
        # ncclTopoDupChannels (search.cc l.1036).
        if bw_intra >= 25.0 and not (cc_min > 80 and bw_intra < 50.0 and n_ch > 4):
            dup = min(2 * n_ch, RING_SEARCH_MAX_CHANNELS)
            div = -(-dup // n_ch)
            bw_intra /= div
            bw_inter /= div
            n_ch = dup
        ring = SearchGraph(n_ch, bw_intra * GB, bw_inter * GB)
        tree = ring
        # ncclTopoPostset (connect.cc).
        n_channels = min(MAXCHANNELS, 2 * min(ring.n_channels, tree.n_channels))
        if cc_min >= 90 and n_nodes > 1 and bw_intra > 45.0 and n_channels < 16:
            n_channels = min(MAXCHANNELS, 2 * n_channels)
        if max_channels is not None:
            n_channels = max(1, min(n_channels, int(max_channels)))

        nvls = None
        nvls_channels = 0
        # ncclNvlsInit: NVLS needs 2 GPUs of the communicator in the node (``gpuCount < 2`` returns, NCCL
        # 2.28.7+); NCCL 2.18.1-2.28.6 required 3 (``gpuCount <= 2``), so older logs of 2-GPU groups show
        # Ring's busbw even under NCCL_ALGO=NVLS (nccl #1455, 2024).
        if cc_min >= 90 and has_nvlink and nvswitch and ppn >= 2:
            if n_nodes == 1:
                nvls = _search_nvls(SPEED_ARRAY_INTRA[arch], total_bw, ppn)
            else:
                # One candidate head per NIC: the NIC's local GPU (DGX-like: NIC i next to GPU i).
                nvls = _search_nvls_multinode(SPEED_ARRAY_INTER[arch], total_bw, min(nic_bw_GBps, pcie),
                                              min(ppn, nics_per_node), ppn)
            if nvls is not None:
                nvls_channels = nvls_runtime_channels(arch, n_nodes, ppn, min(nic_bw_GBps, pcie) * GB)
                if max_channels is not None:
                    nvls_channels = max(1, min(nvls_channels, int(max_channels)))

        links = int(round(nvlink_bw_per_gpu_GBps / NVLINK_BW_PER_LINK_GBPS[arch])) if has_nvlink else 0
        # DGX-like: each GPU has one local NIC (1:1 GPU:NIC); fewer NICs are shared.
        nics_per_gpu = 1
        return cls(
            n_ranks=ranks,
            n_nodes=n_nodes,
            gpu_arch=arch,
            ring=ring,
            tree=tree,
            n_channels=n_channels,
            intra_link="nvlink" if has_nvlink else "pci",
            cpu_vendor=cpu_vendor.lower(),
            nvls=nvls,
            nvls_channels=nvls_channels,
            latency_inter_s=latency_inter_s,
            same_channels=True,
            tree_pattern="balanced_tree",
            ll128_enabled=has_nvlink,
            p2p_read=has_nvlink and (_is_sm80(gpu_arch) if p2p_read is None else bool(p2p_read)),
            nvlink_links=links,
            nics_per_gpu=nics_per_gpu,
            nic_bw_Bps=float(nic_bw_GBps) * GB,
        )


def _is_sm80(gpu_arch: str | int | float | tuple[int, int]) -> bool:
    """Compute capability 8.0 (NCCL's P2P read condition); the generation name ``ampere`` counts as the A100."""
    if isinstance(gpu_arch, str) and gpu_arch.strip().lower() in ARCHITECTURES:
        return gpu_arch.strip().lower() == "ampere"
    if isinstance(gpu_arch, str):
        gpu_arch = float(gpu_arch.strip().lower().removeprefix("sm_").removeprefix("sm"))
    if isinstance(gpu_arch, tuple):
        return tuple(int(x) for x in gpu_arch) == (8, 0)
    return int(round(gpu_arch * 10)) == 80 if isinstance(gpu_arch, float) and gpu_arch < 20 else int(gpu_arch) == 80


def _search_intra(speeds: tuple[float, ...], total_bw: float, max_bw: float) -> tuple[int, float]:
    """Single-node ring search: (channels, GB/s per channel). See :meth:`CommTopology.from_system`."""

    def fit(s: float) -> int:
        return min(RING_SEARCH_MAX_CHANNELS, int(math.floor(total_bw / s + _EPS)))

    return _search(speeds, max_bw, total_bw, fit)


def _search_inter(
    speeds: tuple[float, ...], total_bw: float, net_path_bw: float, nics: int, ppn: int
) -> tuple[int, float]:
    """Multi-node ring search: one ring enters and leaves the node through a NIC."""

    def fit(s: float) -> int:
        n = nics * int(math.floor(net_path_bw / s + _EPS))
        if ppn > 1:
            n = min(n, int(math.floor(total_bw * ppn / ((ppn - 1) * s) + _EPS)))
        return min(RING_SEARCH_MAX_CHANNELS, n)

    return _search(speeds, net_path_bw, total_bw, fit)


def _search(speeds, max_bw: float, total_bw: float, fit) -> tuple[int, float]:
    start = 0
    while start < len(speeds) - 1 and speeds[start] > max_bw + _EPS:
        start += 1
    best_n, best_s = 0, speeds[start]
    for i in range(start, len(speeds)):
        s = speeds[i]
        n = fit(s)
        if (n * s > best_n * best_s + _EPS or best_n == 0) and n > 0:
            best_n, best_s = n, s
        if best_n and best_n * best_s >= total_bw - _EPS:
            break
        if best_n and i + 1 < len(speeds) and speeds[i + 1] / best_s <= 0.49:
            break
    if best_n == 0:
        # NCCL falls back to a simple order at 0.1 GB/s ("Could not find a path", search.cc).
        return 1, 0.1
    return best_n, best_s


def _search_nvls(speeds: tuple[float, ...], total_bw: float, ppn: int) -> SearchGraph | None:
    n_ch = min(NVLS_MAX_ARITY, ppn)
    # Every channel loads each GPU's NVLink once and its head's twice, and the n_ch channels have distinct
    # heads: a head carries (n_ch + 1) x speed. n_ch = ppn up to 32 GPUs; an NVL72 domain keeps 32 channels.
    idx = next((i for i, s in enumerate(speeds) if (n_ch + 1) * s <= total_bw + _EPS), None)
    if idx is None:
        return None
    bw_intra = speeds[idx]
    inter_idx = idx
    while inter_idx > 0 and speeds[inter_idx] < 2 * bw_intra:
        inter_idx -= 1
    return SearchGraph(n_ch, bw_intra * GB, speeds[inter_idx] * GB)


def _search_nvls_multinode(
    speeds: tuple[float, ...], total_bw: float, net_path_bw: float, heads: int, ppn: int
) -> SearchGraph | None:
    """NVLS graph of a multi-node communicator (``ncclTopoCompute`` with ``NCCL_TOPO_PATTERN_NVLS`` and
    ``system->inter``, search.cc 2.30.7), in closed form. GB/s in and out of the helper's arithmetic.

    * Each channel: ``ncclTopoSearchRecNet`` picks an unused NIC whose bandwidth is >= ``bwInter``,
      follows NIC -> local GPU and back with ``bwInter`` (PCIe), then ``ncclTopoSearchTryNvls`` loads
      NVSwitch<->GPU with ``bwIntra`` for every GPU and twice for the head. With ``k`` channels (distinct
      heads) a head's NVLink carries ``(k+1)*s``, so ``k = min(heads, floor(totalBw/s) - 1)``.
    * Pass 1 (``bwIntra = bwInter = s``) walks the inter speed array from ``maxBw`` (GPU->NIC path,
      ``min(nic, pcie)``) down, keeping a graph with more channels or more ``nCh*bwInter``
      (``ncclTopoCompareGraphs``), until ``maxChannels = min(32, ppn)`` channels (optimal: done),
      ``nCh*bwInter >= totalBw``, or the next speed is <= 0.49 of the best.
    * Pass 2 raises ``bwInter`` one array step at a time while it is below ``2*bwIntra`` and the NIC
      path still carries it; ``bwIntra`` never moves once ``bwInter`` has been refused.
    """
    max_channels = min(NVLS_MAX_ARITY, ppn)
    start = 0
    while start < len(speeds) - 1 and speeds[start] > net_path_bw + _EPS:
        start += 1
    best_n, best_i = 0, start
    for i in range(start, len(speeds)):
        s = speeds[i]
        n = min(heads, max_channels, int(math.floor(total_bw / s + _EPS)) - 1) if s <= net_path_bw + _EPS else 0
        if n > 0 and (n > best_n or n * s > best_n * speeds[best_i] + _EPS):
            best_n, best_i = n, i
        if best_n == max_channels or (best_n and best_n * speeds[best_i] >= total_bw - _EPS):
            break
        if best_n and i + 1 < len(speeds) and speeds[i + 1] / speeds[best_i] <= 0.49:
            break
    if best_n < 1:
        return None
    bw_intra = speeds[best_i]
    inter_i = best_i
    while inter_i > 0 and speeds[inter_i] < 2 * bw_intra and speeds[inter_i - 1] <= net_path_bw + _EPS:
        inter_i -= 1
    return SearchGraph(best_n, bw_intra * GB, speeds[inter_i] * GB)


def nvls_runtime_channels(arch: str, n_nodes: int, ppn: int, nic_path_bw_Bps: float) -> int:
    """``comm->nvlsChannels`` before the ``minCTAs``/``maxCTAs`` clamp (``ncclNvlsTuning``, nvls.cc 2.30.7).

    Hopper: ``NVLS_NCHANNELS_SM90`` 16. Blackwell: 24 on one node (``NVLS_NCHANNELS_SM100_NVL``), else
    ``NVLS_NCHANNELS_SM100`` 32 refined by ``ncclNvlsTreeSm100Tuning`` from the GPU->NIC path bandwidth
    (``comm->minNetBw``): 2 nodes and >= 48 GB/s -> 32; >= 96 GB/s -> 24 (ppn <= 8) or 32; >= 48 GB/s -> 24.
    Volta and Ampere have no NVLS: 0.
    """
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown gpu_arch {arch!r}; allowed: {', '.join(ARCHITECTURES)}")
    if arch in ("volta", "ampere"):
        return 0
    if arch == "hopper":
        return NVLS_CHANNELS["hopper"]
    if n_nodes <= 1:
        return NVLS_CHANNELS["blackwell"]
    nic = nic_path_bw_Bps / GB
    if n_nodes == 2 and nic >= 48.0:
        return 32
    if nic >= 96.0:
        return 24 if ppn <= 8 else 32
    if nic >= 48.0:
        return 24
    return NVLS_CHANNELS_SM100_MULTINODE


class ChannelPlan(NamedTuple):
    """Channels (CTAs; each holds one SM) and threads per CTA for one collective."""

    n_channels: int
    n_threads: int


def size_scaled_channels(nc: int, nt: int, threshold: int, n_bytes: int) -> tuple[int, int]:
    """``topoGetAlgoInfo``'s Ring/Tree rule (enqueue.cc 2.30.7): ``while nBytes < nc*nt*threshold:
    nc -= 1`` (down to 1); then halve ``nt`` while the same holds and ``nt % 128 == 0``."""
    while n_bytes < nc * nt * threshold and nc >= 2:
        nc -= 1
    while n_bytes < nc * nt * threshold and nt % 128 == 0:
        nt //= 2
    return nc, nt
