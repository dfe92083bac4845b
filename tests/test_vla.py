"""Vision-language-action policies (rlweave.models.vla): the three heads behind the policy contract,
save/load, LoRA, instruction caching and the registry's space check. Tiny sizes, 32x32 images."""
from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")
gym = pytest.importorskip("gymnasium")

from rlweave.models import build_policy  # noqa: E402
from rlweave.models.vla import FALLBACK_CORPUS, VLAPolicy, build_tokenizer, load_vla, save_vla  # noqa: E402

HEADS = ("discrete", "chunk", "flow")
INSTRUCTIONS = ["open the drawer", "push the red button", "pick up the block and place it in the bin"]
TINY = dict(vision_hidden=32, vision_layers=1, vision_heads=2, vision_intermediate=64, lm_hidden=64, lm_layers=2,
            lm_heads=4, lm_kv_heads=2, lm_intermediate=128, expert_hidden=32, expert_layers=1, expert_heads=2,
            flow_steps=4, max_positions=256)
B, S, A, H = 3, 32, 4, 2


def encode(text: str) -> np.ndarray:
    out = np.zeros(64, np.uint8)
    raw = text.encode()
    out[: len(raw)] = np.frombuffer(raw, np.uint8)
    return out


def obs_space(size: int = S, state: int = 5) -> "gym.spaces.Dict":
    return gym.spaces.Dict({
        "image": gym.spaces.Box(0, 255, (size, size, 3), np.uint8),
        "state": gym.spaces.Box(-np.inf, np.inf, (state,), np.float32),
        "instruction": gym.spaces.Box(0, 255, (64,), np.uint8),
        "privileged": gym.spaces.Box(-np.inf, np.inf, (7,), np.float32),
    })


ACT_SPACE = gym.spaces.Box(-1.0, 1.0, (A,), np.float32)


def make_obs(seed: int = 0, size: int = S, rows: int = B) -> dict:
    rng = np.random.default_rng(seed)
    return {"image": rng.integers(0, 256, (rows, size, size, 3), dtype=np.uint8),
            "state": rng.standard_normal((rows, 5)).astype(np.float32),
            "instruction": np.stack([encode(INSTRUCTIONS[i % len(INSTRUCTIONS)]) for i in range(rows)]),
            "privileged": np.zeros((rows, 7), np.float32)}


def make_policy(head: str, **kw) -> VLAPolicy:
    settings = {**TINY, **kw}
    return build_policy("vla", obs_space(), ACT_SPACE, chunk=H, head=head, instructions=INSTRUCTIONS, **settings)


@pytest.fixture(scope="module")
def policies() -> dict[str, VLAPolicy]:
    return {h: make_policy(h).eval() for h in HEADS}


@pytest.mark.parametrize("head", HEADS)
def test_act_shapes_and_evaluate_reproduces_log_prob(policies, head):
    policy, obs = policies[head], make_obs()
    noise = policy.sample_noise(B, torch.Generator().manual_seed(1))
    action, log_prob, value = policy.act(obs, noise=noise)
    assert policy.env_action(action).shape == (B, H, A)
    assert log_prob.shape == value.shape == (B,)
    again, _, _ = policy.act(obs, noise=noise)
    assert torch.equal(action, again)  # the noise alone decides the sample
    new_lp, entropy, new_value = policy.evaluate(obs, action)
    torch.testing.assert_close(new_lp, log_prob, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(new_value, value, atol=1e-5, rtol=1e-5)
    assert entropy.shape == (B,) and torch.isfinite(entropy).all()
    torch.testing.assert_close(policy.value(obs), value, atol=1e-5, rtol=1e-5)
    if head == "discrete":  # stored actions are bin centres
        width = 2.0 / policy.cfg.bins
        frac = (action + 1.0) / width - 0.5
        torch.testing.assert_close(frac, frac.round(), atol=1e-4, rtol=0)


@pytest.mark.parametrize("head", HEADS)
def test_save_load_round_trip(policies, head, tmp_path):
    policy, obs = policies[head], make_obs(1)
    folder = save_vla(policy, tmp_path / head)
    assert {p.name for p in folder.iterdir()} == {"config.json", "model.safetensors", "tokenizer"}
    loaded = load_vla(folder).eval()
    a0, lp0, v0 = policy.act(obs, deterministic=True)
    a1, lp1, v1 = loaded.act(obs, deterministic=True)
    assert torch.equal(a0, a1) and torch.equal(lp0, lp1) and torch.equal(v0, v1)
    noise = policy.sample_noise(B, torch.Generator().manual_seed(2))
    action, _, _ = policy.act(obs, noise=noise)
    for x, y in zip(policy.evaluate(obs, action), loaded.evaluate(obs, action)):
        assert torch.equal(x, y)


@pytest.mark.parametrize("head", HEADS)
def test_bc_loss_overfits_a_fixed_batch(head):
    torch.manual_seed(0)
    policy = make_policy(head, value_head=False)
    obs = make_obs(2)
    target = torch.rand(B, H, A, generator=torch.Generator().manual_seed(3)) * 1.6 - 0.8
    opt = torch.optim.Adam(policy.parameters(), lr=3e-3)

    def loss(gen_seed: int | None = None) -> dict:
        gen = torch.Generator().manual_seed(gen_seed) if gen_seed is not None else None
        return policy.bc_loss(obs, target, generator=gen)

    with torch.no_grad():
        before = float(loss(7)["loss"])
    for _ in range(40):
        out = loss()
        assert any(k.startswith("loss_") for k in out)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
    with torch.no_grad():
        after = float(loss(7)["loss"])
    assert after < 0.65 * before, (before, after)  # flow matching's loss has a floor of noise: not 0


def test_lora_freezes_base_weights_and_merges(tmp_path):
    policy = make_policy("chunk", lora_rank=4, lora_vision=False)
    lm = policy.backbone.causal_lm()
    base = {n: p for n, p in lm.named_parameters() if "lora_" not in n}
    assert base and not any(p.requires_grad for p in base.values())
    assert not any(p.requires_grad for p in policy.backbone.vision.parameters())
    assert policy.backbone.projector[0].weight.requires_grad and policy.head.queries.requires_grad
    trainable, total = policy.num_parameters(trainable=True), policy.num_parameters()
    assert 0 < trainable < 0.35 * total
    frozen = {n: p.detach().clone() for n, p in base.items()}
    obs, target = make_obs(3), torch.zeros(B, H, A)
    opt = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(2):
        opt.zero_grad()
        policy.bc_loss(obs, target)["loss"].backward()
        opt.step()
    assert all(torch.equal(frozen[n], p) for n, p in base.items())
    policy.eval()
    before = policy.act(obs, deterministic=True)[0]
    assert torch.equal(load_vla(save_vla(policy, tmp_path / "lora")).eval().act(obs, deterministic=True)[0], before)
    policy.merge_lora()
    assert policy.cfg.lora_rank == 0 and not any("lora_" in n for n, _ in policy.named_parameters())
    torch.testing.assert_close(policy.act(obs, deterministic=True)[0], before, atol=1e-4, rtol=1e-4)


def test_instruction_cache_tokenizer_and_inputs(policies):
    policy = policies["chunk"]
    cache = policy.backbone.instructions
    obs = make_obs(4, rows=6)
    policy.act(obs, deterministic=True)
    misses = cache.misses
    as_tensors = {k: torch.from_numpy(v) for k, v in make_obs(4, rows=6).items()}
    torch.testing.assert_close(policy.act(as_tensors, deterministic=True)[0], policy.act(obs, deterministic=True)[0])
    assert cache.misses == misses and len(cache.ids) >= len(INSTRUCTIONS)
    # the same instruction list (any order, repeats) trains the same tokenizer in every process
    again = build_tokenizer(list(reversed(INSTRUCTIONS)) * 2)
    assert again.get_vocab() == policy.tokenizer.get_vocab()
    assert len(build_tokenizer(None)) > 3 and FALLBACK_CORPUS
    # images of another size are resized inside the model; a second camera adds its own tokens
    space = obs_space(size=24)
    space.spaces["image_wrist"] = gym.spaces.Box(0, 255, (S, S, 3), np.uint8)
    two = build_policy("vla", space, ACT_SPACE, chunk=H, head="chunk", image_size=32, **TINY)
    assert two.cfg.cameras == ["image", "image_wrist"]
    obs = {**make_obs(5, size=24), "image_wrist": make_obs(6)["image"]}
    assert two.backbone.images(obs).shape == (B, 2 * two.cfg.image_tokens, TINY["lm_hidden"])
    assert two.act(obs, deterministic=True)[0].shape == (B, H, A)


def test_wrong_observation_space_is_one_line():
    with pytest.raises(ValueError) as err:
        build_policy("vla", gym.spaces.Box(-1, 1, (8,), np.float32), ACT_SPACE)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("policy 'vla' needs a Dict observation space")
    no_text = gym.spaces.Dict({"image": gym.spaces.Box(0, 255, (S, S, 3), np.uint8)})
    with pytest.raises(ValueError, match="'instruction'"):
        build_policy("vla", no_text, ACT_SPACE)


def test_paligemma_folder_loads_its_vision_projector_and_lm(tmp_path):
    """A PaliGemma-layout folder (built here from a config: nothing can be downloaded) loads into a
    VLA whose image tokens and LM weights are PaliGemma's; the action head is new."""
    transformers = pytest.importorskip("transformers")
    tok = build_tokenizer(INSTRUCTIONS, vocab_size=280)
    cfg = transformers.PaliGemmaConfig(
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=S, patch_size=8),
        text_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=1, head_dim=16, vocab_size=300),
        projection_dim=64)
    torch.manual_seed(0)
    pg = transformers.PaliGemmaForConditionalGeneration(cfg).eval()
    pg.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    policy = load_vla(tmp_path, head="chunk", chunk=H, action_dim=A, state_dim=5).eval()
    assert policy.cfg.lm_arch == "gemma" and policy.backbone.text_vocab == 300
    obs = make_obs(6)
    pixels = torch.from_numpy(obs["image"]).permute(0, 3, 1, 2).float() / 127.5 - 1.0
    with torch.no_grad():
        expected = pg.model.get_image_features(pixel_values=pixels).pooler_output
        got = policy.backbone.images(obs)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    emb = policy.backbone.causal_lm().get_input_embeddings().weight
    torch.testing.assert_close(emb[:300], pg.get_input_embeddings().weight)
    action = policy.act(obs, deterministic=True)[0]
    assert action.shape == (B, H, A)
    assert torch.equal(load_vla(save_vla(policy, tmp_path / "saved")).eval().act(obs, deterministic=True)[0], action)
