"""Training checkpoints with Orbax: state (params, optimizer, step, RNG), data-iterator state and run metadata.

Layout: `WORKDIR/checkpoints/<step>/{state,data,meta}`. Saves are asynchronous and atomic (Orbax writes to a
temporary directory and renames it when complete; an interrupted save is never restored). The metadata makes a
checkpoint self-describing: model architecture, resolved config, dataset and preprocessing, package version and
git commit — `vit-jax predict/eval/convert` need nothing else.

Failing well (docs/launching.md, "Failures"): resuming walks back from the newest step to the newest one that is
complete and restores (one line per damaged step skipped, naming the damaged file: checkpoints/damage.py; it is
moved aside to `<step>.damaged` at the run's first save, never deleted); the reads Orbax leaves behind when a
restore fails stay silent (`--verbose` shows them);
a save that fails (disk full, permissions, quota) raises CheckpointSaveError naming the folder and the OS error,
after removing its own temporary folder, so the trainer can stop at once with earlier checkpoints intact.
"""

from __future__ import annotations

import errno
import gc
import json
import os
import re
import shutil
import sys
import time
from typing import Any, Callable

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from vit_jax.checkpoints import damage
from vit_jax.errors import MissingInputError, UserError, debug_enabled, one_line
from vit_jax.parallel.distributed import all_processes, barrier
from vit_jax.storage.remote import is_url

ITEMS = ("state", "data", "meta")
COMMIT_MARKER = "commit_success.txt"  # Orbax writes it into every finished step and item folder
DAMAGED_SUFFIX = ".damaged"
# The train-state key of a run's EMA weights (train/ema.py): when a run keeps them, they are its weights for
# everything that loads it (load_state_from_run's "params"); resuming restores both.
EMA_PARAMS = "ema_params"
SAVE_FAILED_EXIT_CODE = 74  # EX_IOERR: a checkpoint could not be written; earlier ones are intact


class CheckpointError(UserError, RuntimeError):
    """No checkpoint of a run can be restored, or one cannot be written; the message is one line for the user."""


class CheckpointSaveError(CheckpointError):
    """Writing a checkpoint failed (disk full, permissions, quota); the run stops at that step."""

    exit_code = SAVE_FAILED_EXIT_CODE


def step_problem(step_dir: epath.Path) -> str | None:
    """Why the step folder is not a complete checkpoint (a missing commit marker or item, unreadable metadata),
    or None. Cheap and identical on every process, so all processes of a job skip the same steps."""
    if not (step_dir / COMMIT_MARKER).exists():
        return f"no {COMMIT_MARKER} (the save did not finish)"
    for item in ITEMS:
        d = step_dir / item
        if not (d / COMMIT_MARKER).exists():
            return f"{item}/ is missing or unfinished"
    for name in ("state/_METADATA", "data/metadata", "meta/metadata"):
        try:
            json.loads((step_dir / name).read_text())
        except FileNotFoundError:
            return f"{name} is missing"
        except (ValueError, UnicodeDecodeError):
            return f"{name} is not readable JSON (truncated?)"
    return None


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {one_line(e)[:300]}"


def _os_error(e: BaseException) -> str:
    """The OS error behind a failed write, as Python names it ('OSError: [Errno 28] No space left on device'):
    from an OSError in the chain, or from tensorstore's `[os_error_code='28']` (Orbax writes arrays with it)."""
    cause: BaseException | None = e
    while cause is not None:
        if isinstance(cause, OSError) and cause.errno:
            return f"OSError: [Errno {cause.errno}] {cause.strerror or os.strerror(cause.errno)}"
        if m := re.search(r"os_error_code='(\d+)'", str(cause)):
            code = int(m.group(1))
            return f"OSError: [Errno {code}] {os.strerror(code)}"
        cause = cause.__cause__ or cause.__context__
    return _first_line(e)


def _quiet_library_logs() -> None:
    """Orbax logs every failure it raises with a full traceback (and asyncio each of its failed writes again); we
    report each as one line, so those logs are dropped unless VIT_JAX_DEBUG is set (`--verbose`)."""
    import logging

    def keep(record: logging.LogRecord) -> bool:
        if debug_enabled() or record.levelno >= logging.CRITICAL:
            return True
        if "/orbax/" in record.pathname or "exception was never retrieved" in str(record.msg):
            return False
        # asyncio's "Task was destroyed but it is pending!" about one of Orbax's abandoned reads (see below).
        return not (record.name == "asyncio" and "/orbax/" in str(record.msg))

    for name in ("absl", "asyncio"):
        logger = logging.getLogger(name)
        if not any(getattr(f, "__name__", "") == "keep" for f in logger.filters):
            logger.addFilter(keep)
    # Orbax's leftovers after a failure, each an unraisable exception with a traceback: the reads a failed restore
    # abandoned (counted: _abandoned_orbax_coroutine), and after a failed write, the callbacks of tensorstore's other
    # writes finding Orbax's event loop closed ("Event loop is closed", dozens of tracebacks).
    previous = sys.unraisablehook
    if getattr(previous, "__name__", "") != "_drop_orbax_leftovers":
        def _drop_orbax_leftovers(unraisable):
            global ABANDONED_READS
            if debug_enabled():
                previous(unraisable)
            elif _abandoned_orbax_coroutine(unraisable):
                ABANDONED_READS += 1
            elif not (isinstance(unraisable.exc_value, RuntimeError)
                      and str(unraisable.exc_value) == "Event loop is closed"):
                previous(unraisable)

        sys.unraisablehook = _drop_orbax_leftovers


# Orbax's reads left pending when a restore failed, finalized by the garbage collector since (see below).
ABANDONED_READS = 0


def _abandoned_orbax_coroutine(unraisable) -> bool:
    """Whether an unraisable exception is an Orbax coroutine being finalized after its restore failed.

    Orbax reads a checkpoint's arrays concurrently on an event loop of its own and closes that loop as soon as one
    read fails, leaving the others suspended. When the garbage collector later closes each of them, Orbax's
    `except BaseException` around the read turns the GeneratorExit it receives into a new Exception, which Python
    reports as "Exception ignored in: <coroutine ... _read_array_index_and_device_put>" with a 60-line TensorStore
    spec, once per pending read (~20 of them, ~600 lines, in one drill). The restore's own failure was reported
    already, in one line."""
    code = getattr(unraisable.object, "cr_code", None)
    if code is None or "/orbax/" not in code.co_filename:
        return False
    exc, seen = unraisable.exc_value, set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, GeneratorExit):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def tree_nbytes(tree: Any) -> int:
    leaves = [x for x in jax.tree.leaves(tree) if hasattr(x, "shape")]
    return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in leaves)


def _dir_bytes(path: epath.Path) -> int:
    """Disk space the files under a local folder take: allocated blocks, not sizes (a checkpoint has dozens of small
    files, each taking at least a block; counting sizes under-estimated it enough for a save judged to fit to fail)."""
    total = 0
    for root, _, files in os.walk(os.fspath(path)):
        for f in files:
            st = os.stat(os.path.join(root, f))
            total += max(st.st_size, st.st_blocks * 512)
    return total


# Kept free beyond the newest checkpoint's size when judging whether the next save fits: the run keeps appending
# metrics and TensorBoard events to the same disk while an asynchronous save is in flight.
SPACE_HEADROOM_FRACTION, SPACE_HEADROOM_BYTES = 0.05, 256 << 10


def _save_replicated_arrays_whole_on_cpu() -> None:
    """On CPU, Orbax's replica-parallel save (each replica of a replicated array writes a slice of it) only adds
    work: the "devices" share one host memory, and every distinct array shape costs a compiled slice program
    (a tiny BiT's first save compiled 104 of them, 4.3 s on 2 cores). Accelerators keep Orbax's default."""
    if jax.default_backend() == "cpu":
        ocp.type_handlers.register_type_handler(jax.Array, ocp.type_handlers.ArrayHandler(use_replica_parallel=False),
                                                override=True)


PARTIAL_QUIET_S = 2.0  # a failed save's folder must stay removed this long (RunCheckpointer._remove_partial)


class RunCheckpointer:
    """Thin policy layer over ocp.CheckpointManager: keep the last `keep` plus every `keep_every`-th step."""

    def __init__(self, directory: str, *, keep: int = 3, keep_every: int = 0, async_save: bool = True):
        self.directory = epath.Path(directory)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep or None, keep_period=keep_every or None, enable_async_checkpointing=async_save,
            create=True, cleanup_tmp_directories=True)
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=ITEMS)
        self.keep = keep
        self._skipped: set[int] = set()  # steps restore_latest found damaged
        self._pending: int | None = None  # the step of the save that may still be running in the background
        _quiet_library_logs()
        _save_replicated_arrays_whole_on_cpu()

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self.manager.all_steps())

    def save(self, step: int, state: Any, data_state: dict, meta: dict, *, wait: bool = False) -> None:
        """Saves `step` (asynchronously unless `wait`). Raises CheckpointSaveError if this save, or the earlier
        one still in flight, failed."""
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state),
                                  meta=ocp.args.JsonSave(meta))
        # A step saved already (a periodic save, then a preemption or the end of the run at that same step) holds
        # this very state: saving is idempotent, never Orbax's StepAlreadyExistsError. Orbax waits for the previous
        # save before its own check too, so this costs no extra blocking.
        self.wait()
        # The damaged steps this run skipped on restore are kept, under another name, from its first save on: left
        # as they were, Orbax's keep-N pruning would delete them once as many newer steps exist, and saving one of
        # their steps again would collide with them. (A bucket's cut-off upload may be gone: Orbax deletes those.)
        for skipped in sorted(self._skipped):
            if jax.process_index() == 0 and (self.directory / str(skipped)).exists():
                moved = self._move_aside(self.directory / str(skipped))
                print(f"moved the damaged checkpoint step {skipped} to {moved.name}", flush=True)
            barrier(f"checkpoint {skipped} moved aside")
        if self._skipped:
            self._skipped.clear()
            self.manager.reload()
        if step not in self.manager.all_steps():
            self._check_space(step, state)
            self._pending = step
            self._guard(step, lambda: self.manager.save(step, args=args, force=True))
        if wait:
            self.wait()

    def _check_space(self, step: int, state: Any) -> None:
        """Local disks: a save that cannot fit stops the run before anything is written; one that fits but may leave
        too little for the next is a warning, judged by the same rule plus one more headroom (the run's logs and
        metrics on that disk grow between saves), so the stop never comes unwarned. The size needed is the newest
        checkpoint's on disk (the state's bytes before the first); other processes' shards of a shared disk are in
        that measure too."""
        if is_url(str(self.directory)) or jax.process_index() != 0:
            return
        steps = self.manager.all_steps()
        needed = _dir_bytes(self.directory / str(max(steps))) if steps else tree_nbytes(state)
        free = shutil.disk_usage(os.fspath(self.directory)).free
        mib = 2**20
        required = needed * (1 + SPACE_HEADROOM_FRACTION) + SPACE_HEADROOM_BYTES
        if free < required:
            raise CheckpointSaveError(
                f"could not write the checkpoint of step {step} in {self.directory}: OSError: [Errno "
                f"{errno.ENOSPC}] {os.strerror(errno.ENOSPC)} ({free / mib:.1f} MiB free, a checkpoint takes "
                f"{needed / mib:.1f} MiB); free space or lower checkpoint.keep, then rerun to resume")
        reclaimed = needed if self.keep and len(steps) + 1 > self.keep else 0  # Orbax then prunes the oldest
        if free - needed + reclaimed < required + SPACE_HEADROOM_BYTES:
            print(f"warning: {free / mib:.1f} MiB free in {self.directory}: after the checkpoint of step {step} "
                  f"({needed / mib:.1f} MiB) the next one may not fit", flush=True)

    def check(self) -> None:
        """Raises CheckpointSaveError if a background save has failed (cheap: call it every step)."""
        if self._pending is not None:
            self._guard(self._pending, self.manager.check_for_errors)

    def wait(self) -> None:
        """Blocks until the save in flight is written; raises CheckpointSaveError if it failed."""
        if self._pending is not None:
            # Orbax's wait does not always re-raise a failed background write; its error check does.
            self._guard(self._pending, lambda: (self.manager.wait_until_finished(), self.manager.check_for_errors()))
            self._pending = None

    def _guard(self, step: int, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - any failure to write is reported as one CheckpointSaveError
            self._pending = None
            self._remove_partial(step)
            self.manager.reload()
            raise CheckpointSaveError(f"could not write the checkpoint of step {step} in {self.directory}: "
                                      f"{_os_error(e)}") from e

    def _remove_partial(self, step: int) -> None:
        """Deletes this process's own half-written save of `step` (Orbax's temporary folder), nothing else."""
        if jax.process_index() != 0:
            return
        # Orbax stops waiting for a save's writes at the first one that fails, while its other writes (the other
        # items, the metadata) may still run and recreate files as they are removed (seen on a loaded machine):
        # remove, then look again until the folder has stayed away for PARTIAL_QUIET_S (at most 30 s).
        deadline, quiet_since = time.monotonic() + 30.0, None
        while time.monotonic() < deadline:
            found = list(self.directory.glob(f"{step}.orbax-checkpoint-tmp*"))
            for p in found:
                try:
                    p.rmtree() if p.is_dir() else p.unlink()
                except OSError:  # a writer still adding files: the next round removes them
                    pass
            now = time.monotonic()
            if found:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = now
            elif now - quiet_since >= PARTIAL_QUIET_S:
                break
            time.sleep(0.2)
        final = self.directory / str(step)
        if final.exists() and step_problem(final) is not None:
            self._move_aside(final)

    def _move_aside(self, step_dir: epath.Path) -> epath.Path:
        target = step_dir.parent / (step_dir.name + DAMAGED_SUFFIX)
        n = 1
        while target.exists():
            n += 1
            target = step_dir.parent / f"{step_dir.name}{DAMAGED_SUFFIX}{n}"
        step_dir.rename(target)
        return target

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict, dict]:
        """Restores onto the shardings of `abstract_state` (jax.ShapeDtypeStruct leaves with `.sharding`): any
        device count or mesh works, whatever the checkpoint was saved with."""
        args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore(),
                                  meta=ocp.args.JsonRestore())
        out = self.manager.restore(step, args=args)
        return out["state"], out["data"], out["meta"]

    def restore_latest(self, abstract_state: Any, log: Callable[[str], None] = print,
                       check_meta: Callable[[dict], None] | None = None) -> tuple[int, Any, dict, dict] | None:
        """The newest step that is complete and restores: (step, state, data, meta); None if there is no step.

        Newer steps that are incomplete or fail to restore are skipped, each with one line from `log`; they stay on
        disk until this run's first save, which moves them aside to `<step>.damaged` (never deleted).
        `check_meta(meta)` may refuse a run before any restore (e.g. a different model: ConfigError).
        If steps exist but none restores: CheckpointError. All processes of a job decide together: a step is used
        only if it restored on every process.
        """
        steps = sorted(self.manager.all_steps(), reverse=True)
        if not steps:
            return None
        if check_meta is not None and step_problem(self.directory / str(steps[0])) is None:
            check_meta(json.loads((self.directory / str(steps[0]) / "meta" / "metadata").read_text()))
        reason = None
        for step in steps:
            reason = step_problem(self.directory / str(step))
            restored = None
            if reason is None:
                try:
                    restored = self.restore(step, abstract_state)
                except Exception as e:  # noqa: BLE001 - a damaged file surfaces as any of Orbax's/tensorstore's errors
                    reason = damage.describe(self.directory / str(step), e)
                if reason is not None:  # outside the except clause, which keeps the failed restore's frames alive
                    # Orbax's reads left pending by the failure are finalized now (the hook of _quiet_library_logs
                    # counts them), not at whichever collection comes next in the middle of training.
                    gc.collect()
            reason = next((r for r in all_processes(reason or "") if r), None)
            if reason is None:
                return (step, *restored)
            self._skipped.add(step)
            log(f"skipping checkpoint step {step}: {reason}")
        raise CheckpointError(f"no checkpoint in {self.directory} can be restored (tried steps "
                              f"{', '.join(map(str, steps))}; step {steps[-1]}: {reason}); start again in a new "
                              "--workdir, or restore a copy of the checkpoints")

    def close(self) -> None:
        self.manager.close()


def _step_dir(path: str) -> epath.Path:
    """A run workdir, its checkpoints/ folder or one step folder -> the step folder to read."""
    p = epath.Path(path)
    if (p / "checkpoints").exists():
        p = p / "checkpoints"
    if (p / "meta").exists() and (p / "state").exists():
        return p
    steps = sorted((int(c.name) for c in p.iterdir() if c.name.isdigit()), reverse=True) if p.exists() else []
    for step in steps:  # the newest complete one (a run may hold an unfinished or damaged newest step)
        if step_problem(p / str(step)) is None:
            return p / str(step)
    orbax = p.exists() and any((p / marker).exists() for marker in ("_CHECKPOINT_METADATA", "manifest.ocdbt",
                                                                      "_METADATA", "state"))
    found = "an Orbax checkpoint without vit-jax's run metadata (meta/)" if orbax else (
        f"a folder of {', '.join(sorted(c.name for c in p.iterdir())[:4]) or 'nothing'}" if p.exists() else "")
    raise MissingInputError(f"no complete checkpoint under {path}" + (f" ({found})" if found else "")
                            + "; expected a vit-jax run: WORKDIR, WORKDIR/checkpoints or WORKDIR/checkpoints/<step>")


def load_run_metadata(path: str) -> dict:
    step_dir = _step_dir(path)
    return json.loads((step_dir / "meta" / "metadata").read_text())


def model_config_from_meta(meta: dict) -> Any:
    """The model config (of its family: models/family.py) a checkpoint's metadata records."""
    from vit_jax.models.build import from_meta

    return from_meta(meta)


def load_params_from_run(path: str, shapes: Any = None) -> tuple[Any, dict[str, Any]]:
    """Parameters (numpy) and architecture of one of our checkpoints, restored onto this host's CPU memory.

    By default the parameters of the model the architecture describes (of a self-supervised run: the encoder, its
    pretraining head or decoder left out); `shapes` (a pytree of arrays' shapes) restores those parameters instead."""
    cfg, out = load_state_from_run(path, {"params": shapes})
    return cfg, out["params"]


def load_state_from_run(path: str, shapes: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Parts of one of our checkpoints' train state (numpy, on this host): `shapes` maps state keys ("params",
    "extra": a training objective's extra state) to pytrees of arrays' shapes; "params": None means the parameters
    of the model the checkpoint's architecture describes. A run that keeps EMA weights gives those as "params"."""
    from vit_jax.models.build import build_model

    step_dir = _step_dir(path)
    meta = load_run_metadata(str(step_dir))
    cfg = model_config_from_meta(meta)
    if "params" in shapes and shapes["params"] is None:
        shapes = {**shapes, "params": build_model(cfg).shapes}
    # A run with EMA weights (ema.decay > 0) is loaded as those weights: they are what it evaluated and shipped.
    # A caller asking for both keys (a test, a tool comparing them) gets each as saved.
    ema = ("params" in shapes and EMA_PARAMS not in shapes
           and bool(meta.get("config", {}).get("ema", {}).get("decay")))
    if ema:
        shapes = {EMA_PARAMS if k == "params" else k: v for k, v in shapes.items()}
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), shapes)
    restore_args = ocp.checkpoint_utils.construct_restore_args(target)
    reason = None
    with ocp.PyTreeCheckpointer() as ckptr:
        try:
            out = ckptr.restore(step_dir / "state", args=ocp.args.PyTreeRestore(
                item=target, restore_args=restore_args, partial_restore=True))
        except Exception as e:  # noqa: BLE001 - a damaged file surfaces as any of Orbax's/tensorstore's errors
            reason = damage.describe(step_dir, e)
            if debug_enabled():
                raise CheckpointError(f"checkpoint {step_dir} cannot be restored: {reason}") from e
    if reason is not None:  # raised outside the except clause: TensorStore's pages stay out of the traceback
        raise CheckpointError(f"checkpoint {step_dir} cannot be restored: {reason}")
    out = jax.tree.map(np.asarray, out)
    return cfg, ({"params" if k == EMA_PARAMS else k: v for k, v in out.items()} if ema else out)


def model_meta(cfg: Any) -> dict:
    """Model config -> JSON-able dict that `model_config_from_meta` rebuilds exactly."""
    import dataclasses

    d = dataclasses.asdict(cfg)
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in d.items()}


def git_commit() -> str | None:
    here = os.path.dirname(os.path.abspath(__file__))
    head = os.path.join(here, "..", "..", ".git", "HEAD")
    try:
        with open(head) as f:
            ref = f.read().strip()
        if ref.startswith("ref: "):
            with open(os.path.join(here, "..", "..", ".git", ref[5:])) as f:
                return f.read().strip()
        return ref
    except OSError:
        return None
