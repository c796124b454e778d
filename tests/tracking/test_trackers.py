"""--log-to: each tracker's runs, read back offline with the tracker's own reader."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest
from trial_fixtures import tiny_config

from calib._config import ConfigError
from calib.tracking import TrackingWarning, check_trackers, log_trial, start_study
from calib.trial import run_trial

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """Every tracker offline under tmp_path: MLflow's file store, W&B offline mode, TensorBoard files."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("CALIB_TENSORBOARD_DIR", str(tmp_path / "tb"))
    return tmp_path


def event_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """The scalars of TensorBoard event files, read record by record (TFRecord framing, tensorboardX's proto)."""
    from tensorboardX.proto import event_pb2

    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset:offset + 8])
            event = event_pb2.Event.FromString(data[offset + 12:offset + 12 + length])
            offset += 12 + length + 4
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def test_each_tracker_gets_a_child_run_with_tags_history_metrics_and_the_diagram(offline, tmp_path):
    from mlflow import MlflowClient

    result = run_trial(tiny_config(tmp_path, method={"name": "mac_cal"}, epochs=2, stage2_epochs=3, study="tracked"))
    settings = start_study(["mlflow", "tensorboard", "wandb"], "tracked", str(tmp_path / "store"))
    ids = log_trial(settings, result)
    assert set(ids) == {"mlflow_run_id", "tensorboard_run", "wandb_run_id"}

    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("tracked")
    (parent,) = client.search_runs([experiment.experiment_id], filter_string="tags.`calib.parent` = 'tracked'")
    child = client.get_run(ids["mlflow_run_id"])
    assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert {k: child.data.tags[k] for k in ("study", "method", "loss", "dataset", "arch", "seed", "stage1_id")} == {
        "study": "tracked", "method": "mac_cal", "loss": "cross_entropy", "dataset": "digits-noisy",
        "arch": "small_cnn", "seed": "1", "stage1_id": result.stage1_id}
    assert child.data.metrics["test_ece"] == pytest.approx(result.metrics["test_ece"])
    assert child.data.params["method.accuracy_weight"] == str(result.config.method.params.accuracy_weight)
    stage1 = client.get_metric_history(child.info.run_id, "stage1/train_loss")
    stage2 = client.get_metric_history(child.info.run_id, "stage2/retention_prob")
    assert [m.step for m in stage1] == [0, 1] and [m.step for m in stage2] == [2, 3, 4]  # Stage II after Stage I
    assert [m.value for m in stage2] == pytest.approx([r["retention_prob"] for r in result.history
                                                       if r["stage"] == "stage2"])
    assert [a.path for a in client.list_artifacts(child.info.run_id)] == ["reliability.png"]
    assert child.info.status == "FINISHED"
    # a second trial of the study joins the same parent
    again = start_study(["mlflow"], "tracked", str(tmp_path / "store"))
    assert again.options["mlflow"]["parent_run_id"] == parent.info.run_id

    run = Path(ids["tensorboard_run"])
    assert run == tmp_path / "tb" / "tracked" / result.trial_id
    scalars = event_scalars(run)
    assert [step for step, _ in scalars["stage1/train_loss"]] == [0, 1]
    assert scalars["final/test_ece"][0][1] == pytest.approx(result.metrics["test_ece"], rel=1e-6)
    # the hyperparameters in a file of their own: add_hparams's second writer on the folder truncated the run's file
    assert scalars["hparam/test_ece"][0][1] == pytest.approx(result.metrics["test_ece"], rel=1e-6)
    assert len(list(run.glob("events.out.tfevents.*.hparams"))) == 1

    (wandb_run,) = (tmp_path / "wandb").glob(f"offline-run-*-{ids['wandb_run_id']}")
    assert (wandb_run / f"run-{ids['wandb_run_id']}.wandb").stat().st_size > 0


def test_a_tracker_that_fails_does_not_lose_the_trial(offline, tmp_path, monkeypatch):
    result = run_trial(tiny_config(tmp_path, method={"name": "vanilla"}, epochs=1))
    settings = start_study(["tensorboard"], "tracked", str(tmp_path / "store"))
    (tmp_path / "tb").rmdir() if (tmp_path / "tb").exists() else None
    (tmp_path / "tb").write_text("a file where the event folder should go")
    with pytest.warns(TrackingWarning, match=rf"tensorboard: trial {result.trial_id} was not logged"):
        assert log_trial(settings, result) == {}
    assert log_trial(None, result) == {}


def test_a_missing_tracker_package_names_its_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match=r"`--log-to wandb` needs the package wandb, which is not installed: "
                                          r"pip install -e \"\.\[wandb\]\""):
        check_trackers(["mlflow", "wandb"])
    check_trackers(["mlflow", "tensorboard"])


def test_a_trial_stored_without_log_to_imports_no_tracker(tmp_path):
    """(The study through Ray with --log-to: tests/studies/test_calibrate.py.)"""
    quiet = subprocess.run([sys.executable, "-c", (
        "import sys; from calib.run.execution import ExecutionOptions, _store\n"
        "from calib.trial import run_trial\n"
        f"sys.path.insert(0, {str(ROOT / 'tests')!r}); from trial_fixtures import tiny_config\n"
        "from pathlib import Path\n"
        f"r = run_trial(tiny_config(Path({str(tmp_path / 'quiet')!r}), method={{'name': 'vanilla'}}, epochs=1))\n"
        f"_store({str(tmp_path / 'quiet' / 'store')!r}, r, ExecutionOptions(), None)\n"
        "print(sorted(m for m in ('mlflow', 'wandb', 'tensorboardX', 'calib.tracking') if m in sys.modules))")],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert quiet.stdout.strip().splitlines()[-1] == "[]"  # a trial stored without --log-to imports no tracker


def test_a_tracker_that_cannot_be_opened_is_one_error_before_any_trial(tmp_path, monkeypatch, capsys):
    """MLflow 3 refuses a ./mlruns folder unless MLFLOW_ALLOW_FILE_STORE=true: exit 2, one line that says so."""
    import importlib.util as util

    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    with pytest.raises(ConfigError, match=r"`--log-to mlflow`: mlflow could not be opened: .*MLFLOW_ALLOW_FILE_STORE"
                                          r".* Check MLFLOW_TRACKING_URI: a tracking server, or sqlite:///mlflow.db"):
        start_study(["mlflow"], "sensitivity_gamma", str(tmp_path / "results"))
    spec = util.spec_from_file_location("_tracker_study", ROOT / "studies" / "sensitivity_gamma.py")
    study = util.module_from_spec(spec)
    spec.loader.exec_module(study)
    store = tmp_path / "results"
    code = study.main(["--store", str(store), "--log-to", "mlflow", "--epochs", "1", "--seeds", "1"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: `--log-to mlflow`: mlflow could not be opened") and err.count(
        "\n") == 1, err
    assert not (store / "trials").exists()
