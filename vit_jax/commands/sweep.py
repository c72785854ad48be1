"""`vit-jax sweep`: run a scaling sweep, show its status, write the compute-versus-accuracy report, plan a budget.

    vit-jax sweep run CONFIG[:ARG] --root DIR [--launcher local|tpu|slurm] [--preflight] [--only GLOB] [--dry-run]
    vit-jax sweep status CONFIG[:ARG] --root DIR
    vit-jax sweep report DIR [--metric eval/top1] [--compare-paper] [--progress examples|epochs|steps|exaflops]
                             [--finetune-root FT_DIR ...] [--bootstrap N] [--seed S] [--fit-final-only]
    vit-jax sweep suggest (DIR | --paper) --budget-exaflops X [--family ViT]

See docs/sweeps.md.
"""

from __future__ import annotations

import argparse
import sys

from vit_jax import cli_args
from vit_jax.sweep.launchers import LAUNCHERS, TRAINER_ENV


def _parser() -> argparse.ArgumentParser:
    parser = cli_args.ArgumentParser(prog="vit-jax sweep", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run every run of a sweep (finished runs are skipped, so this also resumes)")
    run.add_argument("config", help="sweep file, e.g. configs/sweeps/demo_scaling.py (optionally FILE.py:ARG)")
    run.add_argument("--root", required=True, help="sweep directory: one workdir per run below it")
    run.add_argument("--launcher", default="local", choices=LAUNCHERS,
                     help="local: subprocesses here, one after another; tpu/slurm: launch/ scripts")
    run.add_argument("--launcher-arg", action="append", default=[], metavar="ARG",
                     help="extra flag for the launch/ script (repeatable), e.g. --launcher-arg=--name=my-pod")
    run.add_argument("--preflight", action="store_true",
                     help="--launcher=tpu: compile each run for the pod's topology here first (TPU compiler, no TPU "
                          "needed) and do not start runs that do not fit")
    run.add_argument("--trainer", default=None,
                     help=f"command that trains (default: ${TRAINER_ENV}, else `python -m vit_jax.main`)")
    run.add_argument("--only", action="append", default=None, metavar="GLOB",
                     help="run only the runs whose names match (repeatable)")
    run.add_argument("--dry-run", action="store_true", help="print every run's command and status; launch nothing")
    run.add_argument("--metric", default="eval/top1", help="accuracy shown in the progress lines and the table")

    status = sub.add_parser("status", help="table of every run of a sweep: status, steps, accuracy, exaFLOPs")
    status.add_argument("config")
    status.add_argument("--root", required=True)
    status.add_argument("--metric", default="eval/top1")

    report = sub.add_parser("report", help="Pareto plot, training curves and Table-6 style table of a sweep root")
    report.add_argument("root", help="sweep directory (the --root of `sweep run`)")
    report.add_argument("--metric", default="eval/top1",
                        help="accuracy to plot: eval/top1, eval/top5, fewshot/DATASET/Kshot, ...")
    report.add_argument("--compare-paper", action="store_true",
                        help="overlay the ViT paper's Table 6 points and add them to the table")
    report.add_argument("--progress", default="examples", choices=("examples", "epochs", "steps", "exaflops"),
                        help="x-axis of curves.png")
    report.add_argument("--output", dest="out", type=cli_args.output_path,
                        default=None, metavar="DIR", help="output directory (default ROOT/report)")
    report.add_argument("--finetune-root", action="append", default=[], metavar="DIR",
                        help="sweep root of fine-tuning runs started from this sweep's runs (repeatable): adds "
                             "finetune/DATASET/top1 columns, selectable with --metric")
    report.add_argument("--bootstrap", type=int, default=200, metavar="N",
                        help="bootstrap refits behind the scaling-law fits' intervals and bands")
    report.add_argument("--seed", type=int, default=0, help="seed of the bootstrap (the same seed, the same bands)")
    report.add_argument("--fit-final-only", action="store_true",
                        help="fit each family's front of final evaluations only (default: every evaluation logged)")

    suggest = sub.add_parser("suggest", help="from a sweep's scaling-law fits: the error a compute budget buys, and "
                                             "the model and training length that buy it")
    suggest.add_argument("root", nargs="?", default=None,
                         help="sweep directory (reads ROOT/report/scaling.json, written by `sweep report`) or a "
                              "scaling.json")
    suggest.add_argument("--paper", action="store_true",
                         help="use the ViT paper's Table 6 (ImageNet error after fine-tuning) instead of a sweep")
    suggest.add_argument("--budget-exaflops", type=float, required=True, metavar="X",
                         help="pretraining compute to plan for, in exaFLOPs")
    suggest.add_argument("--family", default=None,
                         help="family to plan for (ViT, ResNet, Hybrid, ...); default: the one the fits say does best")
    suggest.add_argument("--bootstrap", type=int, default=200, metavar="N",
                         help="--paper: bootstrap refits behind the interval")
    return parser


def _suggest(args) -> int:
    from vit_jax.report.scaling_report import SCALING_JSON, load_fits, suggest
    from vit_jax.sweep.runs import as_path

    if args.paper == (args.root is not None):
        raise ValueError("give a sweep directory (or its scaling.json) or --paper, one of the two")
    if args.paper:
        from vit_jax.report.pareto import PAPER_METRIC, paper_rows
        from vit_jax.report.scaling_report import compute_fits

        # Only the asked family is fitted (the others' bootstraps would be wasted); an unknown one falls through to
        # all of them, so that the refusal lists the families there are.
        rows = [r for r in paper_rows() if args.family and r.family.lower() == args.family.lower()] or paper_rows()
        fits = [g.to_dict() for g in compute_fits(rows, PAPER_METRIC, "paper", n_boot=args.bootstrap)]
    else:
        path = as_path(args.root)
        fits = load_fits(path if path.name.endswith(".json") else path / "report" / SCALING_JSON)
    print(suggest(fits, args.budget_exaflops, args.family))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of `vit-jax sweep`."""
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.command == "report":
            from vit_jax.report.sweep_report import write_report

            paths = write_report(args.root, metric=args.metric, compare_paper=args.compare_paper,
                                 progress=args.progress, out_dir=args.out,
                                 finetune_roots=tuple(args.finetune_root), n_boot=args.bootstrap,
                                 seed=args.seed, fit_final_only=args.fit_final_only)
            print("wrote " + ", ".join(str(p) for p in paths))
            return 0
        if args.command == "suggest":
            return _suggest(args)

        from vit_jax.sweep.runner import run_sweep, status_table, workdir_of
        from vit_jax.sweep.runs import read_run
        from vit_jax.sweep.spec import load_sweep

        sweep = load_sweep(args.config)
        if args.command == "status":
            states = [read_run(workdir_of(args.root, r), r.name) for r in sweep.runs]
            print(status_table(states, args.metric))
            return 0 if all(s.finished for s in states) else 1

        from vit_jax.sweep.launchers import make_launcher

        launcher = make_launcher(args.launcher, trainer=args.trainer, extra_args=args.launcher_arg,
                                 preflight=args.preflight)
        return run_sweep(sweep, args.root, launcher, only=args.only, dry_run=args.dry_run, metric=args.metric)
    except (ValueError, FileNotFoundError) as e:
        print(f"vit-jax sweep {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # The running trainer got the same SIGINT and checkpoints on the way out.
        print(f"\nvit-jax sweep {args.command}: interrupted; run the same command again to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
