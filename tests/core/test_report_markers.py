"""The report's significance outputs from a hand-built store: ▲ / ▼ where a row is clearly better / worse than the
control over seeds and nowhere else, the rank table and critical-difference diagrams of a study over setups,
and one line for each thing that cannot be tested (no control, one setup, a missing method)."""

import hashlib

import pandas as pd
import pytest
from in_process import run_report
from trial_fixtures import tiny_config

from calib.config import parse_trial_config
from calib.report.build import build_report
from calib.report.significance import rank_comparison
from calib.report.significance_tables import rank_markdown
from calib.store import write_result
from calib.trial import TrialResult

SETUPS = [("digits", "small_cnn"), ("digits", "resnet20"), ("digits-noisy", "small_cnn"), ("digits-noisy", "resnet20")]


def store_row(store, tmp, *, study: str, label: str, rank: int, setup: tuple[str, str], seed: int, ece: float) -> None:
    """One ok trial with test ECE ``ece`` (O-ECE and U-ECE half of it each, accuracy 0.9) and nothing trained."""
    config = parse_trial_config({**tiny_config(tmp, study=study, seed=seed, method={"name": "vanilla"}),
                                 "dataset": setup[0], "arch": setup[1], "label": label, "label_rank": rank})
    trial_id = hashlib.sha256(f"{study} {label} {setup} {seed}".encode()).hexdigest()[:16]
    metrics = {"test_ece": ece, "test_oece": ece / 2, "test_uece": ece / 2, "test_accuracy": 0.9,
               "test_aece": ece, "test_mce": 2 * ece}
    write_result(store, TrialResult(config=config, trial_id=trial_id, stage1_id="0" * 16, metrics=metrics))


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """decompose over 4 setups × 3 seeds: CE+TS's ECE 0.03 + 0.004·seed + 0.001·setup; MaC-Cal 0.01 lower on every
    seed (±0.0005), Vanilla 0.05 higher (±0.001; stored under its former label "Vanilla (CE)", shown as
    "Vanilla"), CE+HB +0.002, −0.002, +0.003 (no consistent difference).
    ablation: one setup, no TS row. combine: CE+TS only in the first of two setups, MIT only in the second."""
    tmp = tmp_path_factory.mktemp("markers")
    store = tmp / "results"
    offsets = {"Vanilla (CE)": [0.049, 0.050, 0.051], "CE+TS": [0.0, 0.0, 0.0], "CE+HB": [0.002, -0.002, 0.003],
               "MaC-Cal": [-0.0105, -0.010, -0.0095]}
    for i, setup in enumerate(SETUPS):
        for rank, (label, offset) in enumerate(offsets.items()):
            for seed in (1, 2, 3):
                store_row(store, tmp, study="decompose", label=label, rank=rank, setup=setup, seed=seed,
                          ece=0.03 + 0.004 * seed + 0.001 * i + offset[seed - 1])
    for rank, label in enumerate(["vanilla", "MaC-Cal γ=0.9"]):
        store_row(store, tmp, study="ablation", label=label, rank=rank, setup=SETUPS[0], seed=1, ece=0.05 - rank / 100)
    for setup, labels in ((SETUPS[0], ["CE+TS", "Mixup"]), (SETUPS[2], ["Mixup", "MIT"])):
        for rank, label in enumerate(labels):
            for seed in (1, 2):
                store_row(store, tmp, study="combine", label=label, rank=rank, setup=setup, seed=seed, ece=0.04)
    return store


def test_markers_rank_table_and_diagrams(store, tmp_path):
    lines: list[str] = []
    written = build_report(store, tmp_path / "report", log=lines.append)
    names = {p.name for p in written}
    # digits-noisy · resnet20 (setup 3), ECE − CE+TS per seed: MaC-Cal −0.0105, −0.010, −0.0095: t = −34.6, p =
    # 1 − 34.6/√(34.6² + 2) = 8.3e-4; Vanilla +0.049, +0.050, +0.051: t = 86.6, p = 1.3e-4; CE+HB +0.002, −0.002,
    # +0.003: t = 0.65, p = 0.58. Holm over 3: 3 · 1.3e-4 and 2 · 8.3e-4 < 0.05, 0.58 not
    table = (tmp_path / "report" / "tables" / "decompose_digits-noisy_resnet20.md").read_text().splitlines()
    assert table[2:] == [
        "| row | n | ECE | O-ECE | U-ECE | Acc |", "|---|---|---|---|---|---|",
        "| Vanilla | 3 | 9.10 ± 1.24 ▼ | 4.55 ± 0.62 ▼ | 4.55 ± 0.62 ▼ | **90.00 ± 0.00** |",
        "| CE+TS | 3 | 4.10 ± 0.99 | 2.05 ± 0.50 | 2.05 ± 0.50 | 90.00 ± 0.00 |",
        "| CE+HB | 3 | 4.20 ± 1.29 | 2.10 ± 0.65 | 2.10 ± 0.65 | 90.00 ± 0.00 |",
        "| MaC-Cal | 3 | **3.10 ± 1.12** ▲ | **1.55 ± 0.56** ▲ | **1.55 ± 0.56** ▲ | 90.00 ± 0.00 |",
        "",
        "▲ / ▼: significantly better / worse than CE+TS over the seeds of this setup (paired t-test on seed, Holm "
        "over the rows of each column, α = 0.05); n: seeds, each seed's trials averaged first.",
        "Equal to CE+TS on every seed (p = 1): every row (Acc)."]
    tex = (tmp_path / "report" / "tables" / "decompose_digits-noisy_resnet20.tex").read_text()
    assert r"MaC-Cal & 3 & \textbf{3.10 $\pm$ 1.12}$^{\blacktriangle}$ &" in tex
    assert r"\par\smallskip{\footnotesize $^{\blacktriangle}$ / $^{\blacktriangledown}$: significantly" in tex

    ranks = (tmp_path / "report" / "tables" / "decompose_ranks.md").read_text().splitlines()
    assert ranks[0] == ("decompose · average rank over 4 setups (digits · resnet20, digits · small_cnn, digits-noisy "
                        "· resnet20, digits-noisy · small_cnn) · test split · each setup ranks the means over seeds "
                        "· α = 0.05")
    # every setup ranks MaC-Cal < CE+TS < CE+HB < Vanilla: χ²_F = N(k − 1) = 12, p = e^{-6}·(1 + 6 + 18)... = 0.0074,
    # F_F infinite; CD = 2.569 · √(4·5/(6·4)) = 2.35; Holm against CE+TS: smallest p 0.0285 · 3 > 0.05, no marker
    assert ranks[2:12] == [
        "| row | ECE | O-ECE | U-ECE | Acc |", "|---|---|---|---|---|",
        "| Vanilla | 4.00 | 4.00 | 4.00 | **2.50** |", "| CE+TS | 2.00 | 2.00 | 2.00 | **2.50** |",
        "| CE+HB | 3.00 | 3.00 | 3.00 | **2.50** |", "| MaC-Cal | **1.00** | **1.00** | **1.00** | **2.50** |",
        "| setups N / methods k | 4 / 4 | 4 / 4 | 4 / 4 | 4 / 4 |",
        "| Friedman χ²_F (p) | 12.00 (0.007) | 12.00 (0.007) | 12.00 (0.007) | 0.00 (1.000) |",
        "| Iman–Davenport F_F (p) | ∞ (0) | ∞ (0) | ∞ (0) | 0.00 (1.000) |",
        "| Nemenyi CD | 2.35 | 2.35 | 2.35 | 2.35 |"]
    assert ranks[-1] == "Acc: every method has the same value in every setup: all ranks are 2.5, nothing to test."
    assert {"decompose_ranks.md", "decompose_ranks.tex", "decompose_test_ece_cd.png", "decompose_test_oece_cd.png",
            "decompose_test_uece_cd.png"} <= names and "decompose_test_accuracy_cd.png" not in names
    assert (tmp_path / "report" / "figures" / "decompose_test_ece_cd.png").read_bytes()[:4] == b"\x89PNG"
    assert "[decompose] ranks over 4 setups: decompose_ranks.md, critical-difference diagrams of ECE, O-ECE, " \
           "U-ECE" in lines

    # an ablation is compared against its first rung; with 1 seed and no kept predictions nothing can be tested
    ablation = (tmp_path / "report" / "tables" / "ablation_digits_small_cnn.md").read_text()
    assert ("No markers: Vanilla has 1 seed here (a paired test over seeds needs >= 3) and not every trial kept its "
            "test predictions (--keep-predictions) for the bootstrap over seeds and test samples.") in ablation
    assert "[ablation] no rank table: 1 setup (digits · small_cnn); average ranks and the Friedman test need >= 2 " \
           "setups (datasets × architectures), or a predictions file's >= 2 splits" in lines
    assert "▲" not in (tmp_path / "report" / "tables" / "ablation_digits_small_cnn.md").read_text()
    # the control missing from a setup, methods missing from some: named, no Friedman test for 1 method
    assert "combine · digits-noisy · small_cnn: no significance markers: the control CE+TS has no trial here" in lines
    combine = (tmp_path / "report" / "tables" / "combine_ranks.md").read_text().splitlines()
    assert ("Left out of the ranks (no value in every setup): CE+TS (none in digits-noisy · small_cnn); MIT (none in "
            "digits · small_cnn).") in combine
    assert "No Friedman test: 2 setups and 1 method ranked; it needs >= 2 setups and >= 3 methods." in combine
    combine_setup = (tmp_path / "report" / "tables" / "combine_digits_small_cnn.md").read_text()
    # 2 seeds and no kept predictions: no test under the policy (a t-test on 2 seeds has 1 degree of freedom)
    assert "No markers: CE+TS has 2 seeds here (a paired test over seeds needs >= 3)" in combine_setup
    assert not any(name.startswith("combine_") and name.endswith("_cd.png") for name in names)


def test_another_control_and_a_missing_one(store, tmp_path):
    report = run_report("--store", str(store), "--out", str(tmp_path / "vs_mac_cal"), "--control", "MaC-Cal")
    assert report.returncode == 0, report.stderr[-3000:]
    table = (tmp_path / "vs_mac_cal" / "tables" / "decompose_digits_small_cnn.md").read_text()
    # against MaC-Cal every other row is worse; CE+HB too (CE+HB − MaC-Cal = 0.0125, 0.008, 0.0125: p = 0.018)
    assert "| CE+TS | 3 | 3.80 ± 0.99 ▼ |" in table and "| CE+HB | 3 | 3.90 ± 1.29 ▼ |" in table
    assert "better / worse than MaC-Cal" in table
    assert "[combine] no significance markers: the control 'MaC-Cal' is not a row of this study (rows: CE+TS, " \
           "Mixup, MIT)" in report.stdout
    # no markers where the control is not a row, not even CE+TS's (the study's own default)
    combine = (tmp_path / "vs_mac_cal" / "tables" / "combine_digits_small_cnn.md").read_text()
    assert "▲" not in combine and "Equal to" not in combine
    bad = run_report("--store", str(store), "--alpha", "1.5")
    assert bad.returncode == 2
    assert bad.stderr.strip() == "error: `--alpha` must lie in (0, 1), got --alpha=1.5. e.g. --alpha 0.05"


def test_rank_table_marks_holm_against_the_control():
    """Demšar's example (Table 6 over 14 data sets, C4.5 the control): C4.5+m and C4.5+m+cf are better."""
    from test_report_significance import DEMSAR_AUC, DEMSAR_METHODS

    trials = pd.DataFrame([{"label": method, "dataset": f"set{i:02d}", "arch": "tree", "seed": 1,
                            "test_accuracy": value}
                           for i, row in enumerate(DEMSAR_AUC) for method, value in zip(DEMSAR_METHODS, row,
                                                                                         strict=True)])
    comparison = rank_comparison(trials, "test_accuracy", DEMSAR_METHODS, control="C4.5", alpha=0.05)
    text = rank_markdown("caption", {"test_accuracy": comparison}, {"test_accuracy": "AUC"}, DEMSAR_METHODS, 0.05)
    lines = text.splitlines()
    # the printed table: voting's tie shared (rank sums 44, 28, 41, 27)
    assert lines[4:8] == ["| C4.5 | 3.14 |", "| C4.5+m | 2.00 ▲ |", "| C4.5+cf | 2.93 |", "| C4.5+m+cf | **1.93** ▲ |"]
    assert lines[11] == "| Nemenyi CD | 1.25 |"
    assert ("▲ / ▼: average rank significantly better / worse than C4.5's (z from average ranks, Holm over the "
            "other methods, α = 0.05).") in lines


def test_a_study_printout_and_the_report_mark_the_same_cells(store, tmp_path, capsys):
    """One policy: the table a study prints (print_row_tables) and report.py's table of the same store carry the same
    markers and the same legend."""
    from calib.report.build import _labelled
    from calib.store import read_trials
    from calib.study.rows import print_row_tables

    metrics = {"test_ece": "ECE", "test_oece": "O-ECE", "test_uece": "U-ECE", "test_accuracy": "Acc"}
    trials = _labelled(read_trials(store, study="decompose"))
    setup = trials[(trials["dataset"] == "digits-noisy") & (trials["arch"] == "resnet20")]
    print_row_tables(setup.assign(row=setup["label"]), metrics, study="decompose", store=str(store))
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("| ", "▲", "Equal"))]
    build_report(store, tmp_path / "report", log=lambda line: None)
    report = (tmp_path / "report" / "tables" / "decompose_digits-noisy_resnet20.md").read_text().splitlines()

    def marks(lines: list[str]) -> dict[str, list[str]]:
        return {line.split(" | ")[0].strip("| "): [c[-1] for c in line.split(" | ")[2:] if c[-1] in "▲▼"]
                for line in lines if line.startswith("| ") and not line.startswith("| row")}

    assert marks(printed) == marks(report) == {"Vanilla": ["▼"] * 3, "CE+TS": [], "CE+HB": [], "MaC-Cal": ["▲"] * 3}
    assert [line for line in printed if not line.startswith("| ")] == [
        line for line in report if line.startswith(("▲", "Equal"))]


def test_a_search_study_is_one_row_per_config_with_its_replicates_as_seeds(tmp_path):
    """A search's replicates are one config: the report's rows are its Optuna trials (``<study> #<trial>``), each with
    n = its replicate seeds, never one row pooling every config of a method."""
    store = tmp_path / "results"
    for number in range(3):
        for seed in (1, 2):
            config = parse_trial_config({**tiny_config(tmp_path, study="search_x", seed=seed,
                                                       method={"name": "vanilla"}), "search_trial": number})
            write_result(store, TrialResult(config=config, trial_id=f"{number:08x}{seed:08x}", stage1_id="0" * 16,
                                            metrics={"test_ece": 0.01 * (number + seed), "test_accuracy": 0.9}))
    build_report(store, tmp_path / "report", log=lambda line: None)
    (table,) = (tmp_path / "report" / "tables").glob("search_x_*.md")
    body = [line for line in table.read_text().splitlines() if line.startswith("| search_x")]
    assert [line.split(" | ")[:2] for line in body] == [["| search_x #0", "2"], ["| search_x #1", "2"],
                                                       ["| search_x #2", "2"]]
    # #1: seeds 0.02 and 0.03: mean 2.50 %
    assert " 2.50 ± " in body[1]
