"""A stand-in for `python -m vit_jax.main` in sweep tests: no JAX, instant, and it leaves what the real trainer leaves.

Every invocation appends its argv to ROOT/invocations.jsonl (ROOT = the workdir's parent), so tests can count
launches and compare commands. With FAKE_TRAINER_INTERRUPT=NAME the run NAME stops half-way (status "running",
exit code 1), as if killed. With FAKE_TRAINER_AWAIT_SIGINT=1 it writes `ready`, waits for SIGINT, then takes a
second (a checkpoint save) before writing `saved` and exiting with 130, as the real trainer does on Ctrl-C.
"""

import json
import os
import signal
import sys
import time
from pathlib import Path


def await_sigint(workdir: Path) -> int:
    interrupted = []
    signal.signal(signal.SIGINT, lambda *_: interrupted.append(True))
    (workdir / "ready").write_text("")
    while not interrupted:
        signal.pause()
    time.sleep(1.0)  # longer than the 0.25 s subprocess.run would grant before killing
    (workdir / "saved").write_text("")
    return 130


def main(argv: list[str]) -> int:
    workdir = Path(next(a.split("=", 1)[1] for a in argv if a.startswith("--workdir=")))
    overrides = dict(a[len("--config."):].split("=", 1) for a in argv if a.startswith("--config."))
    with open(workdir.parent / "invocations.jsonl", "a") as f:
        f.write(json.dumps({"run": workdir.name, "argv": argv}) + "\n")
    print(f"fake trainer training {workdir.name}", flush=True)
    workdir.mkdir(parents=True, exist_ok=True)
    if os.environ.get("FAKE_TRAINER_AWAIT_SIGINT"):
        return await_sigint(workdir)
    steps = int(overrides.get("total_steps", 10))
    width = int(overrides.get("model.width", 32))
    exaflops = steps * width * 1e-9
    with open(workdir / "metrics.jsonl", "a") as f:
        for s in (steps // 2, steps):
            f.write(json.dumps({"step": s, "examples_seen": s * 32, "epoch": s / 10, "exaflops": exaflops * s / steps,
                                "eval/top1": min(0.99, 0.5 + width * s * 1e-4)}) + "\n")
            if os.environ.get("FAKE_TRAINER_INTERRUPT") == workdir.name:
                (workdir / "summary.json").write_text(json.dumps({"status": "running"}))
                return 1
    summary = {"status": "finished", "model": {"name": f"ViT-w{width}", "params": width * 1000, "family": "ViT"},
               "steps": steps, "epochs": steps / 10,
               "compute": {"exaflops": exaflops, "device_days": exaflops * 10, "device_kind": "cpu"},
               "final": {"eval/top1": min(0.99, 0.5 + width * steps * 1e-4)}}
    (workdir / "summary.json").write_text(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
