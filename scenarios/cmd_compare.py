"""``trainsim compare``: the model's prediction against a measured Kineto trace.

    trainsim compare --kineto trace.json.gz --scenario my-model.toml [--calibration cluster.toml]

Pairs the trace's steady step with the scenario's model as ``trainsim calibrate`` does, then prints
predicted against measured kernel time per kernel kind and per layer, the ten largest deviations, the
unmatched work of either side, and the end-to-end difference (simulated iteration against the step).
With ``--calibration`` (or the scenario's ``[simulation] calibration``) the profile's values are used.
"""

from __future__ import annotations

import argparse

from scenarios.cli import UserError, add_trust_code


def register(subparsers) -> None:
    p = subparsers.add_parser("compare", help="predicted vs measured per kernel kind and layer, from a Kineto trace",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kineto", metavar="TRACE", required=True,
                   help="PyTorch profiler (Kineto) trace, .json or .json.gz")
    p.add_argument("--scenario", required=True, help="the traced model's scenario (a TOML file or catalog name)")
    add_trust_code(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hwmodel import calibration_overlay
    from hwmodel.costmodel import Calibration
    from scenarios.calibrate import CalibrationInputError
    from scenarios.calibrate.compare import format_compare, pair_rows
    from scenarios.calibrate.pipeline import pair_trace, simulate
    from scenarios.cmd_run import load
    from scenarios.runner import scenario_profile

    scenario = load(args.scenario, [], args.trust_code)
    try:
        paired = pair_trace(args.kineto, scenario)
    except CalibrationInputError as exc:
        raise UserError(str(exc)) from None
    overlay = calibration_overlay.active() or scenario_profile(scenario)
    with calibration_overlay.applied(overlay):
        cal = Calibration.load().for_gpu(paired.prep.topology.gpu_spec)
        rows = pair_rows(paired.matching, paired.model, cal)
        simulated = simulate(paired.prep, overlay)
    name = f"{overlay.name} ({overlay.path})" if overlay else "shipped calibration.toml"
    print(format_compare(rows, paired.matching, paired.trace.step_time_s, simulated, name), end="")
    return 0
