"""The ``workbench`` command: models, topologies, tasks, rollouts, training, export, runs and the demo."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from workbench.reports.command import add_reproduce_command

#: What ``workbench --help`` says first (the docstring's markup would show as written).
DESCRIPTION = (
    "The workbench command: models, topologies, tasks, rollouts, training, export, runs and the demo."
)


def _models(args: argparse.Namespace) -> int:
    from workbench import models

    if args.action == "list":
        for info in models.list_models():
            state = f"cached at {info.path}" if info.cached else "not built yet"
            print(f"{info.name:14} {state}\n{'':14} {info.description}")
        return 0
    print(models.prepare(args.name))
    return 0


def _topology(args: argparse.Namespace) -> int:
    from workbench import topology
    from workbench.engine import plugins

    plugins.import_modules(args.plugins)  # a spec may name the tool kinds and verifiers they register

    if args.action == "list":
        print("\n".join(topology.library()))
    elif args.action == "schema":
        print(json.dumps(topology.json_schema(), indent=2))
    elif args.action == "diagram":
        from workbench.topology.diagram import save

        spec, signals = topology.load(args.source), None
        if args.run:  # the run's own topology, coloured by its signals at a step
            from workbench.analysis.signals import graph_signals, run_topology_of

            spec = run_topology_of(args.run)
            signals = graph_signals(args.run, args.step, args.colour_by, spec)
        out = args.out or f"{spec.name}.svg"
        print(f"wrote {save(spec, out, signals)}")
    elif args.action == "show":
        print(topology.to_yaml(topology.load(args.source)), end="")
    else:  # validate: the spec's own checks and the registries' (parsers, verifiers, tool kinds, ...)
        from workbench.engine.spec_checks import load

        spec = load(args.source)
        print(f"ok: '{spec.name}' has {len(spec.roles)} roles and {len(spec.flow.nodes)} flow nodes")
    return 0


def _tasks(args: argparse.Namespace) -> int:
    from workbench import tasks

    if args.action == "list":
        print("\n".join(tasks.list_generators()))
        return 0
    generated = tasks.generate(args.name, n=args.n, seed=args.seed)
    if args.out:
        tasks.save_jsonl(generated, args.out)
        print(f"wrote {len(generated)} tasks to {args.out}")
    else:
        for task in generated:
            print(json.dumps(task.to_dict()))
    return 0


def _rollout(args: argparse.Namespace) -> int:
    from workbench import tasks
    from workbench.runs import rollout

    if args.tasks in tasks.list_generators():
        task_list = tasks.generate(args.tasks, n=args.n, seed=args.seed)
    elif not os.path.exists(args.tasks) and not os.path.splitext(args.tasks)[1]:
        known = ", ".join(tasks.list_generators())
        raise ValueError(
            f"no task generator or file '{args.tasks}': use a generator ({known}) or a JSONL/Parquet path"
        )
    else:
        task_list = tasks.load_tasks(args.tasks)[: args.n]
    result = rollout(
        args.topology,
        task_list,
        model=args.model,
        backend=args.backend,
        group_size=args.group_size,
        max_tokens=args.max_tokens,
        runs_dir=args.runs_dir,
        seed=args.seed,
    )
    print(result)
    print(result.summary_text())
    return 0


def _runs(args: argparse.Namespace) -> int:
    from workbench.store import list_runs

    runs = list_runs(args.runs_dir)
    if len(runs):
        runs["created_at"] = runs["created_at"].map(local_time)
    print(runs.to_string(index=False) if len(runs) else f"no runs in {args.runs_dir}")
    return 0


def local_time(seconds: float | None) -> str:
    """A time stamp (seconds since the epoch) as a local ISO time with its offset: 2026-05-01T14:03:22+02:00."""
    from datetime import datetime

    if seconds is None or seconds != seconds:  # NaN: a run whose database could not be read
        return "-"
    return datetime.fromtimestamp(float(seconds)).astimezone().isoformat(timespec="seconds")


def _migrate(args: argparse.Namespace) -> int:
    """Each run under the paths at this code's schema; a run open for writing or unreadable is named, and
    the exit status is 1 then."""
    from workbench.store import RunStore, StoreError
    from workbench.store.layout import DB_NAME

    failed = 0
    for path in map(Path, args.paths):
        runs = [path] if (path / DB_NAME).is_file() else sorted(p.parent for p in path.glob(f"*/{DB_NAME}"))
        if not runs:
            print(f"{path}: no runs" if path.is_dir() else f"{path}: no such directory")
            failed += not path.is_dir()
        for run_dir in runs:
            try:
                before, after = RunStore.upgrade(run_dir)
            except StoreError as error:
                print(f"{run_dir}: left as it is: {error}")
                failed += 1
                continue
            print(f"{run_dir}: " + (f"v{before} -> v{after}" if after > before else f"v{after}, current"))
    return 1 if failed else 0


def _demo(args: argparse.Namespace) -> int:
    from workbench.demo import main

    return main(
        model=args.model,
        n_tasks=args.n,
        runs_dir=args.runs_dir,
        train_steps=args.train_steps,
        eval_tasks=args.eval_tasks,
        learning_rate=args.learning_rate,
        reports_out=args.out,
    )


def _train(args: argparse.Namespace) -> int:
    from workbench.rl.config import SECTIONS, TrainConfig, load_yaml
    from workbench.training import CONFIG_FILE, create, run_config, run_here

    if args.help_config:
        print(TrainConfig.help())
        return 0
    overrides = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set {item!r}: write FIELD=VALUE")
        key, value = key.strip(), load_yaml(value)  # as in a config file: 1e-5 is a number
        if isinstance(value, dict) and key in SECTIONS:  # a section's fields, each over the config's own
            overrides.update({f"{key}.{name}": v for name, v in value.items()})
        else:
            overrides[key] = value
    if args.resume:
        run_dir = Path(args.resume)
        if overrides:
            merged = {**run_config(run_dir).to_dict(), **overrides}
            (run_dir / CONFIG_FILE).write_text(TrainConfig.from_dict(merged).to_yaml())
    else:
        base = TrainConfig.from_yaml(args.config).to_dict() if args.config else {}
        run_dir = create(TrainConfig.from_dict({**base, **overrides}))
    print(f"training in {run_dir} (stop with Ctrl-C or by creating {run_dir / 'STOP'})", flush=True)
    status = run_here(run_dir)
    print(f"run {status}: {run_dir}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from workbench.rl.export import export_model

    out = export_model(args.run_dir, args.out, policy=args.policy)
    print(f"trained weights of {args.run_dir} written to {out} (serve it as model: {out})")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from widgets.server.serve import serve

    serve(
        args.runs_dir,
        address=args.address,
        port=args.port,
        users_file=args.users,
        cookie_secret_file=args.cookie_secret_file,
        allow_origin=args.allow_origin or None,
        show=False,
        ssl_certfile=args.ssl_certfile,
        ssl_keyfile=args.ssl_keyfile,
    )
    return 0


def _users(args: argparse.Namespace) -> int:
    import getpass

    from widgets.server.access import add_user

    password = os.environ.get("WORKBENCH_PASSWORD") or getpass.getpass(f"password for {args.name}: ")
    add_user(args.file, args.name, password, args.role)
    print(f"{args.name} ({args.role}) written to {args.file}")
    return 0


def _memory_plan(args: argparse.Namespace) -> int:
    from workbench.rl.memory_plan import markdown, plan, table

    plans = [
        plan(
            model,
            gpus=gpus,
            gpu_memory_gib=args.gpu_memory,
            policies=policies,
            roles=args.roles,
            lora_rank=args.lora_rank,
            gradient_checkpointing=not args.no_checkpointing,
            token_budget=args.token_budget,
            mixed_precision=not args.fp32,
            reference=args.reference,
            headroom=args.headroom,
        )
        for model in args.models
        for policies in args.policies
        for gpus in args.gpus
    ]
    print(markdown(plans) if args.markdown else table(plans).to_string(index=False))
    return 0 if all(p.fits for p in plans) or args.markdown else 1


def _add_models_command(sub: argparse._SubParsersAction) -> None:
    """The ``models`` subcommand."""
    p = sub.add_parser("models", help="list or prepare local models")
    p.add_argument("action", choices=["list", "prepare"])
    p.add_argument("name", nargs="?", default="smollm2-135m")
    p.set_defaults(func=_models)


def _add_topology_command(sub: argparse._SubParsersAction) -> None:
    """The ``topology`` subcommand."""
    p = sub.add_parser("topology", help="list, show, validate or draw topologies, or print their JSON Schema")
    p.add_argument("action", choices=["list", "show", "validate", "schema", "diagram"])
    p.add_argument("source", nargs="?", default="marsrl", help="built-in name or YAML/JSON file")
    p.add_argument("--out", help="diagram file (.svg or .html; default: NAME.svg)")
    p.add_argument(
        "--run", help="diagram: draw this run's topology coloured by its signals (a run directory)"
    )
    p.add_argument("--step", type=int, help="diagram --run: the step (default: the last complete one)")
    p.add_argument(
        "--colour-by",
        default="reward/mean",
        help="diagram --run: the role measure that colours the nodes (accuracy, format/rate, grad_share, kl, "
        "replay/advantage; default reward/mean)",
    )
    p.add_argument(
        "--plugins",
        nargs="+",
        default=[],
        metavar="MODULE",
        help="modules to import first: their tool kinds, verifiers and parsers are then known to the spec",
    )
    p.set_defaults(func=_topology)


def _add_tasks_command(sub: argparse._SubParsersAction) -> None:
    """The ``tasks`` subcommand."""
    p = sub.add_parser("tasks", help="list task generators or generate tasks")
    p.add_argument("action", choices=["list", "generate"])
    p.add_argument("name", nargs="?", default="arithmetic")
    p.add_argument("--n", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="JSONL file to write (default: print)")
    p.set_defaults(func=_tasks)


def _add_rollout_command(sub: argparse._SubParsersAction) -> None:
    """The ``rollout`` subcommand."""
    p = sub.add_parser("rollout", help="run a topology over tasks and store the calls")
    p.add_argument("topology", help="built-in name or YAML/JSON file")
    p.add_argument("--tasks", default="arithmetic", help="generator name or a JSONL/Parquet file")
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--group-size", type=int, default=1, help="episodes per task (a GRPO group)")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--backend", default="hf")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--runs-dir", default="runs")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_rollout)


def _add_train_command(sub: argparse._SubParsersAction) -> None:
    """The ``train`` subcommand."""
    p = sub.add_parser("train", help="train a topology (GRPO) from a config file, or resume a run")
    p.add_argument("config", nargs="?", help="training config YAML (see: workbench train --help-config)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a config field: its flat name (learning_rate) or section.name (optimizer.learning_rate)",
    )
    p.add_argument("--resume", metavar="RUN_DIR", help="continue this run from its newest checkpoint")
    p.add_argument(
        "--help-config", action="store_true", help="list every config field by section, with its help"
    )
    p.set_defaults(func=_train)


def _add_export_command(sub: argparse._SubParsersAction) -> None:
    """The ``export`` subcommand."""
    p = sub.add_parser("export", help="write a run's trained model as a transformers checkpoint directory")
    p.add_argument("run_dir", help="the training run (its newest checkpoint is exported)")
    p.add_argument("out", help="directory to write (config, safetensors weights, tokenizer)")
    p.add_argument("--policy", help="which policy, for runs with several (default: the first)")
    p.set_defaults(func=_export)


def _add_runs_command(sub: argparse._SubParsersAction) -> None:
    """The ``runs`` subcommand."""
    p = sub.add_parser("runs", help="list the runs in a directory")
    p.add_argument("runs_dir", nargs="?", default="runs")
    p.set_defaults(func=_runs)


def _add_migrate_command(sub: argparse._SubParsersAction) -> None:
    """The ``migrate`` subcommand."""
    p = sub.add_parser("migrate", help="bring older runs up to this workbench's store schema")
    p.add_argument(
        "paths", nargs="*", default=["runs"], help="runs directories or run directories (default: runs)"
    )
    p.set_defaults(func=_migrate)


def _add_serve_command(sub: argparse._SubParsersAction) -> None:
    """The ``serve`` subcommand."""
    p = sub.add_parser("serve", help="serve the team dashboard over a runs directory (Panel)")
    p.add_argument("runs_dir", nargs="?", default="runs")
    p.add_argument(
        "--address", default="127.0.0.1", help="bind address; anything but localhost needs --users"
    )
    p.add_argument("--port", type=int, default=5006)
    p.add_argument(
        "--users", help="users file (JSON: name -> role and password hash); see: workbench users add"
    )
    p.add_argument(
        "--cookie-secret-file", help="file holding the session cookie secret (else $WORKBENCH_COOKIE_SECRET)"
    )
    p.add_argument("--allow-origin", action="append", help="host:port browsers use to reach the server")
    p.add_argument(
        "--ssl-certfile", help="serve HTTPS with this certificate (PEM); the session cookie is then Secure"
    )
    p.add_argument(
        "--ssl-keyfile", help="the certificate's private key (PEM), unless the certificate file holds it"
    )
    p.set_defaults(func=_serve)


def _add_users_command(sub: argparse._SubParsersAction) -> None:
    """The ``users`` subcommand."""
    p = sub.add_parser("users", help="add a dashboard user to a users file")
    p.add_argument("action", choices=["add"])
    p.add_argument("file")
    p.add_argument("name")
    p.add_argument("--role", choices=["viewer", "operator"], default="viewer")
    p.set_defaults(func=_users)


def _add_memory_plan_command(sub: argparse._SubParsersAction) -> None:
    """The ``memory-plan`` subcommand."""
    p = sub.add_parser(
        "memory-plan",
        help="GiB per trainer rank (FSDP2) for a model: parameters, gradients, AdamW, activations; fits or not",
    )
    p.add_argument(
        "models", nargs="+", help="named shapes (qwen2.5-0.5b, qwen3-14b, ...), tiny, or checkpoint dirs"
    )
    p.add_argument(
        "--gpus", type=int, nargs="+", default=[1], help="FSDP ranks, one GPU each (several: a row each)"
    )
    p.add_argument("--gpu-memory", type=float, default=80.0, help="GiB of each GPU (default %(default)s)")
    p.add_argument(
        "--policies", nargs="+", choices=["shared", "separate", "lora"], default=["shared"], help="a row each"
    )
    p.add_argument("--roles", type=int, default=1, help="policies: separate models or LoRA adapters")
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument("--token-budget", type=int, default=8192, help="tokens per micro-batch")
    p.add_argument("--no-checkpointing", action="store_true", help="keep every layer's activations")
    p.add_argument("--fp32", action="store_true", help="fp32 compute (default: bf16 over fp32 masters)")
    p.add_argument("--reference", action="store_true", help="and a frozen KL reference model (kl_coef > 0)")
    p.add_argument("--headroom", type=float, default=0.1, help="share of each GPU kept free")
    p.add_argument(
        "--markdown", action="store_true", help="a markdown table (GiB per rank), as in docs/memory.md"
    )
    p.set_defaults(func=_memory_plan)


def _add_demo_command(sub: argparse._SubParsersAction) -> None:
    """The ``demo`` subcommand."""
    p = sub.add_parser(
        "demo", help="the main job: MarsRL's Solver and Verifier on the local model: roll out, train, figures"
    )
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--n", type=int, default=4, help="problems in the first rollout")
    p.add_argument("--runs-dir", default="runs")
    p.add_argument("--train-steps", type=int, default=12, help="training steps after the rollout (0: none)")
    p.add_argument("--eval-tasks", type=int, default=64, help="held-out problems scored before and after")
    p.add_argument("--learning-rate", type=float, default=3e-5)
    p.add_argument("--out", default="reports-out", help="where the regenerated MarsRL figures go")
    p.set_defaults(func=_demo)


#: Each subcommand's parser, in the order ``workbench --help`` lists them.
SUBCOMMANDS = (
    _add_models_command,
    _add_topology_command,
    _add_tasks_command,
    _add_rollout_command,
    _add_train_command,
    _add_export_command,
    _add_runs_command,
    _add_migrate_command,
    _add_serve_command,
    _add_users_command,
    add_reproduce_command,
    _add_memory_plan_command,
    _add_demo_command,
)


def build_parser() -> argparse.ArgumentParser:
    """The ``workbench`` command's parser: one subcommand a function above."""
    parser = argparse.ArgumentParser(prog="workbench", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def quiet_progress_bars() -> None:
    """No progress bars where stderr is not a terminal (a log file, CI): they fill logs with carriage returns.

    Set in the environment, so the processes a command starts (a training child, papermill) inherit it.
    """
    if not sys.stderr.isatty():
        os.environ.setdefault("TQDM_DISABLE", "1")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    quiet_progress_bars()
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # noqa: BLE001 - the command line shows one clear line, not a traceback
        if os.environ.get("WORKBENCH_DEBUG"):
            raise
        message = str(error).strip() or type(error).__name__
        print(f"error: {message}\n(set WORKBENCH_DEBUG=1 for the traceback)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
