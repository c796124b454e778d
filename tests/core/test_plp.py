"""PLP, progressively layer-peeled training (calib/training/plp.py), against the official code (dengbaowang/PLP).

What is checked against what: the official ``train.py`` schedule (``epoch_froze`` = ⌊linspace(0, 1, S+1)^γ·E⌋
reversed, one ``layer_idx.pop()`` on each epoch equal to the next start) and its ResNet-50 ``layer_idx``,
reconstructed below as the loop it is; and the official ``my_sgd.SGD.step(idx)`` (SGD with momentum and weight
decay applied to ``params[:idx]`` only), reconstructed as a per-tensor update, against calib's frozen-by-
``requires_grad`` training with torch's SGD, over several steps across a stage change, to 1e-6.
"""

import numpy as np
import pytest
import torch
from torch import nn

from calib._config import ConfigError
from calib.config import parse_trial_config
from calib.models import create_model
from calib.training.plp import OFFICIAL_CUTS, PLPSchedule, cut_points, peel_order, stage_of, stage_starts


def official_schedule(epochs, gamma, layer_idx):
    """idx per epoch, as dengbaowang/PLP train.py's loop computes it (with --PLP)."""
    layer_idx = list(layer_idx)
    epoch_froze = (np.linspace(0, 1, len(layer_idx) + 1) ** gamma * epochs).astype(int).tolist()[::-1]
    out = []
    for epoch in range(epochs):
        if epoch == epoch_froze[-1]:
            idx = layer_idx.pop()
            epoch_froze.pop()
        out.append(idx)
    return out


@pytest.mark.parametrize("gamma", [1.0, 0.5, 2.0])
def test_schedule_matches_official_resnet50(gamma):
    model = create_model("resnet50", num_classes=10)
    schedule = PLPSchedule("resnet50", model, epochs=350, gamma=gamma)
    assert schedule.cuts == OFFICIAL_CUTS["resnet50"]
    assert [schedule.trained(e) for e in range(350)] == official_schedule(350, gamma, OFFICIAL_CUTS["resnet50"])


def test_resnet50_cuts_fall_on_the_official_modules():
    """calib's ResNet-50 parameter list in forward order is the official one: 161 tensors, head last, and the
    official cut points end stage 1 (33), stage 3's first block (84) and stage 4 (159 + head = 161)."""
    names = [name for name, _ in peel_order(create_model("resnet50", num_classes=10))]
    assert len(names) == 161 and names[-2:] == ["head.weight", "head.bias"]
    assert names[32] == "stages.0.2.bn3.bias" and names[33] == "stages.1.0.conv1.weight"
    assert names[83] == "stages.2.0.shortcut.1.bias" and names[84] == "stages.2.1.conv1.weight"


def test_generic_cuts_keep_modules_whole():
    model = create_model("small_cnn", num_classes=10, in_channels=1)
    names = [name for name, _ in peel_order(model)]
    cuts = cut_points("small_cnn", model)
    assert len(cuts) == 11 and cuts[-1] == len(names) and list(cuts) == sorted(cuts) and cuts[0] >= 1
    for cut in set(cuts) - {len(names)}:  # never between a module's weight and its bias
        assert names[cut - 1].rsplit(".", 1)[0] != names[cut].rsplit(".", 1)[0]


def test_coinciding_starts_still_peel():
    # 2 epochs, 11 stages: the starts are 0 (k <= 5) and 1 (k >= 6): stages 0-4 and 6-9 last no epoch, so epoch 0
    # is stage 5 and epoch 1 stage 10, where the official loop would stay at stage 0 (docs/methods.md §4.10).
    starts = stage_starts(2, 1.0)
    assert starts == (0,) * 6 + (1,) * 5
    assert stage_of(0, starts) == 5 and stage_of(1, starts) == 10


def test_stage_starts_are_the_official_codes_floating_point():
    """The official ``epoch_froze = np.linspace(0, 1, 12) ** gamma * epochs`` (then int), written out here: at γ = 2
    and E = 121 (and its multiples) the exact ⌊(k/11)² · E⌋ would start stages 3 and 6 at 9 and 36, the official float
    arithmetic at 8 and 35; ``int((k / 11) ** 2 * 121)`` would give 24 and 99 for stages 5 and 10, not 25 and 100."""
    assert stage_starts(121, 2.0) == (0, 1, 4, 8, 16, 25, 35, 49, 64, 81, 100)
    for epochs in (242, 363, 350):
        grid = [k * (1 / 11) if k < 11 else 1.0 for k in range(12)]  # numpy.linspace: start + k · step, the end exact
        assert stage_starts(epochs, 2.0) == tuple(int(g ** 2.0 * epochs) for g in grid[:11])


def official_sgd_step(params, grads, buffers, idx, lr, momentum, weight_decay):
    """my_sgd.SGD.step(idx): only params[:idx] move (and keep momentum)."""
    for i, (param, grad) in enumerate(zip(params, grads, strict=True)):
        if i >= idx:
            continue
        d_p = grad + weight_decay * param
        buffers[i] = d_p.clone() if buffers[i] is None else momentum * buffers[i] + d_p
        param -= lr * buffers[i]


def test_frozen_training_matches_official_sgd_over_steps():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3)).double()
    reference = [p.detach().clone() for p in model.parameters()]
    buffers = [None] * len(reference)
    schedule = PLPSchedule("mlp", model, epochs=4, gamma=1.0, stages=3)  # starts 0, 1, 2; cuts 2, 4, 6 tensors
    assert schedule.cuts == (2, 4, 6)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    gen = torch.Generator().manual_seed(1)
    for epoch in range(4):
        idx = schedule.apply(epoch)
        for _ in range(2):
            x, y = torch.randn(6, 5, generator=gen, dtype=torch.float64), torch.randint(0, 3, (6,), generator=gen)
            # the reference gradient: every tensor's, on the reference weights
            ref_params = [p.clone().requires_grad_() for p in reference]
            h = torch.relu(x @ ref_params[0].T + ref_params[1])
            h = torch.relu(h @ ref_params[2].T + ref_params[3])
            ref_loss = nn.functional.cross_entropy(h @ ref_params[4].T + ref_params[5], y)
            grads = torch.autograd.grad(ref_loss, ref_params)
            official_sgd_step(reference, [g.detach() for g in grads], buffers, idx, 0.1, 0.9, 5e-4)
            optimizer.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            for ours, theirs in zip(model.parameters(), reference, strict=True):
                torch.testing.assert_close(ours.detach(), theirs, atol=1e-6, rtol=0)
    schedule.release()
    assert all(p.requires_grad for p in model.parameters())


def test_bad_gamma_names_the_key(make_config):
    with pytest.raises(ConfigError, match=r"`stage1.plp_gamma` must be > 0, or null"):
        parse_trial_config(make_config(method={"name": "vanilla"}, plp_gamma=0.0))
