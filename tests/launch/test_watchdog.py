"""vit_jax.parallel.watchdog's decisions against an in-memory key-value store and a fake clock (no processes)."""

from __future__ import annotations

import pytest

from vit_jax.parallel import watchdog as wd


class FakeClient:
    """The two key-value calls the watchdog uses, shared by the 'processes' of a test; can be made unreachable."""

    def __init__(self):
        self.kv: dict[str, str] = {}
        self.down = False

    def key_value_set(self, key: str, value: str, allow_overwrite: bool = False) -> None:
        if self.down:
            raise RuntimeError("UNAVAILABLE: Failed to send RPC to coordination service\nmore detail")
        self.kv[key] = value

    def key_value_dir_get(self, prefix: str) -> list[tuple[str, str]]:
        if self.down:
            raise RuntimeError("UNAVAILABLE: Failed to send RPC to coordination service")
        return [(k, v) for k, v in self.kv.items() if k.startswith(prefix)]


class Exited(Exception):
    pass


class World:
    """N watchdogs on one fake store and one fake clock; `exits` records who exited with which code."""

    def __init__(self, n: int, lost_after_s: float = 30.0):
        self.client, self.now, self.exits = FakeClient(), 0.0, {}
        self.dogs = [self._dog(i, n, lost_after_s) for i in range(n)]
        for d in self.dogs:
            d._set("info", f"host{d.process_id}, pid {100 + d.process_id}")

    def _dog(self, pid: int, n: int, lost_after_s: float) -> wd.PeerWatchdog:
        def exit_(code: int) -> None:
            self.exits[pid] = code
            raise Exited

        return wd.PeerWatchdog(self.client, pid, n, lost_after_s=lost_after_s, coordinator="10.0.0.1:1234",
                               clock=lambda: self.now, sleep=lambda s: None, exit=exit_)

    def tick(self, seconds: float, alive: set[int]) -> None:
        """Advances the clock by `seconds` in steps of each watchdog's interval; only `alive` ones run."""
        end = self.now + seconds
        while self.now < end:
            self.now += self.dogs[0].interval_s
            for d in self.dogs:
                if d.process_id in alive and d.process_id not in self.exits:
                    try:
                        d.check_once()
                    except Exited:
                        pass


def test_default_detects_a_killed_peer_within_32s_and_every_survivor_names_it(capsys):
    w = World(3)  # heartbeat_timeout_s defaults to 30 (config.distributed)
    assert w.dogs[0].interval_s == 1.0
    w.tick(10, alive={0, 1, 2})
    killed_at = w.now
    stopped_at = None
    while not w.exits and w.now - killed_at < 120:
        w.tick(1, alive={0, 2})
        stopped_at = w.now
    assert stopped_at - killed_at <= 32  # lost_after_s (30) + at most two poll intervals
    w.tick(3, alive={0, 2})
    assert w.exits == {0: wd.LOST_PEER_EXIT_CODE, 2: wd.LOST_PEER_EXIT_CODE}
    err = capsys.readouterr().err
    assert "lost peer process 1 (host1, pid 101): no heartbeat for 3" in err
    assert "stopping process 2: lost peer process 1 (host1, pid 101)" in err


def test_healthy_peers_and_peers_that_finished_are_never_reported():
    w = World(3, lost_after_s=5)
    w.tick(60, alive={0, 1, 2})
    w.dogs[2].mark_done()  # exits normally before the others: silence is expected
    w.tick(60, alive={0, 1})
    assert w.exits == {}


def test_a_starved_observer_restarts_its_clocks_instead_of_blaming_peers():
    w = World(2, lost_after_s=10)
    w.tick(5, alive={0, 1})
    w.now += 25  # process 0's thread did not run for 25 s (GIL held elsewhere, machine suspended)
    w.tick(1, alive={0, 1})
    assert w.exits == {}


def test_a_failing_process_stops_every_peer_with_its_error(capsys):
    w = World(3)
    w.tick(3, alive={0, 1, 2})
    with pytest.raises(Exited):
        w.dogs[1].report_failure("process 1 (host1, pid 101) failed: ValueError: bad batch")
    w.tick(1, alive={0, 2})
    assert w.exits == {1: wd.FAILED_EXIT_CODE, 0: wd.LOST_PEER_EXIT_CODE, 2: wd.LOST_PEER_EXIT_CODE}
    assert "stopping process 0: process 1 (host1, pid 101) failed: ValueError: bad batch" in capsys.readouterr().err


def test_a_process_that_stops_the_job_records_its_exit_code_before_telling_its_peers(tmp_path, monkeypatch):
    # launch/slurm.py decides from these files: srun may kill the failing process while its peers read the verdict.
    record = tmp_path / "3"
    monkeypatch.setenv(wd.EXIT_FILE_ENV, str(record))
    w = World(2)
    recorded_at_verdict = []
    publish = w.client.key_value_set

    def key_value_set(key: str, value: str, allow_overwrite: bool = False) -> None:
        if "/verdict/" in key:
            recorded_at_verdict.append(record.read_text() if record.exists() else None)
        publish(key, value, allow_overwrite)

    w.client.key_value_set = key_value_set
    with pytest.raises(Exited):
        w.dogs[1].report_failure("process 1 failed: ValueError: bad batch")
    assert recorded_at_verdict == [f"{wd.FAILED_EXIT_CODE}\n"]


def test_an_unreachable_coordinator_stops_the_process_naming_it(capsys):
    w = World(2)
    w.tick(2, alive={0, 1})
    w.client.down = True
    w.tick(3, alive={1})
    assert w.exits == {1: wd.LOST_PEER_EXIT_CODE}
    assert "lost the coordinator (process 0 at 10.0.0.1:1234): UNAVAILABLE" in capsys.readouterr().err


def test_the_poll_interval_grows_with_the_job_so_the_coordinator_is_not_flooded():
    w = wd.PeerWatchdog(FakeClient(), 0, 1024, lost_after_s=30)
    assert w.interval_s == pytest.approx(7.5)  # capped at lost_after_s / 4, so 4 polls still fit in the timeout
    assert wd.PeerWatchdog(FakeClient(), 0, 300, lost_after_s=30).interval_s == pytest.approx(3.0)


def test_fail_fast_is_a_no_op_for_a_single_process():
    assert wd.active() is None
    wd.fail_fast(RuntimeError("single process: the caller re-raises"))  # returns


def test_a_save_that_failed_because_its_collective_lost_a_peer_reads_as_a_lost_peer_not_as_this_process_failing():
    JaxRuntimeError = type("JaxRuntimeError", (RuntimeError,), {})  # jax's class, by name as the watchdog checks
    gloo = JaxRuntimeError("UNKNOWN: Gloo AllGather failed: pair.cc:538 Read error [127.0.0.1]:4242: Connection "
                           "reset by peer")
    try:
        try:
            raise gloo
        except RuntimeError as e:
            raise OSError("could not write the checkpoint of step 10: JaxRuntimeError: UNKNOWN: Gloo ...") from e
    except OSError as save_error:
        assert wd.looks_like_lost_peer(save_error)
    assert not wd.looks_like_lost_peer(OSError("[Errno 28] No space left on device"))
    assert not wd.looks_like_lost_peer(JaxRuntimeError("RESOURCE_EXHAUSTED: out of memory"))
