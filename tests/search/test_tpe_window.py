"""TPE conditioned on at most a window of finished trials: Optuna's TPE below it, the best and latest above."""

from __future__ import annotations

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from calib.search.tpe import WindowedTPESampler, _WindowedStudy


def windowed(study: optuna.Study, window: int) -> _WindowedStudy:
    return _WindowedStudy(study, WindowedTPESampler(window=window))

SPACE = {"x": FloatDistribution(0.0, 1.0), "y": FloatDistribution(0.0, 1.0)}


def study_with(values: list[float], direction: str = "minimize", running: int = 0) -> optuna.Study:
    study = optuna.create_study(direction=direction)
    study.add_trials([create_trial(params={"x": (v * 0.37) % 1, "y": (v * 0.61) % 1}, distributions=SPACE, value=v)
                      for v in values])
    for _ in range(running):
        study.ask(fixed_distributions=SPACE)
    return study


@pytest.fixture(autouse=True)
def quiet():
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_the_window_keeps_the_best_and_the_latest_trials():
    values = [5, 3, 9, 1, 7, 2, 8, 4, 6, 0]  # trial numbers 0..9
    low = study_with(values, running=1)
    seen = windowed(low, 4)._get_trials(deepcopy=False)
    # best 2 by value: numbers 9 (0) and 3 (1); the latest 2 finished: 8, 9; the running trial 10 stays
    assert [t.number for t in seen] == [3, 8, 9, 10] and seen[-1].state == TrialState.RUNNING
    high = study_with(values, direction="maximize")
    assert [t.number for t in windowed(high, 4).get_trials(deepcopy=False)] == [2, 6, 8, 9]  # 9 and 8; latest
    assert len(windowed(high, 10).get_trials()) == 10  # at the window: every trial
    view = windowed(low, 4)
    assert [t.number for t in view.get_trials()] == [3, 8, 9, 10]
    low.tell(10, -1.0)  # the running trial finishes best: the remembered choice is made again
    assert [t.number for t in view.get_trials()] == [9, 10]  # best 2: 10 (-1) and 9 (0); latest 2: 9, 10


def test_two_objectives_keep_the_first_fronts():
    study = optuna.create_study(directions=["minimize", "minimize"])
    points = [(0, 5), (5, 0), (3, 3), (4, 4), (6, 6), (1, 6), (7, 7), (8, 8)]
    study.add_trials([create_trial(params={"x": 0.5, "y": 0.5}, distributions=SPACE, values=list(p)) for p in points])
    kept = [t.number for t in windowed(study, 4).get_trials()]
    # front 0: (0,5), (5,0), (3,3), (1,6); its two smallest sums: trials 0 and 1 (5 each); then the latest 6, 7
    assert kept == [0, 1, 6, 7]


def test_below_the_window_the_proposals_are_optunas_tpe():
    values = [(i * 7919) % 101 / 11 for i in range(40)]
    for window in (0, 40, 1000):
        asked = []
        for sampler in (optuna.samplers.TPESampler(seed=3, constant_liar=True),
                        WindowedTPESampler(window=window, seed=3, constant_liar=True)):
            study = study_with(values)
            study.sampler = sampler
            asked.append([study.ask(fixed_distributions=SPACE).params for _ in range(4)])
        assert asked[0] == asked[1]


def test_above_the_window_tpe_sees_the_window_only(monkeypatch: pytest.MonkeyPatch):
    from optuna.samplers._tpe import sampler as tpe_module

    seen = []
    split = tpe_module._split_trials
    monkeypatch.setattr(tpe_module, "_split_trials", lambda study, trials, *a, **k: (
        seen.append(len(trials)), split(study, trials, *a, **k))[1])
    study = study_with([float(i % 17) for i in range(60)])
    study.sampler = WindowedTPESampler(window=20, seed=0, constant_liar=True)
    proposals = [study.ask(fixed_distributions=SPACE).params for _ in range(3)]
    assert seen and max(seen) <= 20 + 2  # the window, and the asked trials still running (the constant liar)
    assert all(0 <= p["x"] <= 1 for p in proposals)
    with pytest.raises(ValueError, match="window must be >= 0"):
        WindowedTPESampler(window=-1)
