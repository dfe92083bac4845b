"""``adam_step``: the direct fused-Adam step over a flat buffer is ``optimizer.step()`` bit for bit,
and hands every case it does not cover back to ``optimizer.step()``."""

import torch

from rlweave.models.flat import FlatParameters, adam_step


def _setup(fused: bool = True, amsgrad: bool = False):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    flat = FlatParameters(net.parameters())
    opt = torch.optim.Adam([flat.flat], lr=1e-2, eps=1e-5, fused=fused, amsgrad=amsgrad)
    return net, flat, opt


def _train(step, **kw) -> tuple[torch.Tensor, dict]:
    net, flat, opt = _setup(**kw)
    g = torch.Generator().manual_seed(1)
    for i in range(12):
        if i == 6:
            opt.param_groups[0]["lr"] = 3e-3  # an annealed learning rate is read at every step
        flat.zero_grad()
        net(torch.randn(32, 5, generator=g)).square().mean().backward()
        flat.clip_grad_norm_(0.1)
        step(opt)
    return flat.flat.detach().clone(), opt.state_dict()


def test_adam_step_is_optimizer_step_bit_for_bit():
    ref_w, ref_s = _train(lambda o: o.step())
    w, s = _train(adam_step)
    assert torch.equal(w, ref_w)
    for key in ("step", "exp_avg", "exp_avg_sq"):
        assert torch.equal(s["state"][0][key], ref_s["state"][0][key]), key


def test_adam_step_falls_back_where_it_does_not_apply():
    # not fused, or amsgrad: optimizer.step() does the work, same result as calling it
    for kw in ({"fused": False}, {"amsgrad": True}):
        assert torch.equal(_train(adam_step, **kw)[0], _train(lambda o: o.step(), **kw)[0])
    # a step hook still runs
    net, flat, opt = _setup()
    calls = []
    opt.register_step_post_hook(lambda *a: calls.append(1))
    for _ in range(3):
        flat.zero_grad()
        net(torch.randn(4, 5)).sum().backward()
        adam_step(opt)
    assert len(calls) == 3
