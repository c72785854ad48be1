"""Our Orbax policy layer: saving a step that is already saved is a no-op (a periodic save and a preemption or the
end of the run can fall on the same step)."""

import jax.numpy as jnp
import numpy as np

from vit_jax.checkpoints.training import RunCheckpointer


def test_saving_a_step_twice_keeps_the_first_and_does_not_raise(tmp_path):
    ckpt = RunCheckpointer(str(tmp_path / "checkpoints"), keep=3)
    state = {"w": jnp.arange(4.0)}
    ckpt.save(5, state, {"step": 5}, {"note": "periodic"})  # asynchronous, like the periodic hook
    ckpt.save(5, state, {"step": 5}, {"note": "preemption"}, wait=True)
    assert ckpt.all_steps() == [5]
    restored, data, meta = ckpt.restore(5, {"w": jnp.zeros(4)})
    np.testing.assert_array_equal(restored["w"], np.arange(4.0))
    assert data == {"step": 5} and meta == {"note": "periodic"}
    ckpt.close()


def test_keep_the_last_n_plus_every_kth_step_forever(tmp_path):
    ckpt = RunCheckpointer(str(tmp_path / "checkpoints"), keep=2, keep_every=4, async_save=False)
    for step in range(1, 11):
        ckpt.save(step, {"w": jnp.full(4, float(step))}, {"step": step}, {})
    assert ckpt.all_steps() == [4, 8, 9, 10]
    assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir()) == [4, 8, 9, 10]  # pruned on disk
    restored, data, _ = ckpt.restore(4, {"w": jnp.zeros(4)})
    np.testing.assert_array_equal(restored["w"], np.full(4, 4.0))
    ckpt.close()
