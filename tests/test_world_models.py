"""World models as environments: the vector-env contract, training lowers the error, save/load,
the model folder's files, real evaluation envs, and one-line errors. Tiny models, tiny data."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("minari")

from rlweave.cli import main  # noqa: E402
from rlweave.data.datasets import collect_dataset  # noqa: E402
from rlweave.envs import VectorEnv  # noqa: E402
from rlweave.world_models import WorldModelError, load_world_model  # noqa: E402
from rlweave.world_models.data import load_trajectories  # noqa: E402
from rlweave.world_models.ensemble import EnsembleWorldModel  # noqa: E402
from rlweave.world_models.env import WorldModelEnv, load_starts, make_env  # noqa: E402
from rlweave.world_models.train import train_world_model  # noqa: E402

LIMIT = 40


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("wm") / "pendulum_random"
    collect_dataset(lambda **kw: gym.make("Pendulum-v1", max_episode_steps=LIMIT), None, episodes=12, out=out,
                    name="wm_test", seed=0)
    return out


@pytest.fixture(scope="module")
def model_dir(dataset, tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("wm") / "model"
    train_world_model(dataset, out, epochs=4, horizon=10, batch_size=64, seed=0, settings={"members": 3, "hidden": (32, 32)})
    return out


def test_model_folder_holds_config_errors_plot_and_starts(model_dir):
    cfg = json.loads((model_dir / "world_model.json").read_text())
    assert cfg["kind"] == "mlp_ensemble" and cfg["env_id"] == "Pendulum-v1" and cfg["max_episode_steps"] == LIMIT
    assert cfg["training"]["steps"] == 12 * LIMIT and cfg["training"]["held_out_episodes"] >= 1
    err = json.loads((model_dir / "prediction_error.json").read_text())
    assert err["horizon"] == list(range(1, 11)) and len(err["obs_nmse"]) == 10 and err["windows"] > 0
    assert all(np.isfinite(err["obs_nmse"])) and all(np.isfinite(err["reward_mae"]))
    assert (model_dir / "prediction_error.png").stat().st_size > 1000
    assert len((model_dir / "training.jsonl").read_text().splitlines()) == 4
    starts = load_starts(model_dir, "all")
    assert starts.shape == (cfg["training"]["train_episodes"] * LIMIT, 3) and starts.dtype == np.float32
    assert load_starts(model_dir, "initial").shape == (cfg["training"]["train_episodes"], 3)


def test_vector_env_contract(model_dir):
    env = VectorEnv(f"world_model/{model_dir}", num_envs=3, seed=0, kwargs={"horizon": 5})
    assert env.single_observation_space.shape == (3,) and env.single_action_space.shape == (1,)
    obs = env.reset()
    assert obs.shape == (3, 3) and obs.dtype == np.float32
    starts = load_starts(model_dir, "all")
    for o in obs:  # every start is a real observation of the dataset
        assert np.isclose(starts, o).all(axis=1).any()
    for t in range(5):
        res = env.step(np.zeros((3, 1, 1), np.float32))
        assert res.obs.shape == (3, 3) and res.obs.dtype == np.float32 and res.reward.dtype == np.float32
        assert not res.terminated.any()  # Pendulum never terminates: the head learned that
        assert res.truncated.all() == (t == 4)
    assert sorted(res.final_obs) == [0, 1, 2]
    assert env.episode_stats()["length"] == [5, 5, 5]
    # same seed, same episode: imagination is reproducible
    a, b = (VectorEnv(f"world_model/{model_dir}", num_envs=2, seed=7, kwargs={"horizon": 5}) for _ in range(2))
    np.testing.assert_array_equal(a.reset(), b.reset())
    act = np.full((2, 1, 1), 0.5, np.float32)
    np.testing.assert_array_equal(a.step(act).obs, b.step(act).obs)


def test_uncertainty_info_and_penalty(model_dir):
    model = load_world_model(model_dir)
    starts = load_starts(model_dir)
    plain, penalised = WorldModelEnv(model, starts, horizon=3), WorldModelEnv(model, starts, horizon=3, uncertainty_penalty=10.0)
    plain.reset(seed=1)
    penalised.reset(seed=1)
    _, r0, _, _, info0 = plain.step(np.array([1.0], np.float32))
    _, r1, _, _, info1 = penalised.step(np.array([1.0], np.float32))
    assert info0["uncertainty"] > 0 and info0["uncertainty"] == pytest.approx(info1["uncertainty"])
    assert r1 == pytest.approx(r0 - 10.0 * info0["uncertainty"], rel=1e-5)


def test_snapshot_resumes_the_imagined_episode_without_copying_starts(model_dir):
    from rlweave.envs.snapshot import restore_env, snapshot_env

    model, starts = load_world_model(model_dir), load_starts(model_dir)
    env, twin = WorldModelEnv(model, starts, horizon=10), WorldModelEnv(model, starts, horizon=10)
    env.reset(seed=3)
    env.step(np.array([0.7], np.float32))
    snap = snapshot_env(env)
    assert all(not (isinstance(v, np.ndarray) and v.size == starts.size) for layer in snap["layers"] for v in layer.values())
    restore_env(twin, snap)
    a, b = env.step(np.array([-0.2], np.float32)), twin.step(np.array([-0.2], np.float32))
    np.testing.assert_array_equal(a[0], b[0])
    assert a[1] == b[1] and env.t == twin.t == 2
    np.testing.assert_array_equal(env.reset()[0], twin.reset()[0])  # the start-drawing generator came along


def test_real_eval_env_is_the_dataset_env(model_dir):
    env = make_env(str(model_dir), real=True, horizon=5)
    try:
        assert env.spec.id == "Pendulum-v1" and env.spec.max_episode_steps == LIMIT
    finally:
        env.close()


def test_training_lowers_prediction_error(dataset):
    torch.manual_seed(0)
    trajs, obs_space, act_space = load_trajectories(dataset)
    train, valid = trajs.subset(range(10)), trajs.subset(range(10, 12))
    model = EnsembleWorldModel(obs_space, act_space, "Pendulum-v1", members=2, hidden=(32, 32))
    tr = {k: torch.from_numpy(v) for k, v in train.transitions().items()}
    model.net.fit_normalizers(tr["obs"], tr["action"], tr["next_obs"], tr["reward"])
    held = {k: torch.from_numpy(v) for k, v in valid.transitions().items()}
    before = model.evaluate_one_step(held)
    records = model.fit(train, valid, epochs=25, batch_size=64, lr=3e-3)
    after = model.evaluate_one_step(held)
    assert after["valid/obs_mse"] < 0.5 * before["valid/obs_mse"], (before, after)
    assert after["valid/loss"] == pytest.approx(min(r["valid/loss"] for r in records), rel=1e-5)  # best epoch kept


def test_save_load_round_trip(model_dir, tmp_path):
    model = load_world_model(model_dir, cache=False)
    model.save(tmp_path / "copy")
    copy = load_world_model(tmp_path / "copy", cache=False)
    obs = load_starts(model_dir)[:4]
    act = np.linspace(-2, 2, 4, dtype=np.float32)[:, None]
    a, b = model.step(model.encode(obs), act), copy.step(copy.encode(obs), act)
    np.testing.assert_array_equal(a.obs, b.obs)
    np.testing.assert_array_equal(a.reward, b.reward)
    np.testing.assert_array_equal(a.uncertainty, b.uncertainty)
    assert copy.env_id == "Pendulum-v1" and copy.observation_space == model.observation_space


def test_bad_input_errors_are_one_line(model_dir, dataset, tmp_path, capsys):
    cases = [
        (["train-world-model", str(tmp_path / "missing")], "no such folder"),
        (["train-world-model", str(tmp_path)], "not a Minari dataset folder"),
        (["train-world-model", str(dataset), "-o", str(tmp_path / "m"), "--epochs", "0"], "--epochs: must be >= 1"),
        (["train-world-model", str(dataset), "-o", str(model_dir)], "already holds a world model"),
        (["train-world-model", str(dataset), "--set", "hidden=a,b"], "--set: expected"),
        (["train-world-model", str(dataset), "-o", str(tmp_path / "m"), "--set", "latent=8"], "has no setting(s) ['latent']"),
        (["train-world-model", str(dataset), "-o", str(tmp_path / "m"), "--kind", "video"], "unknown world-model kind"),
        (["world-model-video", str(tmp_path)], "neither a run folder"),
    ]
    for argv, needle in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert needle in err and len(err.splitlines()) == 1, (argv, err)
    with pytest.raises(WorldModelError, match="env.kwargs: .*unknown"):
        make_env(str(model_dir), horizn=5)
    with pytest.raises(WorldModelError, match="no world_model.json"):
        make_env(str(tmp_path))
    with pytest.raises(WorldModelError, match="env.kwargs.starts"):
        make_env(str(model_dir), starts="middle")
    with pytest.raises(WorldModelError, match="env.kwargs.horizon"):
        make_env(str(model_dir), horizon=0)


def test_real_vs_imagined_video(model_dir, tmp_path, capsys):
    pytest.importorskip("pygame")  # Pendulum renders through pygame (the world_models extra)
    assert main(["world-model-video", str(model_dir), "-o", str(tmp_path / "v.gif"), "--steps", "6"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["steps"] == 6 and out["video"].endswith(".gif")
    assert (tmp_path / "v.gif").stat().st_size > 1000


# --------------------------------------------------------------------------- the pixel model
class DotEnv(gym.Env):
    """A 16x16 camera image of a dot the action pushes around; reward: closeness to the centre."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, render_mode: str | None = "rgb_array"):
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Box(0, 255, (16, 16, 3), dtype=np.uint8)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), dtype=np.float32)
        self.pos = np.zeros(2)

    def render(self) -> np.ndarray:
        img = np.zeros((16, 16, 3), np.uint8)
        y, x = np.clip(np.round(self.pos).astype(int), 1, 14)
        img[y - 1:y + 2, x - 1:x + 2] = (255, 200, 40)
        return img

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = self.np_random.uniform(3, 12, size=2)
        return self.render(), {}

    def step(self, action):
        self.pos = np.clip(self.pos + 1.5 * np.asarray(action, dtype=np.float64), 1, 14)
        return self.render(), float(-np.abs(self.pos - 7.5).sum() / 7.5), False, False, {}


@pytest.fixture(scope="module")
def pixel_model_dir(tmp_path_factory):
    if "WMDot-v0" not in gym.registry:
        gym.register("WMDot-v0", entry_point=f"{__name__}:DotEnv", max_episode_steps=20)  # a string: Minari stores the spec
    root = tmp_path_factory.mktemp("wm_pixels")
    collect_dataset(lambda **kw: gym.make("WMDot-v0"), None, episodes=10, out=root / "dots", name="wm_dots", seed=0)
    torch.set_num_threads(1)
    train_world_model(root / "dots", root / "model", epochs=3, horizon=6, batch_size=16, seed=0,
                      settings={"latent": 32, "width": 8, "seq_len": 4})
    return root / "model"


def test_pixel_model_trains_and_steps_as_a_vector_env(pixel_model_dir):
    cfg = json.loads((pixel_model_dir / "world_model.json").read_text())
    assert cfg["kind"] == "pixel_rnn" and cfg["env_id"] == "WMDot-v0"  # chosen by --kind auto for images
    log = [json.loads(line) for line in (pixel_model_dir / "training.jsonl").read_text().splitlines()]
    assert log[-1]["train/loss"] < log[0]["train/loss"]
    err = json.loads((pixel_model_dir / "prediction_error.json").read_text())
    assert len(err["obs_nmse"]) == 6 and all(np.isfinite(err["obs_nmse"]))
    starts = load_starts(pixel_model_dir)
    assert starts.dtype == np.uint8 and starts.shape[1:] == (16, 16, 3)
    env = VectorEnv(f"world_model/{pixel_model_dir}", num_envs=2, seed=0, kwargs={"horizon": 3},
                    pixels={"enabled": True, "width": 16, "height": 16})
    obs = env.reset()
    assert obs.shape == (2, 16, 16, 3) and obs.dtype == np.uint8
    for t in range(3):
        res = env.step(np.zeros((2, 1, 2), np.float32))
        assert res.obs.dtype == np.uint8 and res.obs.shape == (2, 16, 16, 3) and res.truncated.all() == (t == 2)
    real = make_env(str(pixel_model_dir), real=True)  # evaluation: the real env, giving the same images
    try:
        assert real.observation_space.shape == (16, 16, 3) and real.reset(seed=0)[0].dtype == np.uint8
    finally:
        real.close()


def test_pixel_model_round_trip_and_video(pixel_model_dir, tmp_path, capsys):
    model = load_world_model(pixel_model_dir, cache=False)
    model.save(tmp_path / "copy")
    copy = load_world_model(tmp_path / "copy", cache=False)
    obs = load_starts(pixel_model_dir)[:3]
    act = np.full((3, 2), 0.3, np.float32)
    np.testing.assert_array_equal(model.step(model.encode(obs), act).obs, copy.step(copy.encode(obs), act).obs)
    assert main(["world-model-video", str(pixel_model_dir), "-o", str(tmp_path / "v.gif"), "--steps", "5"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["steps"] == 5 and (tmp_path / "v.gif").stat().st_size > 500
