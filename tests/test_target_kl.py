"""algorithm.target_kl: an iteration's epochs stop once an epoch's mean approx_kl passes 1.5 x the target."""

from __future__ import annotations

from tests.helpers import QUIET, read_metrics, train

_RUN = ["train.total_env_steps=1024", "env.num_envs=4", "train.rollout_steps=128", "algorithm.epochs=6",
        "algorithm.minibatch_size=128", "train.eval_every=0", "algorithm.lr=0.003"]


def test_epochs_stop_at_the_target_kl_and_run_in_full_without_it(ray_session, tmp_path):
    rc, out = train("ppo-cartpole", *_RUN, "algorithm.target_kl=1e-7", f"run.dir={tmp_path / 'early'}", *QUIET)
    assert rc == 0, out
    early = read_metrics(tmp_path / "early")
    # the first epoch's later minibatches see a moved policy: its mean KL passes any tiny target
    assert [r["train/epochs"] for r in early] == [1, 1]
    assert [r["train/updates"] for r in early] == [4, 4]
    rc, out = train("ppo-cartpole", *_RUN, f"run.dir={tmp_path / 'full'}", *QUIET)
    assert rc == 0, out
    assert [(r["train/epochs"], r["train/updates"]) for r in read_metrics(tmp_path / "full")] == [(6, 24), (6, 24)]


def test_target_kl_on_an_algorithm_without_epochs_is_refused_on_one_line(tmp_path, capsys):
    rc, _ = train("sac-pendulum", "algorithm.target_kl=0.01", f"run.dir={tmp_path}", *QUIET)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and len(err) == 1 and "algorithm.target_kl: sac takes no epochs" in err[0]
