"""Paper tables from table specs (tables/*.yaml, ``studies/report.py --table``): every shipped spec on a small store
written row by row (the quick preset's one setup, 2-3 seeds), its CSV one line per cell with n = the seeds, the
Markdown against a hand-built table, spec errors as one line and exit 2 with nothing written, the LaTeX pure ASCII
and compiled by pdflatex."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import scipy.stats
from trial_fixtures import tiny_config

from calib.config import parse_trial_config
from calib.report.paper import CSV_COLUMNS, load_spec
from calib.report.tables import latex_escape
from calib.store import write_result
from calib.study.table_rows import row_catalogs
from calib.trial_result import TrialResult

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted((ROOT / "tables").glob("*.yaml"))
METRICS = ("test_accuracy", "test_ece", "test_aece", "test_mce", "test_oece", "test_uece", "test_nll")
SEEDS = {"compare_methods": 3, "combine": 3, "ablation": 2, "decompose": 3, "sensitivity_gamma": 3}


def report_main():
    spec = importlib.util.spec_from_file_location("_paper_report", ROOT / "studies" / "report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def write_rows(store: Path, tmp: Path, study: str, labels: list[str], seeds: int, values=None) -> None:
    """One ok trial per (label, seed) of ``study`` on digits-noisy · small_cnn; metric values made up (``values``:
    label -> the test ECE per seed), distinct per row and seed."""
    for rank, label in enumerate(labels):
        for seed in range(1, seeds + 1):
            config = parse_trial_config({**tiny_config(tmp, study=study, seed=seed, method={"name": "vanilla"}),
                                         "label": label, "label_rank": rank})
            metrics = {m: 0.02 + 0.001 * (i + 1) * (rank + 1) + 0.003 * seed for i, m in enumerate(METRICS)}
            metrics["test_accuracy"] = 0.9 - 0.002 * rank + 0.001 * seed
            if values is not None:
                metrics["test_ece"] = values[label][seed - 1]
            trial_id = hashlib.sha1(f"{study}/{label}/{seed}".encode()).hexdigest()[:16]
            write_result(store, TrialResult(config=config, trial_id=trial_id, stage1_id="0" * 16, metrics=metrics))


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """Every shipped spec's rows in the study it reads first (the γ table's too), 2 or 3 seeds."""
    tmp = tmp_path_factory.mktemp("paper")
    store = tmp / "store"
    rows: dict[str, list[str]] = {}
    for path in SPECS:
        spec = load_spec(path, _catalogs())
        study = spec.studies[0] if spec.studies[0] in SEEDS else spec.studies[-1]
        rows.setdefault(study, [])
        rows[study] += [row.label for row in spec.rows if row.label not in rows[study]]
    for study, labels in rows.items():
        write_rows(store, tmp, study, labels, SEEDS[study])
    return store


def _catalogs():
    return row_catalogs(sorted((ROOT / "studies" / "ladders").glob("*.yaml")))


def test_a_spec_ships_for_every_seed_table():
    assert {p.stem for p in SPECS} == {"mac_cal_table1", "mac_cal_table3", "mac_cal_table5", "fedlas_table1",
                                       "fedlas_table4", "smart_posthoc", "gamma_sensitivity", "two_stage_vs_ts",
                                       "mac_cal_table5_steps"}


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_every_shipped_spec_writes_its_tables(path, store, tmp_path, capsys):
    out = tmp_path / "out"
    assert report_main()(["--table", str(path), "--store", str(store), "--out", str(out)]) == 0
    spec = load_spec(path, _catalogs())
    printed = capsys.readouterr().out
    assert {p.name for p in out.iterdir()} == {f"{spec.name}.{suffix}" for suffix in ("tex", "md", "csv")}
    assert (out / f"{spec.name}.md").read_text() in printed
    cells = pd.read_csv(out / f"{spec.name}.csv", keep_default_na=False)
    assert list(cells.columns) == CSV_COLUMNS
    study = next(s for s in spec.studies if s in SEEDS)
    # every row of the spec, every metric, the store's one setup (no paper setup in a quick store)
    assert len(cells) == len(spec.rows) * len(spec.metrics)
    assert set(cells["setup"]) == {"digits-noisy/small_cnn"} and set(cells["study"]) == {study}
    assert set(cells["n"]) == {SEEDS[study]}
    assert list(dict.fromkeys(cells["row"])) == [row.name for row in spec.rows]
    tex = (out / f"{spec.name}.tex").read_text()
    assert tex.isascii()
    assert rf"\label{{{latex_escape(spec.label)}}}" in tex and r"\caption{" in tex and r"\cmidrule(lr)" in tex


def test_the_csv_holds_the_policy_numbers_of_a_hand_computed_table(tmp_path, capsys):
    """Two rows over 3 seeds: A's ECE 1, 2, 3 %, B's (the control) 2, 4, 6 %: A 2.00 ± t(0.975, 2)·1/√3 = 2.48,
    B 4.00 ± 4.97; the paired differences −1, −2, −3 % (t = −3.46, p = 0.074 > 0.05: no marker); A in bold."""
    store = tmp_path / "store"
    write_rows(store, tmp_path, "compare_methods", ["CE+TS", "LS"], 3,
               values={"LS": [0.01, 0.02, 0.03], "CE+TS": [0.02, 0.04, 0.06]})
    spec = tmp_path / "two.yaml"
    spec.write_text("name: two\ncaption: Two rows.\nlabel: tab:two\nstudies: [compare_methods]\n"
                    "rows: [{label: LS, name: A}, {label: CE+TS, name: B}]\nmetrics: {test_ece: ECE}\n"
                    "difference: true\n")
    assert report_main()(["--table", str(spec), "--store", str(store), "--out", str(tmp_path / "out")]) == 0
    lines = (tmp_path / "out" / "two.md").read_text().splitlines()
    assert lines[:6] == [
        "Two rows. mean ± 95% CI over n = 3 seeds; fractions in percent. Δ: paired difference from B with its 95% CI."
        " Setup: digits-noisy · small_cnn.",
        "",
        "| Method | ECE | ΔECE vs B [CI] |",
        "|---|---:|---:|",
        "| A | **2.00 ± 2.48** | -2.00 [-4.48, +0.48] |",
        "| B | 4.00 ± 4.97 | – |"]
    cells = pd.read_csv(tmp_path / "out" / "two.csv").set_index("row")
    assert cells.loc["A", "p"] == pytest.approx(0.07418, abs=1e-4) and cells.loc["A", "test"] == "t-test"
    assert cells.loc["A", "mean"] == pytest.approx(0.02) and cells.loc["A", "ci_high"] == pytest.approx(0.044841, 1e-4)
    assert pd.isna(cells.loc["A", "marker"]) and pd.isna(cells.loc["B", "p"])


@pytest.mark.parametrize(("change", "named"), [
    ("studies: [compare_method]", "unknown study 'compare_method'"),
    ("rows: [Vanilla, LSS]", "unknown row 'LSS'"),
    ("metrics: {test_ecee: ECE}", "unknown metric column 'test_ecee'"),
    ("setups: [{dataset: cifar11, arch: resnet50}]", "unknown dataset 'cifar11'"),
    ("setups: [{dataset: cifar10, arch: resnet51}]", "unknown architecture 'resnet51'"),
    ("colour: red", "unknown key 'colour'"),
    ("control: CE+TS", "the control 'CE+TS' is not one of the spec's rows"),
    ("rows: [Vanilla, {label: LS, against: CE+TS}]", "row 'LS' is tested against 'CE+TS', which is not another row"),
    ("rows: [Vanilla, {label: LS, against: LS}]", "row 'LS' is tested against 'LS', which is not another row"),
    ("rows: [Vanilla, {label: LS, against: Vanilla}]\ncontrol: Vanilla",
     "`control` and rows' `against` exclude each other"),
])
def test_an_unknown_name_is_one_line_and_exit_2_with_nothing_written(change, named, store, tmp_path, capsys):
    key = change.split(":")[0]
    base = {"studies": "studies: [compare_methods]", "rows": "rows: [Vanilla, LS]",
            "metrics": "metrics: {test_ece: ECE}", "setups": "setups: []"}
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: bad\ncaption: c\nlabel: tab:bad\n" + "\n".join({**base, key: change}.values()) + "\n")
    out = tmp_path / "out"
    assert report_main()(["--table", str(spec), "--store", str(store), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and named in err[0]
    assert not out.exists()


def paired_table(tmp_path: Path, study: str, values: dict[str, list[float]], rows: str) -> tuple[pd.DataFrame, str]:
    """``values`` (label -> test ECE per seed) stored in ``study``, then ``report.py --table`` of a spec with ``rows``
    (YAML) and the test ECE: the CSV's cells by row, and the Markdown."""
    write_rows(tmp_path / "store", tmp_path, study, list(values), 3, values=values)
    spec = tmp_path / "pairs.yaml"
    spec.write_text(f"name: pairs\ncaption: Pairs.\nlabel: tab:pairs\nstudies: [{study}]\nrows: {rows}\n"
                    "metrics: {test_ece: ECE}\n")
    assert report_main()(["--table", str(spec), "--store", str(tmp_path / "store"), "--out",
                          str(tmp_path / "out")]) == 0
    return (pd.read_csv(tmp_path / "out" / "pairs.csv").set_index("row"),
            (tmp_path / "out" / "pairs.md").read_text())


def test_rows_against_their_own_row_are_paired_tests_with_holm_over_the_pairs(tmp_path):
    """Two pairs over 3 seeds (MaC-Cal Table 3's layout): LS's ECE 1, 2, 3 % and LS +MaC-Cal's 0.5, 1.4, 2.2 %
    (differences −0.5, −0.6, −0.8), FL's 2, 3, 4 % and FL +MaC-Cal's 2.1, 2.9, 4.3 % (+0.1, −0.1, +0.3). Each pair's
    p is scipy's paired t-test of its two rows alone; Holm over the 2 pairs: LS's 2·p, FL's max(that, p)."""
    values = {"LS": [0.01, 0.02, 0.03], "LS +MaC-Cal": [0.005, 0.014, 0.022],
              "FL": [0.02, 0.03, 0.04], "FL +MaC-Cal": [0.021, 0.029, 0.043]}
    cells, md = paired_table(tmp_path, "combine", values, "[LS, {label: LS +MaC-Cal, against: LS}, FL, "
                                                          "{label: FL +MaC-Cal, against: FL}]")
    p_ls = scipy.stats.ttest_rel(values["LS +MaC-Cal"], values["LS"]).pvalue
    p_fl = scipy.stats.ttest_rel(values["FL +MaC-Cal"], values["FL"]).pvalue
    assert cells.loc["LS +MaC-Cal", "p"] == pytest.approx(p_ls, rel=1e-9)
    assert cells.loc["FL +MaC-Cal", "p"] == pytest.approx(p_fl, rel=1e-9)
    assert cells.loc["LS +MaC-Cal", "p_adjusted"] == pytest.approx(2 * p_ls, rel=1e-9) and 2 * p_ls < 0.05
    assert cells.loc["FL +MaC-Cal", "p_adjusted"] == pytest.approx(max(2 * p_ls, p_fl), rel=1e-9)
    assert cells.loc["LS +MaC-Cal", "difference"] == pytest.approx(-0.019 / 3)
    assert list(cells["marker"].fillna("")) == ["", "better", "", ""]
    assert pd.isna(cells.loc["LS", "p"]) and pd.isna(cells.loc["FL", "p"])  # the rows tested against: untested
    assert "| LS +MaC-Cal | **1.37 ± 2.11** ▲ |" in md
    assert ("▲ / ▼: significantly better / worse than the row above it: paired t-test on seed of the two rows, Holm "
            "over the pairs of each column, α = 0.05") in md


def test_rows_against_their_own_row_win_over_the_studys_default_control(tmp_path):
    """An ablation's default control is its first rung; a spec whose rows name `against` tests each rung against the
    rung before it instead: +Gradient Restriction's difference is from +Masked Retraining (3 - 2 = +1 point), not
    from Vanilla (+2)."""
    values = {"Vanilla": [0.01, 0.02, 0.03], "+Masked Retraining": [0.02, 0.03, 0.045],
              "+Gradient Restriction": [0.03, 0.04, 0.055]}
    rows = ("[Vanilla, {label: +Masked Retraining, against: Vanilla}, "
            "{label: +Gradient Restriction, against: +Masked Retraining}]")
    cells, md = paired_table(tmp_path, "ablation", values, rows)
    assert cells.loc["+Gradient Restriction", "difference"] == pytest.approx(0.01)
    assert cells.loc["+Masked Retraining", "difference"] == pytest.approx(0.035 / 3)
    assert pd.isna(cells.loc["Vanilla", "p"])
    assert "than the row above it" in md


def test_a_missing_study_names_the_command_that_runs_it(tmp_path, capsys):
    write_rows(tmp_path / "store", tmp_path, "combine", ["LS"], 2)
    code = report_main()(["--table", str(ROOT / "tables" / "fedlas_table4.yaml"), "--store",
                          str(tmp_path / "store"), "--out", str(tmp_path / "out")])
    assert code == 1 and not (tmp_path / "out").exists()
    assert (f"[fedlas_table4] no trial of decompose / compare_methods in {tmp_path / 'store'}; run: python "
            f"studies/decompose.py --store {tmp_path / 'store'}") in capsys.readouterr().out


def test_a_missing_row_names_the_command_that_runs_it(tmp_path, capsys):
    write_rows(tmp_path / "store", tmp_path, "compare_methods", ["Vanilla", "LS"], 2)
    spec = tmp_path / "rows.yaml"
    spec.write_text("name: rows\ncaption: c\nlabel: tab:rows\nstudies: [compare_methods]\n"
                    "rows: [Vanilla, LS, CE+TS]\nmetrics: {test_ece: ECE}\n")
    assert report_main()(["--table", str(spec), "--store", str(tmp_path / "store"), "--out",
                          str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert (f"[rows] row CE+TS not in the store; run: python studies/compare_methods.py --methods CE+TS "
            f"--store {tmp_path / 'store'}") in out
    assert "| CE+TS | – |" in out


def test_latex_escape_is_total_and_ascii():
    assert latex_escape("ΔECE ± 95% · γ=0.8 ▲") == r"$\Delta$ECE $\pm$ 95\% $\cdot$ $\gamma$=0.8 $^{\blacktriangle}$"
    assert latex_escape("café ✓ a_b") == r"caf\'{e} [U+2713] a\_b"
    assert all(latex_escape(chr(c)).isascii() for c in range(0x80, 0x3000))


@pytest.mark.skipif(shutil.which("pdflatex") is None and not os.environ.get("CALIB_CI"),
                    reason="pdflatex is not installed (apt-get install texlive-latex-base texlive-latex-recommended); "
                           ".ci/run installs it, runs this")
def test_every_shipped_spec_compiles_with_pdflatex(store, tmp_path):
    """Each shipped spec's .tex, \\input into a plain article with booktabs, amssymb and graphicx, through pdflatex
    -halt-on-error: any LaTeX error fails. Never skipped in CI (.ci/run sets CALIB_CI and installs TeX Live)."""
    assert shutil.which("pdflatex"), "pdflatex is not installed: apt-get install texlive-latex-base " \
                                     "texlive-latex-recommended"
    out = tmp_path / "tables"
    args = [a for path in SPECS for a in ("--table", str(path))]
    assert report_main()([*args, "--store", str(store), "--out", str(out)]) == 0
    inputs = "\n".join(rf"\input{{{path.stem}.tex}}\clearpage" for path in SPECS)
    (out / "paper.tex").write_text("\\documentclass{article}\n\\usepackage{booktabs,amssymb,graphicx}\n"
                                   f"\\begin{{document}}\n{inputs}\n\\end{{document}}\n")
    done = subprocess.run(["pdflatex", "-halt-on-error", "-interaction=nonstopmode", "paper.tex"], cwd=out,
                          capture_output=True, text=True, timeout=120)
    errors = [line for line in done.stdout.splitlines() if line.startswith("!")]
    assert done.returncode == 0 and not errors, "\n".join(errors) or done.stdout[-2000:]
    assert (out / "paper.pdf").stat().st_size > 0


def test_correct_across_is_holm_over_every_tested_cell_of_the_table(tmp_path):
    """--correct-across: the CSV's adjusted p is Holm (statsmodels) over the 4 tested cells (2 rows × 2 metrics)
    together, not over the rows of each column; the legend says so."""
    from statsmodels.stats.multitest import multipletests

    # Not at the top: statsmodels is only this test's independent reference.
    store = tmp_path / "store"
    values = {"CE+TS": [0.02, 0.04, 0.06], "LS": [0.01, 0.025, 0.03], "FL": [0.05, 0.06, 0.09]}
    write_rows(store, tmp_path, "compare_methods", list(values), 3, values=values)
    spec = tmp_path / "across.yaml"
    spec.write_text("name: across\ncaption: c\nlabel: tab:across\nstudies: [compare_methods]\n"
                    "rows: [CE+TS, LS, FL]\nmetrics: {test_ece: ECE, test_nll: NLL}\n")
    out = tmp_path / "out"
    assert report_main()(["--table", str(spec), "--store", str(store), "--out", str(out), "--correct-across"]) == 0
    cells = pd.read_csv(out / "across.csv")
    tested = cells[cells["p"].notna()]
    assert len(tested) == 4
    assert tested["p_adjusted"].tolist() == pytest.approx(list(multipletests(tested["p"], method="holm")[1]))
    assert "Holm over every tested cell of this table (4 tests" in (out / "across.md").read_text()


def test_a_paper_setup_in_the_store_gets_the_papers_layout_and_its_published_numbers(tmp_path, capsys):
    """MaC-Cal Table 1's spec on a store with one of its setups (CIFAR-10 × ResNet-110): that setup only, headed as
    the paper heads it, the published ECE beside ours (4.06 and 1.25, docs/methods.md §9.1), the other setups named
    as left out, and each absent row as one line."""
    store = tmp_path / "store"
    for rank, label in enumerate(["Vanilla", "MaC-Cal"]):
        for seed in (1, 2, 3):
            config = parse_trial_config({**tiny_config(tmp_path, study="compare_methods", seed=seed,
                                                       method={"name": "vanilla"}),
                                         "dataset": "cifar10", "arch": "resnet110", "label": label,
                                         "label_rank": rank})
            write_result(store, TrialResult(config=config, trial_id=f"{rank}{seed:015x}", stage1_id="0" * 16,
                                            metrics={"test_ece": 0.04 - 0.02 * rank + 0.001 * seed}))
    out = tmp_path / "out"
    assert report_main()(["--table", str(ROOT / "tables" / "mac_cal_table1.yaml"), "--store", str(store),
                          "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "[mac_cal_table1] not in the store, left out: cifar10/resnet50, cifar10/wrn26_10" in printed
    assert ("[mac_cal_table1] rows ACLS, LS, MbLS, Mixup, MIT, FL, FLSD-53, DFL, CPC, MMCE, PLP, TST, V-TST, BalCAL "
            "not in the store; run: python studies/compare_methods.py --methods ACLS LS MbLS Mixup MIT FL FLSD-53 DFL "
            f"CPC MMCE PLP TST V-TST BalCAL --store {store}") in printed
    lines = (out / "mac_cal_table1.md").read_text().splitlines()
    assert lines[0].endswith("Setup: C10 R110.")
    assert lines[2] == "| Method | ECE | ECE (paper) |"
    assert lines[4] == "| Vanilla | 4.20 ± 0.10 | 4.06 |"  # spread: std over seeds 4.1, 4.2, 4.3 %
    assert lines[5] == "| ACLS | – | – |"
    assert lines[19] == "| MaC-Cal | **2.20 ± 0.10** ▲ | 1.25 |"
    tex = (out / "mac_cal_table1.tex").read_text()
    assert r"\multicolumn{2}{c}{C10 R110}" in tex and r"\cmidrule(lr){2-3}" in tex


def test_a_search_confirmation_table_takes_its_rows_from_the_row_files(tmp_path, capsys):
    """A `<search>_confirm` study: the method's default row and the chosen row named by its row file; the control
    is the study's own (the default row, its first); a label no row file names is unknown (exit 2)."""
    row_file = tmp_path / "chosen.yaml"
    row_file.write_text("label: MaC-Cal (tuned)\nmethod: {name: mac_cal, accuracy_weight: 0.9}\n")
    store = tmp_path / "store"
    write_rows(store, tmp_path, "search_mac_cal_confirm", ["MaC-Cal", "MaC-Cal (tuned)"], 3)
    spec = tmp_path / "confirm.yaml"
    text = ("name: confirm\ncaption: c\nlabel: tab:confirm\nstudies: [search_mac_cal_confirm]\n"
            f"row_files: [{row_file}]\nmetrics: {{test_ece: ECE}}\n")
    spec.write_text(text + "rows: [MaC-Cal, MaC-Cal (tuned)]\n")
    assert report_main()(["--table", str(spec), "--store", str(store), "--out", str(tmp_path / "out")]) == 0
    cells = pd.read_csv(tmp_path / "out" / "confirm.csv").set_index("label")
    assert set(cells["n"]) == {3} and pd.isna(cells.loc["MaC-Cal", "p"]) and cells.loc["MaC-Cal (tuned)", "p"] >= 0
    spec.write_text(text + "rows: [MaC-Cal, MaC-Cal (tuned 2)]\n")
    assert report_main()(["--table", str(spec), "--store", str(store), "--out", str(tmp_path / "out2")]) == 2
    assert "unknown row 'MaC-Cal (tuned 2)'" in capsys.readouterr().err


def test_two_setups_are_two_column_groups_and_a_setups_own_legend_line_names_it(tmp_path):
    """Two setups of the spec in the store: two column groups in the spec's order (`<setup> · <metric>` in Markdown,
    a \\multicolumn and \\cmidrule each in LaTeX); the line only one setup has (its control has 2 seeds and no kept
    predictions: no markers) is prefixed by that setup's header."""
    store = tmp_path / "store"
    for seeds, (dataset, arch) in ((3, ("digits-noisy", "small_cnn")), (2, ("cifar10", "resnet50"))):
        for rank, label in enumerate(["CE+TS", "LS"]):
            for seed in range(1, seeds + 1):
                config = parse_trial_config({**tiny_config(tmp_path, study="compare_methods", seed=seed,
                                                           method={"name": "vanilla"}),
                                             "dataset": dataset, "arch": arch, "label": label, "label_rank": rank})
                write_result(store, TrialResult(config=config, trial_id=f"{len(dataset) % 10}{rank}{seed:014x}",
                                                stage1_id="0" * 16, metrics={"test_ece": 0.05 + 0.01 * rank * seed}))
    spec = tmp_path / "two.yaml"
    spec.write_text("name: two\ncaption: c\nlabel: tab:two\nstudies: [compare_methods]\nrows: [CE+TS, LS]\n"
                    "metrics: {test_ece: ECE}\nsetups: [{dataset: cifar10, arch: resnet50, header: C10},\n"
                    "  {dataset: digits-noisy, arch: small_cnn, header: Digits}]\n")
    assert report_main()(["--table", str(spec), "--store", str(store), "--out", str(tmp_path / "out")]) == 0
    lines = (tmp_path / "out" / "two.md").read_text().splitlines()
    assert lines[2] == "| Method | C10 · ECE | Digits · ECE |"
    # LS's ECE: 6, 7 % on C10 (± t(0.975, 1)·0.707/√2 = 6.35); 6, 7, 8 % on Digits (± 2.48; p = 0.074: no marker)
    assert lines[4:6] == ["| CE+TS | **5.00 ± 0.00** | **5.00 ± 0.00** |", "| LS | 6.50 ± 6.35 | 7.00 ± 2.48 |"]
    assert lines[7].startswith("C10: No markers: CE+TS has 2 seeds here")
    assert lines[8].startswith("Digits: ▲ / ▼: significantly better / worse than CE+TS")
    tex = (tmp_path / "out" / "two.tex").read_text()
    assert r"& \multicolumn{1}{c}{C10} & \multicolumn{1}{c}{Digits} \\" in tex
    assert r"\cmidrule(lr){2-2} \cmidrule(lr){3-3}" in tex
