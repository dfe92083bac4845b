"""Tests for rlweave.models: policy contract, distributions, normaliser, checksum, registry."""
import re

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.distributions import Categorical, Normal

from rlweave.models import (
    POLICIES,
    CNNPolicy,
    MLPPolicy,
    Policy,
    RunningMeanStd,
    build_policy,
    flat_params_checksum,
    register_policy,
)

OBS_DIM = 5
BOX = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
BOX2D = gym.spaces.Box(-1.0, 1.0, (2, 2), np.float32)
DISC = gym.spaces.Discrete(4)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _random_log_std(p: Policy) -> None:
    with torch.no_grad():
        p.log_std.copy_(torch.randn_like(p.log_std) * 0.5)


@pytest.mark.parametrize("space", [BOX, BOX2D, DISC], ids=["box", "box2d", "discrete"])
@pytest.mark.parametrize("chunk", [1, 3])
def test_shapes(space, chunk):
    p = MLPPolicy(OBS_DIM, space, chunk=chunk)
    obs = torch.randn(7, OBS_DIM)
    a, lp, v = p.act(obs)
    if isinstance(space, gym.spaces.Discrete):
        assert a.shape == (7, chunk) and a.dtype == torch.long
        assert int(a.min()) >= 0 and int(a.max()) < space.n
    else:
        assert a.shape == (7, chunk, *space.shape) and a.dtype == torch.float32
    assert lp.shape == (7,) and v.shape == (7,)
    assert not a.requires_grad and not lp.requires_grad and not v.requires_grad
    lp2, ent, v2 = p.evaluate(obs, a)
    assert lp2.shape == ent.shape == v2.shape == (7,)
    assert p.value(obs).shape == (7,)
    # forward dispatches to act / evaluate (so DDP-wrapped policies work)
    assert p(obs)[0].shape == a.shape
    assert torch.allclose(p(obs, a)[0], lp2)


@pytest.mark.parametrize("space", [BOX, DISC], ids=["box", "discrete"])
@pytest.mark.parametrize("chunk", [1, 3])
@pytest.mark.parametrize("shared", [False, True])
def test_act_log_prob_matches_evaluate(space, chunk, shared):
    p = MLPPolicy(OBS_DIM, space, chunk=chunk, shared_backbone=shared, normalize_obs=True)
    p.update_obs_stats(torch.randn(50, OBS_DIM) * 3 + 1)
    if not p.discrete:
        _random_log_std(p)
    obs = torch.randn(16, OBS_DIM)
    for det in (False, True):
        a, lp, v = p.act(obs, deterministic=det)
        lp2, _, v2 = p.evaluate(obs, a)
        torch.testing.assert_close(lp, lp2, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v, v2)
        torch.testing.assert_close(p.value(obs), v2)


def test_evaluate_has_gradients():
    p = MLPPolicy(OBS_DIM, BOX, chunk=2)
    obs = torch.randn(4, OBS_DIM)
    a, _, _ = p.act(obs)
    lp, ent, v = p.evaluate(obs, a)
    (lp.sum() + ent.sum() + v.sum()).backward()
    for name in ("log_std", "actor_head.weight", "actor_body.0.weight", "critic_head.weight",
                 "critic_body.0.weight"):
        g = dict(p.named_parameters())[name].grad
        assert g is not None and g.abs().sum() > 0, name


@pytest.mark.parametrize("chunk", [1, 3])
@pytest.mark.parametrize("space", [BOX, BOX2D], ids=["box", "box2d"])
def test_gaussian_matches_torch_normal(space, chunk):
    p = MLPPolicy(OBS_DIM, space, chunk=chunk, log_std_init=-0.3)
    _random_log_std(p)
    obs = torch.randn(9, OBS_DIM)
    mean = p.distribution_params(obs).reshape(9, -1)
    std = p.log_std.exp().expand_as(mean)
    dist = Normal(mean, std)
    action = torch.randn(9, chunk, *space.shape) * 2
    lp, ent, _ = p.evaluate(obs, action)
    torch.testing.assert_close(lp, dist.log_prob(action.reshape(9, -1)).sum(-1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, dist.entropy().sum(-1), rtol=1e-5, atol=1e-5)
    # sampled actions: log-prob reported by act equals Normal's
    a, lp_act, _ = p.act(obs)
    torch.testing.assert_close(lp_act, dist.log_prob(a.reshape(9, -1)).sum(-1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk", [1, 3])
def test_categorical_matches_torch_categorical(chunk):
    p = MLPPolicy(OBS_DIM, DISC, chunk=chunk, ortho_init=False)  # default init: non-flat logits
    obs = torch.randn(9, OBS_DIM)
    logits = p.distribution_params(obs)
    assert logits.shape == (9, chunk, DISC.n)
    dist = Categorical(logits=logits)
    action = torch.randint(0, DISC.n, (9, chunk))
    lp, ent, _ = p.evaluate(obs, action)
    torch.testing.assert_close(lp, dist.log_prob(action).sum(-1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, dist.entropy().sum(-1), rtol=1e-5, atol=1e-5)
    a, lp_act, _ = p.act(obs)
    torch.testing.assert_close(lp_act, dist.log_prob(a).sum(-1), rtol=1e-5, atol=1e-5)


def test_categorical_sampling_frequencies():
    p = MLPPolicy(OBS_DIM, DISC, ortho_init=False)
    with torch.no_grad():
        p.actor_head.weight.zero_()
        p.actor_head.bias.copy_(torch.tensor([0.0, 1.0, 2.0, -1.0]))
    a, _, _ = p.act(torch.zeros(20000, OBS_DIM))
    freq = torch.bincount(a.reshape(-1), minlength=4).float() / a.numel()
    torch.testing.assert_close(freq, torch.softmax(p.actor_head.bias.detach(), 0), atol=0.015, rtol=0)


def test_gaussian_sampling_moments():
    p = MLPPolicy(OBS_DIM, BOX, log_std_init=np.log(0.5))
    obs = torch.zeros(20000, OBS_DIM)
    a, _, _ = p.act(obs)
    mean = p.distribution_params(obs[:1]).reshape(-1)
    torch.testing.assert_close(a.reshape(-1, 3).mean(0), mean.detach(), atol=0.02, rtol=0)
    torch.testing.assert_close(a.reshape(-1, 3).std(0), torch.full((3,), 0.5), atol=0.02, rtol=0)


@pytest.mark.parametrize("chunk", [1, 3])
def test_deterministic_returns_mean_and_argmax(chunk):
    obs = torch.randn(6, OBS_DIM)
    pb = MLPPolicy(OBS_DIM, BOX, chunk=chunk, log_std_init=1.0)
    a, _, _ = pb.act(obs, deterministic=True)
    torch.testing.assert_close(a, pb.distribution_params(obs).detach())
    a_s, _, _ = pb.act(obs, deterministic=False)
    assert not torch.allclose(a_s, a)
    pd = MLPPolicy(OBS_DIM, DISC, chunk=chunk, ortho_init=False)
    a, _, _ = pd.act(obs, deterministic=True)
    torch.testing.assert_close(a, pd.distribution_params(obs).argmax(-1))


def test_no_critic():
    p = MLPPolicy(OBS_DIM, BOX, critic=False)
    names = [n for n, _ in p.named_parameters()]
    assert not any("critic" in n for n in names), names
    with_critic = sum(x.numel() for x in MLPPolicy(OBS_DIM, BOX).parameters())
    assert sum(x.numel() for x in p.parameters()) < with_critic
    obs = torch.randn(4, OBS_DIM)
    _, _, v = p.act(obs)
    assert torch.equal(v, torch.zeros(4))
    assert torch.equal(p.evaluate(obs, torch.zeros(4, 1, 3))[2], torch.zeros(4))
    assert torch.equal(p.value(obs), torch.zeros(4))
    c = CNNPolicy((36, 36, 3), DISC, critic=False)
    assert not any("critic" in n for n, _ in c.named_parameters())
    assert torch.equal(c.act(torch.zeros(2, 36, 36, 3, dtype=torch.uint8))[2], torch.zeros(2))


def test_init_gains():
    p = MLPPolicy(OBS_DIM, BOX, hidden=(64, 64))
    # orthogonal rows scaled by the gain: W W^T = gain^2 I (rows <= cols) or W^T W (rows > cols)
    w = p.actor_head.weight.detach()
    torch.testing.assert_close(w @ w.T, 0.01 ** 2 * torch.eye(3), atol=1e-6, rtol=0)
    w = p.critic_head.weight.detach()
    torch.testing.assert_close(w @ w.T, torch.eye(1), atol=1e-5, rtol=0)
    w = p.actor_body[2].weight.detach()
    torch.testing.assert_close(w @ w.T, 2.0 * torch.eye(64), atol=1e-4, rtol=0)
    assert torch.count_nonzero(p.actor_body[0].bias) == 0


def test_running_mean_std_matches_numpy():
    rng = np.random.default_rng(0)
    rms = RunningMeanStd((3,))
    chunks = []
    for n, loc in [(1, 5.0), (7, -2.0), (64, 0.5), (3, 10.0), (200, 1.0), (0, 0.0)]:
        x = rng.normal(loc, 2.0, size=(n, 3))
        chunks.append(x)
        rms.update(torch.as_tensor(x, dtype=torch.float32))
    allx = np.concatenate(chunks).astype(np.float32).astype(np.float64)
    np.testing.assert_allclose(rms.mean.numpy(), allx.mean(0), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(rms.var.numpy(), allx.var(0), rtol=1e-10)
    assert rms.count.item() == len(allx)
    assert rms.mean.dtype == rms.var.dtype == rms.count.dtype == torch.float64
    y = rms.normalize(torch.as_tensor(allx, dtype=torch.float32))
    assert y.dtype == torch.float32
    np.testing.assert_allclose(y.mean(0).numpy(), 0.0, atol=1e-5)
    np.testing.assert_allclose(y.std(0, unbiased=False).numpy(), 1.0, atol=1e-5)
    big = torch.full((1, 3), 1e6)
    assert torch.all(rms.normalize(big, clip=10.0) == 10.0)
    assert torch.all(rms.normalize(big, clip=None) > 10.0)


def test_normalize_follows_every_change_of_the_statistics():
    """normalize() caches the statistics in the input's dtype; each way they can change (update,
    load_state_dict as in weight sync, a device/dtype move, inference mode) must be seen."""

    def expected(rms, x):
        std = (rms.var + rms.epsilon).sqrt().float()
        return ((x - rms.mean.float()) / std).clamp(-10, 10)

    rms = RunningMeanStd(2)
    x = torch.tensor([[1.0, -2.0], [3.0, 4.0]])
    assert torch.equal(rms.normalize(x), expected(rms, x))  # fresh statistics: the identity
    rms.update(torch.tensor([[10.0, 0.0], [14.0, 2.0]]))
    first = rms.normalize(x)
    assert torch.equal(first, expected(rms, x)) and not torch.equal(first, x)
    other = RunningMeanStd(2)
    other.update(torch.tensor([[-5.0, 1.0], [5.0, 9.0]]))
    rms.load_state_dict(other.state_dict())  # in-place copies, as a weight sync does
    assert torch.equal(rms.normalize(x), expected(other, x))
    with torch.inference_mode():
        inside = rms.normalize(x)
    assert torch.equal(inside, expected(other, x))
    w = torch.ones(2, requires_grad=True)  # the cached tensors can still enter a graph later
    (rms.normalize(x) * w).sum().backward()
    assert torch.equal(w.grad, expected(other, x).sum(0))
    rms.to(torch.float32)  # a dtype move: the statistics stay float64 and normalize still matches
    assert rms.mean.dtype == torch.float64
    assert torch.equal(rms.normalize(x.double()), ((x.double() - rms.mean) / (rms.var + rms.epsilon).sqrt()).clamp(-10, 10))


def test_running_mean_std_update_from_moments():
    rng = np.random.default_rng(1)
    xa = torch.as_tensor(rng.normal(1.0, 3.0, (40, 2)))
    xb = torch.as_tensor(rng.normal(-4.0, 0.5, (25, 2)))
    xc = torch.as_tensor(rng.normal(2.0, 1.0, (10, 2)))
    ref = RunningMeanStd(2)
    for x in (xa, xb, xc):
        ref.update(x)
    # rank-local statistics, merged the way a distributed all-reduce would combine them
    merged = RunningMeanStd(2)
    merged.update(xa)
    n = len(xb) + len(xc)
    s1 = xb.sum(0) + xc.sum(0)
    s2 = (xb ** 2).sum(0) + (xc ** 2).sum(0)
    mean = s1 / n
    merged.update_from_moments(mean, s2 / n - mean ** 2, n)
    torch.testing.assert_close(merged.mean, ref.mean)
    torch.testing.assert_close(merged.var, ref.var)
    assert merged.count.item() == ref.count.item() == 75
    merged.update_from_moments(torch.zeros(2), torch.ones(2), 0)  # empty: no change
    torch.testing.assert_close(merged.var, ref.var)


def test_normaliser_buffers_and_checksum():
    p = MLPPolicy(OBS_DIM, BOX, normalize_obs=True)
    sd = p.state_dict()
    for k in ("obs_rms.mean", "obs_rms.var", "obs_rms.count"):
        assert k in sd
    c0 = flat_params_checksum(p)
    assert re.fullmatch(r"[0-9a-f]{32}", c0)
    assert flat_params_checksum(p) == c0
    obs = torch.randn(3, OBS_DIM) * 4 + 2
    a0 = p.act(obs, deterministic=True)[0]
    p.update_obs_stats(torch.randn(10, OBS_DIM) * 4 + 2)
    c1 = flat_params_checksum(p)
    assert c1 != c0  # only buffers changed
    assert not torch.allclose(p.act(obs, deterministic=True)[0], a0)  # statistics are used
    # a one-element buffer change is seen too
    with torch.no_grad():
        p.obs_rms.count.add_(1)
    assert flat_params_checksum(p) != c1
    q = MLPPolicy(OBS_DIM, BOX, normalize_obs=True)
    assert flat_params_checksum(q) != flat_params_checksum(p)
    q.load_state_dict(p.state_dict())
    assert flat_params_checksum(q) == flat_params_checksum(p)
    torch.testing.assert_close(q.act(obs, deterministic=True)[0], p.act(obs, deterministic=True)[0])
    # no normaliser: update is a no-op and no buffers
    r = MLPPolicy(OBS_DIM, BOX)
    c = flat_params_checksum(r)
    r.update_obs_stats(obs)
    assert flat_params_checksum(r) == c and not list(r.buffers())


def test_checksum_sees_dtype_and_names():
    p = MLPPolicy(OBS_DIM, BOX)
    c = flat_params_checksum(p)
    assert flat_params_checksum(p.double()) != c
    lin_a, lin_b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    lin_b.load_state_dict(lin_a.state_dict())
    assert flat_params_checksum(lin_a) == flat_params_checksum(lin_b)
    seq = torch.nn.Sequential(lin_a)
    assert flat_params_checksum(seq) != flat_params_checksum(lin_a)  # names differ
    assert flat_params_checksum(lin_a.to(torch.bfloat16)) != flat_params_checksum(lin_b)

    def holder(t):
        m = torch.nn.Module()
        m.register_buffer("b", t)
        return m

    base = flat_params_checksum(holder(torch.zeros(4)))
    assert flat_params_checksum(holder(torch.zeros(4))) == base
    assert flat_params_checksum(holder(torch.zeros(4, dtype=torch.int32))) != base  # same bytes
    assert flat_params_checksum(holder(torch.zeros(2, 2))) != base  # same bytes, other shape


@pytest.mark.parametrize("shape,flat", [((64, 64, 6), 32 * 4 * 4), ((84, 84, 3), 32 * 7 * 7)])
@pytest.mark.parametrize("space", [BOX, DISC], ids=["box", "discrete"])
def test_cnn_forward(shape, flat, space):
    chunk = 2
    p = CNNPolicy(shape, space, chunk=chunk)
    assert p.encoder[0].in_channels == shape[2]
    linear = [m for m in p.encoder if isinstance(m, torch.nn.Linear)][0]
    assert linear.in_features == flat
    obs = torch.randint(0, 256, (3, *shape), dtype=torch.uint8)
    a, lp, v = p.act(obs)
    if p.discrete:
        assert a.shape == (3, chunk) and a.dtype == torch.long
    else:
        assert a.shape == (3, chunk, 3)
    assert lp.shape == v.shape == (3,)
    lp2, ent, v2 = p.evaluate(obs, a)
    torch.testing.assert_close(lp, lp2, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(v, v2)
    assert ent.shape == (3,)
    # scaling /255 and HWC -> CHW happen inside the model
    h = p.encoder(obs.permute(0, 3, 1, 2).float() / 255.0)
    torch.testing.assert_close(v, p.critic_head(h).squeeze(-1))
    torch.testing.assert_close(p.value(obs.float()), v)  # float images in [0, 255] work too
    (lp2.sum() + v2.sum()).backward()
    assert p.encoder[0].weight.grad.abs().sum() > 0


def test_cnn_small_image_and_hwc_layout():
    p = CNNPolicy((16, 16, 3), DISC, hidden=32)
    obs = torch.zeros(2, 16, 16, 3, dtype=torch.uint8)
    assert p.act(obs)[0].shape == (2, 1)
    # an image that differs only in channel 2 must reach the encoder as channel 2 (HWC -> CHW)
    conv = p.encoder[0]
    with torch.no_grad():
        conv.weight.zero_()
        conv.weight[:, 2] = 1.0
    base = p.value(obs)
    obs2 = obs.clone()
    obs2[..., 0] = 255
    torch.testing.assert_close(p.value(obs2), base)
    obs3 = obs.clone()
    obs3[..., 2] = 255
    assert not torch.allclose(p.value(obs3), base)


def test_build_policy():
    img = gym.spaces.Box(0, 255, (64, 64, 3), np.uint8)
    flat = gym.spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32)
    p = build_policy("mlp", flat, BOX, hidden=(32,), chunk=2, normalize_obs=True)
    assert isinstance(p, MLPPolicy) and p.obs_dim == OBS_DIM and p.chunk == 2
    assert p.obs_rms is not None
    c = build_policy("cnn", img, DISC)
    assert isinstance(c, CNNPolicy) and c.obs_shape == (64, 64, 3)
    assert set(POLICIES) >= {"mlp", "cnn"}

    with pytest.raises(ValueError, match=re.escape(
            "policy 'mlp' needs a 1-D Box observation space, got Box(0, 255, (64, 64, 3), uint8)")):
        build_policy("mlp", img, BOX)
    with pytest.raises(ValueError, match=r"^policy 'cnn' needs a 3-D uint8 Box observation space "
                                         r"\(H, W, C\), got Box\(-inf, inf, \(5,\), float32\)$"):
        build_policy("cnn", flat, BOX)
    float_img = gym.spaces.Box(0.0, 1.0, (64, 64, 3), np.float32)
    with pytest.raises(ValueError, match=r"^policy 'cnn' needs a 3-D uint8 Box"):
        build_policy("cnn", float_img, BOX)
    with pytest.raises(ValueError, match=re.escape(
            "policy 'mlp' needs a Box or Discrete action space, got MultiDiscrete([3 3])")):
        build_policy("mlp", flat, gym.spaces.MultiDiscrete([3, 3]))
    with pytest.raises(KeyError, match=r"unknown policy 'transformer'; known policies: .*cnn, .*mlp"):
        build_policy("transformer", flat, BOX)


def test_register_policy():
    calls = []

    @register_policy("test_tiny_mlp")
    def _tiny(observation_space, action_space, **kw):
        calls.append(kw)
        return MLPPolicy(observation_space.shape[0], action_space, hidden=(8,), **kw)

    try:
        p = build_policy("test_tiny_mlp", gym.spaces.Box(-1, 1, (4,)), DISC, chunk=2)
        assert isinstance(p, MLPPolicy) and p.actor_body[0].out_features == 8 and calls == [{"chunk": 2}]
        with pytest.raises(KeyError, match="test_tiny_mlp"):
            build_policy("nope", gym.spaces.Box(-1, 1, (4,)), DISC)
    finally:
        POLICIES.pop("test_tiny_mlp", None)


def test_bad_arguments():
    with pytest.raises(ValueError, match="chunk"):
        MLPPolicy(OBS_DIM, BOX, chunk=0)
    with pytest.raises(ValueError, match="activation"):
        MLPPolicy(OBS_DIM, BOX, activation="swishy")
    with pytest.raises(TypeError, match="Box or Discrete"):
        MLPPolicy(OBS_DIM, gym.spaces.MultiBinary(3))


def test_custom_activation_class_path_matches():
    # an nn.Module class goes through the modules; "relu" by name through the fast path
    a = MLPPolicy(OBS_DIM, BOX, activation=torch.nn.ReLU)
    b = MLPPolicy(OBS_DIM, BOX, activation="relu")
    b.load_state_dict(a.state_dict())
    obs = torch.randn(5, OBS_DIM)
    torch.testing.assert_close(a.act(obs, True)[0], b.act(obs, True)[0])
    torch.testing.assert_close(a.value(obs), b.value(obs))


def test_dtypes_and_serialisation():
    import copy
    import pickle

    p = MLPPolicy(OBS_DIM, BOX, normalize_obs=True)
    p.update_obs_stats(torch.randn(20, OBS_DIM) * 3)
    obs64 = torch.randn(4, OBS_DIM, dtype=torch.float64)  # e.g. straight from a numpy env
    a, lp, v = p.act(obs64, deterministic=True)
    assert a.dtype == lp.dtype == v.dtype == torch.float32
    torch.testing.assert_close(a, p.act(obs64.float(), deterministic=True)[0])
    for q in (pickle.loads(pickle.dumps(p)), copy.deepcopy(p)):  # Ray ships policies by pickle
        assert flat_params_checksum(q) == flat_params_checksum(p)
        torch.testing.assert_close(q.act(obs64, True)[0], a)
    h = copy.deepcopy(p).to(torch.bfloat16)  # statistics stay float64 and exact
    assert h.obs_rms.mean.dtype == torch.float64 and torch.equal(h.obs_rms.var, p.obs_rms.var)
    assert h.actor_head.weight.dtype == torch.bfloat16
    assert h.act(obs64)[0].dtype == torch.bfloat16


def test_flat_parameters_train_exactly_like_separate_tensors():
    """Adam + gradient clipping over one flat buffer give the same weights as over the separate
    parameters; the module's parameters stay views of the buffer through training, a state-dict
    load and a move."""
    from rlweave.models.flat import FlatParameters

    def build():
        torch.manual_seed(0)
        return MLPPolicy(5, gym.spaces.Box(-1, 1, (2,)), hidden=(16, 16))

    ref, pol = build(), build()
    flat = FlatParameters(pol.parameters())
    assert flat.flat.numel() == sum(p.numel() for p in ref.parameters())
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2, eps=1e-5)
    opt = torch.optim.Adam([flat.flat], lr=1e-2, eps=1e-5)
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        obs, act = torch.randn(32, 5, generator=g), torch.randn(32, 1, 2, generator=g)
        for model, step in ((ref, None), (pol, flat)):
            lp, _, v = model.evaluate(obs, act)
            loss = -lp.mean() + (v - 1).square().mean()
            if step is None:
                ref_opt.zero_grad(set_to_none=True)
                loss.backward()
                norm_ref = torch.nn.utils.clip_grad_norm_(list(ref.parameters()), 0.1)
                ref_opt.step()
            else:
                flat.zero_grad()
                loss.backward()
                norm = flat.clip_grad_norm_(0.1)
                opt.step()
        assert norm_ref > 0.1  # the clip really acted
        torch.testing.assert_close(norm, norm_ref)
    for (name, a), b in zip(ref.named_parameters(), pol.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)
        assert b.untyped_storage().data_ptr() == flat.flat.untyped_storage().data_ptr()
    # loading a state dict writes through the views
    pol.load_state_dict(build().state_dict())
    fresh = torch.cat([p.detach().reshape(-1) for p in build().parameters()])
    torch.testing.assert_close(flat.flat.detach(), fresh)
    with pytest.raises(ValueError, match="one dtype and device"):
        FlatParameters([torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))])
