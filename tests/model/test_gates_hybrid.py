"""Gates on the blocks of hybrid stacks follow the one convention (``a_i`` scales the branch's output on the
residual): for every kind (a Mamba-style mixer, attention beside it, an MLP, a mixture of experts with its router,
Falcon-H1's parallel Mamba and attention, combined layer kinds) the gate at 0 gives the model with that block
removed and at 1 the original; the gate gradient of a Mamba block equals finite differences."""

from __future__ import annotations

import pytest
import torch
from tiny_models import HYBRID_ARCHS, build_tiny_hybrid, random_token_windows

from cbo.model.blocks import find_blocks
from cbo.model.gates import Gates, gate_blocks, set_gates
from cbo.pipeline.depth import prune_blocks

TOL = 1e-5


pytestmark = pytest.mark.usefixtures("quiet_kernel_fallbacks")  # see tests/conftest.py


def logits(model, windows):
    return model(input_ids=windows, use_cache=False).logits


@pytest.mark.parametrize("granularity", [pytest.param("layer", marks=pytest.mark.slow), "sublayer"])
@pytest.mark.parametrize("arch", HYBRID_ARCHS)
def test_gate_at_zero_removes_the_block_and_at_one_is_the_original(arch, granularity):
    model = build_tiny_hybrid(arch, n_layers=3)
    windows = random_token_windows(model, n=2, seq_len=8)
    blocks = find_blocks(model, granularity)
    with torch.no_grad():
        original = logits(model, windows)
        kinds_seen = set()
        for i, block in enumerate(blocks):
            if block.kind in kinds_seen:  # one block of each kind
                continue
            kinds_seen.add(block.kind)
            want = logits(prune_blocks(model, blocks, [i]), windows)
            with torch.enable_grad(), gate_blocks(model, blocks) as a:  # the differentiable path, no shortcut
                set_gates(a, removed=[i])
                gated = logits(model, windows).detach()
                set_gates(a)
                identity = logits(model, windows).detach()
            assert float((gated - want).abs().max()) <= TOL, block.name
            assert float((identity - original).abs().max()) <= TOL, block.name
    expected = {"mamba", "attention"} if arch == "nemotron_h" or granularity == "sublayer" else set()
    assert expected <= kinds_seen or arch == "falcon_h1"


def test_gate_gradient_of_a_mamba_block_equals_finite_differences():
    model = build_tiny_hybrid("bamba", n_layers=3).double()
    windows = random_token_windows(model, n=2, seq_len=8)
    blocks = find_blocks(model, "sublayer")
    i = next(k for k, b in enumerate(blocks) if b.kind == "mamba")
    a0 = torch.linspace(0.7, 1.1, len(blocks))

    def loss() -> torch.Tensor:  # float64 throughout (transformers' own loss casts the logits to float32)
        logp = torch.log_softmax(logits(model, windows)[:, :-1], dim=-1)
        return -logp.gather(-1, windows[:, 1:, None]).mean()

    with Gates(model, blocks) as gates:
        gates.set(a0)
        (grad,) = torch.autograd.grad(loss(), gates.a)
        h = 2.0**-10  # exact in float32 (the gate tensor's type), so a ± h is what the gates hold
        values = []
        for sign in (1, -1):
            shifted = a0.clone()
            shifted[i] += sign * h
            gates.set(shifted)
            with torch.no_grad():
                values.append(float(loss()))
    fd = (values[0] - values[1]) / (2 * h)
    assert abs(float(grad[i]) - fd) <= 1e-5 * max(1.0, abs(fd)), (float(grad[i]), fd)
    assert abs(fd) > 1e-3  # the block matters: the check can fail
