"""A study's manifest: shared settings and per-row settings are checked; new rows, seeds and setups extend it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from trial_fixtures import tiny_config

from calib.config import parse_trial_config
from calib.store.manifest import StudyChangedError, check_manifest, manifest_of, record_manifest

ROOT = Path(__file__).resolve().parents[2]
# A fixed table of rows, as compare_methods.py has: (label, method section).
TABLE = {"Vanilla": {"name": "vanilla"}, "TST": {"name": "tst", "epochs": 40}, "MaC-Cal": {"name": "mac_cal"}}


def configs(tmp_path, labels, *, seeds=(1,), epochs=2, tst_epochs=40):
    out = []
    for rank, label in enumerate(labels):
        method = dict(TABLE[label])
        if label == "TST":
            method["epochs"] = tst_epochs
        for seed in seeds:
            raw = tiny_config(tmp_path, method=method, seed=seed, epochs=epochs)
            out.append(parse_trial_config({**raw, "label": label, "label_rank": rank}))
    return out


def record(tmp_path, labels, **kwargs):
    store = tmp_path / "results"
    record_manifest(store, "study", manifest_of(configs(tmp_path, labels, **kwargs)))
    return store


def test_the_manifest_holds_shared_keys_and_each_rows_keys(tmp_path):
    manifest = manifest_of(configs(tmp_path, ["Vanilla", "TST"], seeds=(1, 2)))
    assert manifest["constant"]["stage1.epochs"] == 2
    assert "method.name" not in manifest["constant"] and "seed" not in manifest["constant"]
    assert manifest["rows"]["TST"]["method.name"] == "tst" and manifest["rows"]["TST"]["method.epochs"] == 40
    assert manifest["rows"]["Vanilla"]["method.name"] == "vanilla"
    assert "seed" not in manifest["rows"]["TST"]


def test_more_seeds_and_rows_extend_the_study(tmp_path):
    store = record(tmp_path, ["Vanilla", "TST"])
    check_manifest(store, "study", manifest_of(configs(tmp_path, ["Vanilla", "TST", "MaC-Cal"], seeds=(1, 2, 3))))


class Captured(Exception):
    """Stops a study where it hands its trials to Ray Tune."""


def compare_methods_manifest(tmp_path, monkeypatch, *methods):
    """The manifest ``compare_methods.py --methods ...`` checks and records (nothing runs)."""
    import calib.study.rows

    def capture(configs, *, table=None, **kwargs):
        raise Captured(manifest_of([parse_trial_config(c) for c in (table or configs)]))

    monkeypatch.setattr(calib.study.rows, "run_grid", capture)
    spec = importlib.util.spec_from_file_location("compare_methods", ROOT / "studies" / "compare_methods.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(Captured) as caught:
        module.main(["--store", str(tmp_path / "results"), "--seeds", "1", "--methods", *methods])
    return caught.value.args[0]


def test_runs_of_two_selections_of_one_table_extend_the_study(tmp_path, monkeypatch):
    # compare_methods.py --methods "Vanilla (CE)", then --methods TST: both manifests come from the whole table.
    first = compare_methods_manifest(tmp_path, monkeypatch, "Vanilla (CE)")
    second = compare_methods_manifest(tmp_path, monkeypatch, "TST")
    assert first == second and "method.name" not in first["constant"]
    assert first["rows"]["TST"]["method.name"] == "tst" and first["constant"]["stage1.epochs"] == 60
    store = tmp_path / "results"
    record_manifest(store, "compare_methods", first)
    check_manifest(store, "compare_methods", second)


def test_a_selection_without_its_table_would_look_changed(tmp_path):
    # Why the table matters: from one row alone, the row's own keys look like shared settings.
    store = record(tmp_path, ["Vanilla"])
    with pytest.raises(StudyChangedError, match=r"method\.name: \"vanilla\" → \"tst\""):
        check_manifest(store, "study", manifest_of(configs(tmp_path, ["TST"])))


def test_a_changed_shared_setting_is_refused_once(tmp_path):
    store = record(tmp_path, ["Vanilla", "TST"])
    with pytest.raises(StudyChangedError) as caught:
        check_manifest(store, "study", manifest_of(configs(tmp_path, ["Vanilla", "TST"], epochs=3)))
    message = str(caught.value)
    assert "Changed: stage1.epochs: 2 → 3." in message and message.endswith("--study study--epochs-3")
    assert "[TST]" not in message and "[Vanilla]" not in message


def test_the_new_study_name_is_free_or_holds_the_same_config(tmp_path):
    # The name a refusal gives is one to use as it stands: never a stored study of another fixed config.
    store = record(tmp_path, ["Vanilla", "TST"])
    three = manifest_of(configs(tmp_path, ["Vanilla", "TST"], epochs=3))
    with pytest.raises(StudyChangedError, match=r"--study study--epochs-3$"):
        check_manifest(store, "study", three)
    record_manifest(store, "study--epochs-3", three)  # the user ran it: the same change still names it
    with pytest.raises(StudyChangedError, match=r"--study study--epochs-3$"):
        check_manifest(store, "study", three)
    four = manifest_of(configs(tmp_path, ["Vanilla", "TST"], epochs=4))
    other = manifest_of(configs(tmp_path, ["Vanilla", "TST"], epochs=4, tst_epochs=30))
    record_manifest(store, "study--epochs-4", other)
    with pytest.raises(StudyChangedError, match=r"--study study-2$"):  # taken by another config: numbered
        check_manifest(store, "study", four)
    with pytest.raises(StudyChangedError, match=r"\[TST\] method\.epochs: 40 → 2.*--study study--epochs-2$"):
        check_manifest(store, "study", manifest_of(configs(tmp_path, ["Vanilla", "TST"], tst_epochs=2)))


def test_a_changed_row_setting_is_refused_naming_the_row(tmp_path):
    # method.epochs exists in the TST row only, so only the per-row check can see it change.
    store = record(tmp_path, ["Vanilla", "TST"])
    with pytest.raises(StudyChangedError, match=r"Changed: \[TST\] method\.epochs: 40 → 2\."):
        check_manifest(store, "study", manifest_of(configs(tmp_path, ["Vanilla", "TST"], tst_epochs=2)))


def test_a_manifest_without_rows_still_checks_its_shared_keys(tmp_path):
    # Manifests written before rows were recorded hold only "constant".
    store = tmp_path / "results"
    old = manifest_of(configs(tmp_path, ["Vanilla", "TST"]))
    del old["rows"]
    record_manifest(store, "study", old)
    check_manifest(store, "study", manifest_of(configs(tmp_path, ["Vanilla", "TST"], tst_epochs=2)))
    with pytest.raises(StudyChangedError, match=r"stage1\.epochs: 2 → 3"):
        check_manifest(store, "study", manifest_of(configs(tmp_path, ["Vanilla", "TST"], epochs=3)))


def _with(configs_list, **stage1_and_mac_cal):
    """The configs with ``train_size`` in Stage I and the other keys in the MaC-Cal row's method."""
    train_size = stage1_and_mac_cal.pop("train_size", None)
    out = []
    for cfg in configs_list:
        raw = cfg.to_dict()
        if train_size is not None:
            raw["stage1"]["train_size"] = train_size
        if raw["method"]["name"] == "mac_cal":
            raw["method"].update(stage1_and_mac_cal)
        out.append(parse_trial_config(raw))
    return out


def test_fields_added_later_are_checked_at_their_default(tmp_path):
    # The identities leave out stage1.train_size and MaC-Cal's stats_source at their defaults (so old
    # trial ids stay valid); a run that sets them still changes the study.
    store = record(tmp_path, ["Vanilla", "MaC-Cal"])
    check_manifest(store, "study", manifest_of(configs(tmp_path, ["Vanilla", "MaC-Cal"])))
    with pytest.raises(StudyChangedError, match=r"stage1\.train_size: null → 300"):
        check_manifest(store, "study", manifest_of(_with(configs(tmp_path, ["Vanilla", "MaC-Cal"]), train_size=300)))
    with pytest.raises(StudyChangedError, match=r"\[MaC-Cal\] method\.stats_source: \"train\" → \"augmented\""):
        check_manifest(store, "study",
                       manifest_of(_with(configs(tmp_path, ["Vanilla", "MaC-Cal"]), stats_source="augmented")))
    changed = tmp_path / "changed"
    record_manifest(changed, "study", manifest_of(_with(configs(tmp_path, ["Vanilla", "MaC-Cal"]), train_size=300)))
    with pytest.raises(StudyChangedError, match=r"stage1\.train_size: 300 → null"):
        check_manifest(changed, "study", manifest_of(configs(tmp_path, ["Vanilla", "MaC-Cal"])))


def test_an_added_field_set_in_one_of_several_rows_of_one_method_is_a_change(tmp_path):
    # Every row is MaC-Cal, so method.name is shared; stats_source set in row B alone must still be seen.
    def rows(b_method):
        out = []
        for rank, (label, method) in enumerate([("A", {"name": "mac_cal"}), ("B", b_method)]):
            raw = tiny_config(tmp_path, method=method, seed=1, epochs=2)
            out.append(parse_trial_config({**raw, "label": label, "label_rank": rank}))
        return out

    store = tmp_path / "results"
    record_manifest(store, "study", manifest_of(rows({"name": "mac_cal"})))
    check_manifest(store, "study", manifest_of(rows({"name": "mac_cal", "stats_source": "train"})))
    augmented = manifest_of(rows({"name": "mac_cal", "stats_source": "augmented"}))
    assert "method.stats_source" not in augmented["constant"]
    assert augmented["rows"]["A"]["method.stats_source"] == "train"
    with pytest.raises(StudyChangedError, match=r"Changed: \[B\] method\.stats_source: \"train\" → \"augmented\"\."):
        check_manifest(store, "study", augmented)
