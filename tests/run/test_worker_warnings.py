"""Warnings raised inside a trial on a worker: artifact news becomes a note for the driver, any other warning is
shown once after the trial (calib.run.execution._artifact_notes). Showing it while the warnings were still being
recorded appended it to the list being read, without end: a trial whose post-hoc fit warned never finished and
grew by ~100 MB a second until Ray killed it."""

import warnings

import pytest

from calib.artifacts import ArtifactWarning
from calib.posthoc import DegenerateFitWarning
from calib.run.execution import _artifact_notes


def test_artifact_warnings_become_notes_and_others_are_shown_once_after():
    notes: list[str] = []
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        with _artifact_notes(notes):
            warnings.warn("healed artifact moved aside", ArtifactWarning, stacklevel=1)
            warnings.warn("TS: degenerate fit: why", DegenerateFitWarning, stacklevel=1)
            warnings.warn("something else", UserWarning, stacklevel=1)
    assert notes == ["healed artifact moved aside"]
    assert [(w.category, str(w.message)) for w in shown] == [(DegenerateFitWarning, "TS: degenerate fit: why"),
                                                             (UserWarning, "something else")]


def test_a_failing_trial_still_shows_its_warnings_and_raises():
    notes: list[str] = []
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match="boom"), _artifact_notes(notes):
            warnings.warn("before the failure", RuntimeWarning, stacklevel=1)
            raise ValueError("boom")
    assert [str(w.message) for w in shown] == ["before the failure"] and notes == []
