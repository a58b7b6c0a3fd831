"""``trainsim search``: the best parallel plan for a scenario's model on its cluster, under memory limits.

    trainsim search llama3-8b-tp2-dgx-h100
    trainsim search sc21-gpt-18b --fix parallel.recompute_granularity=full --top-k 10 --workers 2
    trainsim search my.toml --space parallel.tensor_model_parallel_size=4,8 --emit-scenario best.toml

The scenario gives the model, the system and the training (global batch, sequence, dtype); its own
``[parallel]`` plan is simulated beside the search's for comparison. Every plan of the space -- TP
(+SP), CP, EP (MoE), PP (1F1B or interleaved, with its depth; uneven first/last stages where PP does not
divide the layers), DP with ZeRO 0-3 (3 = FSDP, also with PP), micro-batch size, recomputation,
gradient-reduce and parameter-gather overlap, TP communication overlap (tp_comm_overlap or async_tp),
rank order -- is checked (invalid plans are
reported by reason) and estimated by an analytic screen (memory model, kernel cost model, NCCL's tuner,
the pipeline-bubble closed form), and its 300 fastest re-priced by short simulations on the ``--workers``
pool; ``--top-k`` plans that fit (the best of the screen's K/2 fastest shapes,
then K/2 variants of the shapes that simulated fastest), the baseline (plain DP or FSDP if it fits, else
Megatron-LM's recipe) and the scenario's plan are then co-simulated in parallel, and ranked.

``--fix section.key=value`` pins a knob, ``--space section.key=v1,v2`` restricts one (keys:
parallel.tensor_model_parallel_size, parallel.sequence_parallel, parallel.context_parallel_size,
parallel.expert_model_parallel_size, parallel.pipeline_model_parallel_size,
parallel.virtual_pipeline_model_parallel_size, parallel.zero_stage, parallel.recompute_granularity,
parallel.overlap_grad_reduce, parallel.overlap_param_gather, parallel.tp_comm_overlap, parallel.async_tp,
parallel.rank_order, parallel.num_layers_in_first_pipeline_stage, parallel.num_layers_in_last_pipeline_stage
(a layer count or none), training.micro_batch_size, training.recompute_method (uniform, block),
training.recompute_num_layers).

Exit status: 0 with a recommended plan; 2 for bad input (one line on stderr; also a space without a
valid plan, naming the value at fault); 3 when no plan fits in
GPU memory (stderr names the closest plan and what it lacks).
"""

from __future__ import annotations

import argparse
import sys

from scenarios.cli import UserError, add_trust_code, output_file

EXIT_NO_PLAN = 3
"""Exit status when no valid plan of the space fits (a space without a valid plan is bad input: 2)."""


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "search", help="find the fastest parallel plan that fits in memory (screen, then simulate the best)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", help="scenario TOML file or catalog name (model, system, training)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a key of the scenario first (repeatable), e.g. --set system.nodes=4")
    p.add_argument("--fix", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="pin one knob of the plan (repeatable)")
    p.add_argument("--space", action="append", default=[], metavar="SECTION.KEY=V1,V2",
                   help="restrict one knob to these values (repeatable)")
    p.add_argument("--top-k", type=int, default=20, metavar="K", help="plans to co-simulate (default 20)")
    p.add_argument("--top-k-rule", choices=("shapes", "screen"), default="shapes",
                   help="shapes (default): the best plan of the screen's K/2 fastest shapes (TP, CP, EP, PP, VPP, DP, "
                        "micro-batch, recompute), then K/2 variants of the shapes that simulated fastest; "
                        "screen: the screen's K fastest as ranked")
    p.add_argument("--max-tasks", type=float, default=None, metavar="N",
                   help="skip a plan whose simulation would run more tasks, as trainsim run refuses it "
                        "(default: run's, 2,000,000)")
    p.add_argument("--workers", type=int, default=2, metavar="N", help="local worker processes (default 2)")
    p.add_argument("--executor", default=None, metavar="SPEC",
                   help="'process' (default: a local pool of --workers) or dask://HOST:PORT (needs trainsim[dask])")
    p.add_argument("--cache", metavar="PATH", default=None,
                   help="JSONL cache of the simulations (the top K's and the re-pricing's): an interrupted "
                        "search resumes from it")
    p.add_argument("--json", metavar="PATH", default=None, help="write every plan's estimate (and simulation)")
    p.add_argument("--plot", metavar="PATH", default=None, help="PNG: time vs memory of the plans, Pareto front")
    p.add_argument("--emit-scenario", metavar="PATH", default=None, help="write the best plan as a scenario file")
    add_trust_code(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # deferred: the search imports the runner, hence torch
    from scenarios.cmd_run import load
    from scenarios.report import write_json
    from scenarios.runner import DEFAULT_MAX_TASKS
    from scenarios.search.driver import NoFeasiblePlan, run_search
    from scenarios.search.report import emit_scenario, format_search, plot_pareto, search_json
    from scenarios.search.simulate import CACHE_SCHEMA, check_cache, make_executor, stale_records
    from scenarios.search.space import parse_knobs

    if args.top_k < 1:
        raise UserError(f"--top-k must be >= 1, got {args.top_k}")
    max_tasks = DEFAULT_MAX_TASKS if args.max_tasks is None else args.max_tasks
    if not max_tasks > 0:
        raise UserError(f"--max-tasks must be a positive number, got {args.max_tasks:g}")
    if args.workers < 1:
        raise UserError(f"--workers must be >= 1, got {args.workers}")
    parse_knobs(args.fix, args.space)  # bad keys and values fail before any tracing
    # output paths too, before minutes of search (a typo must not become a new tree of folders)
    outputs = {opt: output_file(opt, v) for opt, v in (("--json", args.json), ("--plot", args.plot),
                                                        ("--emit-scenario", args.emit_scenario),
                                                        ("--cache", args.cache)) if v}
    if args.cache:
        check_cache(args.cache)
    scenario = load(args.scenario, args.overrides, args.trust_code)
    stale = stale_records(args.cache)
    if stale:  # said once, here: each round of simulations re-reads the cache
        print(f"trainsim search: --cache {args.cache}: {stale} cached plan{'s' if stale != 1 else ''} written by an "
              f"older trainsim (cache schema other than {CACHE_SCHEMA}) ignored; simulated again where picked",
              file=sys.stderr)
    executor, close = (None, None) if args.executor is None and args.workers == 1 else make_executor(
        args.executor, args.workers)
    try:
        res = run_search(scenario, fix=args.fix, space=args.space, top_k=args.top_k, executor=executor,
                         cache=args.cache, progress=sys.stderr.isatty(),
                         top_k_rule=args.top_k_rule, max_tasks=max_tasks)
    except NoFeasiblePlan as exc:
        print(f"trainsim search: no feasible plan: {exc}", file=sys.stderr)
        return EXIT_NO_PLAN
    finally:
        if close is not None:
            close()
    print(format_search(res))
    written = []
    if "--json" in outputs:
        written.append(write_json(outputs["--json"], search_json(res)))
    if "--plot" in outputs:
        written.append(plot_pareto(res, outputs["--plot"]))
    if "--emit-scenario" in outputs:
        written.append(emit_scenario(res, outputs["--emit-scenario"]))
    if written:
        print("\nWrote " + ", ".join(str(p) for p in written))
    if res.best is None:
        print("trainsim search: no simulated plan ran; see the errors above", file=sys.stderr)
        return EXIT_NO_PLAN
    return 0
