"""The ``workbench reproduce`` command: its arguments, and training the report plan (with several seeds), writing
the claims across seeds and drawing the papers' notebooks from them (``workbench.cli`` adds it to its parser)."""

from __future__ import annotations

import argparse
import shlex
import sys


def add_reproduce_command(sub: argparse._SubParsersAction) -> None:
    """The ``reproduce`` subcommand."""
    p = sub.add_parser("reproduce", help="regenerate the papers' figures and tables from runs (papermill)")
    p.add_argument("paper", help="all, or one of: mars, marsrl, matpo, hira, mas_orchestra")
    p.add_argument(
        "--runs",
        default="",
        help="'label=run_dir,...', a run directory or summary, or a folder of them "
        "(default: the summaries committed in reports/runs)",
    )
    p.add_argument("--out", default="reports-out", help="where figures, executed notebooks and index.html go")
    p.add_argument("--benchmark", default="", help="benchmark subset the notebooks restrict to (empty: all)")
    p.add_argument("--workers", type=int, default=2, help="notebooks executed at once")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per notebook")
    p.add_argument(
        "--train",
        action="store_true",
        help="first train each paper's runs (workbench.reports.plan) into --runs-dir, resuming what an "
        "interruption left, then draw the notebooks from them",
    )
    p.add_argument("--quick", action="store_true", help="--train: a fifth of the steps, fewer held-out tasks")
    p.add_argument(
        "--runs-dir", default="runs/reproduce", help="--train: where the runs go (default %(default)s)"
    )
    p.add_argument("--model", default=None, help="--train: the model (default smollm2-135m)")
    p.add_argument(
        "--summaries",
        default=None,
        help="--train: also write each run's summary (a few KB to commit) to this folder, e.g. reports/runs; "
        "--seeds-table: read the summaries there (default reports/runs)",
    )
    p.add_argument(
        "--seeds",
        default=None,
        help="--train: make every run once per seed, e.g. 0,1,2 (seed k > 0 in <name>-seed<k>/, its summary "
        "likewise; resumable); default: once, with the config's seed",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="the seed whose runs the notebooks draw where the runs hold several (default 0: the folders "
        "named after the plan's runs)",
    )
    p.add_argument(
        "--seeds-table",
        action="store_true",
        help="write the gallery's claims across seeds (every seed's value, mean ± SE, verdict) from the "
        "summaries into --gallery; without --train that is all it does",
    )
    p.add_argument(
        "--gallery",
        default=None,
        help="--seeds-table: the page to write it into (default docs/gallery.md, between its seeds markers)",
    )
    p.set_defaults(func=reproduce_command)


def reproduce_command(args: argparse.Namespace) -> int:
    """What ``workbench reproduce`` does with its arguments; the exit code."""
    from workbench.reports.reproduce import reproduce, summarise

    runs = args.runs
    seed = args.seed
    if args.train:  # make (or finish) the plan's runs first, then draw the notebooks from them
        from workbench.reports.plan import export_summaries, make_runs, parse_seeds, runs_argument, seed_runs

        if runs:
            print("error: --train makes the runs; leave out --runs (or pass --runs-dir)", file=sys.stderr)
            return 2
        try:
            seeds = parse_seeds(args.seeds) if args.seeds else None
        except ValueError as error:
            print(f"error: --seeds: {error}", file=sys.stderr)
            return 2
        scale = "quick" if args.quick else "full"
        made = make_runs(args.runs_dir, args.paper, scale, args.model, seeds=seeds)
        if args.summaries:
            command = shlex.join(
                ["workbench", "reproduce", args.paper, "--train"]
                + ["--quick"] * args.quick
                + (["--model", args.model] if args.model else [])
                + (["--seeds", args.seeds] if args.seeds else [])
                + ["--runs-dir", args.runs_dir, "--summaries", args.summaries]
            )
            for name, path in export_summaries(made, args.summaries, command, scale).items():
                print(f"{name}: summary in {path}")
        if seed is None:  # the notebooks draw seed 0's runs, else the first seed's
            seed = 0 if seeds is None or 0 in seeds else seeds[0]
        drawn = seed_runs(made, seed)
        if not drawn:
            print(
                f"error: --seed {seed}: no run of that seed was made (--seeds {args.seeds})", file=sys.stderr
            )
            return 2
        runs = runs_argument(drawn)
        seed = 0  # the runs are given by name: nothing left to choose among
    if args.seeds_table:  # the gallery's claims across seeds, from the summaries (or the runs just made)
        from workbench.reports.seeds import GALLERY, write_seeds_table
        from workbench.reports.series import COMMITTED_RUNS

        folder = args.summaries or (args.runs_dir if args.train else str(COMMITTED_RUNS))
        print(write_seeds_table(folder, args.gallery or GALLERY))
        print(f"claims across seeds written into {args.gallery or GALLERY}")
        if not args.train:
            return 0
    results = reproduce(
        args.paper,
        runs,
        args.out,
        benchmark=args.benchmark,
        workers=args.workers,
        timeout=args.timeout,
        seed=seed or 0,
    )
    return summarise(results, args.out)
