"""Evaluation videos: the writer makes a GIF a viewer can read back (frames upscaled, strips with
the instruction, the step and the outcome); evaluation records exactly the asked number of episodes
on envs with camera images (MetaWorld's dict observations, gymnasium pixel observations) and none on
envs without; a run records at its evaluations with ``train.eval_videos``, and ``rlweave eval
--video`` records and names its files."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

os.environ.setdefault("MUJOCO_GL", "egl")

import imageio.v3 as iio  # noqa: E402

from helpers import read_metrics, run_cli, train  # noqa: E402
from rlweave.runners.evaluate import evaluate_policy  # noqa: E402
from rlweave.utils.video import VideoError, _STRIP_RGB, FAILURE, SUCCESS, write_episode_video  # noqa: E402

GREEN, RED = np.array(_STRIP_RGB[SUCCESS]), np.array(_STRIP_RGB[FAILURE])


def _frames(n: int = 6, size: int = 32) -> list[np.ndarray]:
    """A gradient with a red square moving down: smooth colours, each frame different."""
    x = np.linspace(0, 255, size)
    base = np.stack([np.add.outer(x, x) / 2, np.tile(x, (size, 1)), np.full((size, size), 80)], -1).astype(np.uint8)
    out = []
    for t in range(n):
        f = base.copy()
        f[4 + t: 10 + t, 4:10] = (255, 0, 0)
        out.append(f)
    return out


def _bottom_colour(frame: np.ndarray) -> np.ndarray:
    """The colour of the bottom strip (its left edge, under no text)."""
    return frame[-2, 1].astype(int)


# --------------------------------------------------------------------------- the writer
def test_writer_makes_a_readable_gif_with_upscaled_annotated_frames(tmp_path):
    frames = _frames(6, 32)
    path = write_episode_video(tmp_path / "ep", frames, "reach the goal", success=True, fps=10)
    assert path == tmp_path / "ep.gif" and path.is_file()
    video = iio.imread(path, index=None)
    assert video.shape[0] == 6 and video.dtype == np.uint8
    assert video.shape[2] == 256  # 32 px * 8: at least 256 wide, nearest (integer) scale
    header = (video.shape[1] - 256) // 2  # a one-line instruction strip is as high as the step strip
    body = video[0, header: header + 256]
    assert not np.array_equal(video[0], np.repeat(np.repeat(frames[0], 8, 0), 8, 1))  # strips were drawn
    # the camera image is the frame, upscaled: the red square sits where it was, 8x bigger
    assert (np.abs(body[4 * 8: 10 * 8, 4 * 8: 10 * 8].astype(int) - (255, 0, 0)).max()) <= 8
    assert np.abs(body.astype(int)[::8, ::8] - frames[0].astype(int)).mean() < 6  # palette error only
    assert not np.array_equal(video[0, :header], video[0, header + 256:])  # instruction on top, step below
    np.testing.assert_array_equal(_bottom_colour(video[-1]), GREEN)  # the outcome on the last frame only
    assert not np.array_equal(_bottom_colour(video[0]), GREEN)
    durations = [iio.immeta(path, index=i)["duration"] for i in (0, 5)]
    assert durations == [100, 1000]  # 10 fps; the last frame held for a second


def test_writer_failure_no_instruction_and_bad_input(tmp_path):
    path = write_episode_video(tmp_path / "x.gif", _frames(3, 64), None, success=False)
    video = iio.imread(path, index=None)
    assert video.shape[0] == 3 and video.shape[2] == 256  # 64 px * 4
    np.testing.assert_array_equal(_bottom_colour(video[-1]), RED)
    none = iio.imread(write_episode_video(tmp_path / "y.gif", _frames(2), None, success=None), index=None)
    assert not any(np.array_equal(_bottom_colour(none[-1]), c) for c in (GREEN, RED))  # no outcome reported
    with pytest.raises(VideoError, match="no frames"):
        write_episode_video(tmp_path / "z.gif", [], None, None)
    with pytest.raises(VideoError, match=r"uint8 \[H, W, 3\]"):
        write_episode_video(tmp_path / "z.gif", [np.zeros((8, 8), np.uint8)], None, None)
    with pytest.raises(VideoError, match="format"):
        write_episode_video(tmp_path / "z.gif", _frames(2), None, None, format="webm")


# --------------------------------------------------------------------------- evaluation
class _ScriptedPolicy:
    """The policy contract evaluation uses (eval, act, env_action), acting by a function of the
    batch: MetaWorld's scripted expert, or zeros."""

    def __init__(self, fn):
        self.fn = fn

    def eval(self):
        return self

    def act(self, obs, deterministic=True):
        return torch.as_tensor(self.fn(obs))[:, None], None, None  # [n, chunk=1, action]

    def env_action(self, action):
        return action


def _expert(obs) -> np.ndarray:
    from rlweave.envs.metaworld_suite import expert

    return expert({"privileged": obs["privileged"].numpy(), "instruction": obs["instruction"].numpy()})


def test_evaluate_records_metaworld_episodes_with_instruction_and_outcome(tmp_path):
    pytest.importorskip("metaworld")
    env = {"id": "metaworld/reach-v3", "pixels": {"enabled": True, "width": 32, "height": 32}, "max_episode_steps": 60}
    out = evaluate_policy(_ScriptedPolicy(_expert), env, episodes=3, seed=0, videos=2, video_dir=tmp_path, tag="t")
    assert out["eval/success_rate"] == 1.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t_ep0.gif", "t_ep1.gif"]
    assert out["eval/videos"] == [str(tmp_path / "t_ep0.gif"), str(tmp_path / "t_ep1.gif")]
    video = iio.imread(tmp_path / "t_ep0.gif", index=None)
    assert 2 <= video.shape[0] <= 61  # the reset observation and one per decision, up to the end
    np.testing.assert_array_equal(_bottom_colour(video[-1]), GREEN)

    zeros = _ScriptedPolicy(lambda obs: np.zeros((obs["state"].shape[0], 4), np.float32))
    env["max_episode_steps"] = 5
    out = evaluate_policy(zeros, env, episodes=2, seed=0, videos=5, video_dir=tmp_path / "z", tag="t")
    assert out["eval/success_rate"] == 0.0 and len(out["eval/videos"]) == 2  # no more videos than episodes
    video = iio.imread(tmp_path / "z" / "t_ep1.gif", index=None)
    assert video.shape[0] == 6  # reset + 5 steps
    np.testing.assert_array_equal(_bottom_colour(video[-1]), RED)


def test_evaluation_in_batches_of_envs_is_the_same_evaluation(tmp_path):
    """``max_envs`` (train.eval_max_envs) bounds the envs alive at once; each episode keeps the seed
    and the task (env slot) it has when all run at once, and videos continue across batches."""
    pytest.importorskip("metaworld")
    env = {"id": "metaworld/reach-v3,button-press-topdown-v3", "max_episode_steps": 12,
           "pixels": {"enabled": True, "width": 32, "height": 32}}
    whole = evaluate_policy(_ScriptedPolicy(_expert), env, episodes=5, seed=3, videos=3, video_dir=tmp_path / "a", tag="t")
    batched = evaluate_policy(_ScriptedPolicy(_expert), env, episodes=5, seed=3, videos=3, video_dir=tmp_path / "b",
                              tag="t", max_envs=2)
    assert {k: v for k, v in whole.items() if k != "eval/videos"} == {k: v for k, v in batched.items() if k != "eval/videos"}
    assert {"eval/success_rate/reach-v3", "eval/success_rate/button-press-topdown-v3"} <= set(whole)
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["t_ep0.gif", "t_ep1.gif", "t_ep2.gif"]
    for name in ("t_ep0.gif", "t_ep2.gif"):  # the third episode ran in the second batch: the same frames
        np.testing.assert_array_equal(iio.imread(tmp_path / "a" / name, index=None), iio.imread(tmp_path / "b" / name, index=None))
    with pytest.raises(ValueError, match="train.eval_max_envs"):
        evaluate_policy(_ScriptedPolicy(_expert), env, episodes=2, seed=0, max_envs=0)


def test_evaluate_records_pixel_gym_envs_and_skips_envs_without_images(tmp_path):
    pix = {"id": "InvertedPendulum-v5", "max_episode_steps": 8,
           "pixels": {"enabled": True, "width": 32, "height": 32, "frame_stack": 2}}  # [32, 32, 6]: newest frame
    zeros = _ScriptedPolicy(lambda obs: np.zeros((obs.shape[0], 1), np.float32))
    out = evaluate_policy(zeros, pix, episodes=2, seed=0, videos=1, video_dir=tmp_path / "pix", tag="e")
    assert [p.name for p in (tmp_path / "pix").iterdir()] == ["e_ep0.gif"]
    assert iio.imread(tmp_path / "pix" / "e_ep0.gif", index=None).shape[0] >= 2

    state = {"id": "InvertedPendulum-v5", "max_episode_steps": 8}
    out = evaluate_policy(zeros, state, episodes=2, seed=0, videos=2, video_dir=tmp_path / "state", tag="e")
    assert "eval/videos" not in out and not (tmp_path / "state").exists()
    out = evaluate_policy(zeros, state, episodes=2, seed=0)  # the default: nothing recorded
    assert "eval/videos" not in out


# --------------------------------------------------------------------------- runs and the command
TINY_PIXELS = ["cluster.local=true", "env.num_envs=2", "env.max_episode_steps=20", "train.rollout_steps=8",
               "train.total_env_steps=16", "train.eval_every=1", "train.eval_episodes=2", "train.eval_videos=1",
               "algorithm.epochs=1", "algorithm.minibatch_size=16", "run.progress=false", "run.tensorboard=false"]


def test_run_records_at_evaluations_and_eval_command_records_on_request(tmp_path, capsys):
    run_dir = tmp_path / "run"
    rc, out = train("ppo-pixels", *TINY_PIXELS, f"run.dir={run_dir}")
    assert rc == 0, out
    evaluated = [r for r in read_metrics(run_dir) if "eval/videos" in r]
    assert [r["iteration"] for r in evaluated] == [1]  # one iteration, evaluated
    assert sorted(p.name for p in (run_dir / "videos").iterdir()) == ["iter_00000001_ep0.gif"]

    rc, out = run_cli("eval", str(run_dir), "--episodes", "2", "--video")
    assert rc == 0, out
    result = json.loads(out.strip().splitlines()[-1])
    names = [os.path.basename(p) for p in result["eval/videos"]]
    assert names == [f"eval_{result['checkpoint']}_ep{i}.gif" for i in range(2)]  # --video 3, capped by --episodes
    assert all(os.path.isfile(p) for p in result["eval/videos"])
    rc, out = run_cli("eval", str(run_dir), "--episodes", "1")
    assert rc == 0 and "eval/videos" not in json.loads(out.strip().splitlines()[-1])
    rc, batched = run_cli("eval", str(run_dir), "--episodes", "2", "--max-envs", "1")  # the same episodes, one env at a time
    assert rc == 0 and json.loads(batched.strip().splitlines()[-1]) == {k: v for k, v in result.items() if k != "eval/videos"}
    rc, _ = run_cli("eval", str(run_dir), "--max-envs", "0")
    assert rc != 0 and "--max-envs: must be >= 1" in capsys.readouterr().err
