"""P² in trainsim: parallelism placement and reduction-program synthesis (Xie et al., MLSys 2022).

Modules in reading order: :mod:`~scenarios.p2.hierarchy` (system levels), :mod:`~scenarios.p2.placement`
(parallelism matrices, device <-> axis coordinates, reduction groups), :mod:`~scenarios.p2.programs`
(the reduction language and its state semantics), :mod:`~scenarios.p2.synth` (enumeration with
pruning), :mod:`~scenarios.p2.cost` (alpha-beta pre-screen), :mod:`~scenarios.p2.rank` (lowering to
per-rank NCCL programs and simulating), :mod:`~scenarios.p2.report` (``run_synth``, ``plot_spread``,
``p2_findings``).
"""

from scenarios.p2.hierarchy import Hierarchy
from scenarios.p2.placement import Placement, enumerate_placements, parallelism_matrices
from scenarios.p2.programs import FORMS, OPS, InvalidStep, Step, SynthSpace, program_label
from scenarios.p2.report import FindingsReport, SynthReport, p2_findings, plot_spread, run_synth
from scenarios.p2.synth import default_program, synthesize

__all__ = [
    "FORMS", "OPS", "FindingsReport", "Hierarchy", "InvalidStep", "Placement", "Step", "SynthReport",
    "SynthSpace", "default_program", "enumerate_placements", "p2_findings", "parallelism_matrices",
    "plot_spread", "program_label", "run_synth", "synthesize",
]
