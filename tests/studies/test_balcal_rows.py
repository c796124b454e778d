"""The three MaC-Cal Table 1 rows of BALCAL-R's methods (CPC, PLP, BalCAL) in the studies: listed where the seeds
list them, and each trained by the quick preset (2 epochs on digits-noisy) into an ok store row."""

from __future__ import annotations

import pandas as pd
import pytest
from in_process import run_study, study_module

from calib.study.rows import METHOD_ROWS, STAGE1_ROWS

TINY = ["--epochs", "2", "--stage2-epochs", "2"]


def test_rows_are_listed_where_the_seeds_have_them():
    rows = list(METHOD_ROWS)
    assert {"CPC", "PLP", "BalCAL"} <= set(rows)
    assert rows.index("MMCE") < rows.index("CPC") < rows.index("MIT") < rows.index("PLP") < rows.index("BalCAL")
    assert METHOD_ROWS["PLP"].stage1 == {"plp_gamma": 1.0} and METHOD_ROWS["BalCAL"].stage1 == {"balcal_delta": 0.95}
    assert {"PLP", "BalCAL"} <= set(study_module("ood.py").ROWS)  # MaC-Cal Table 2
    # MaC-Cal Table 3 (combine.py's rows are the Stage Is of STAGE1_ROWS): CPC, not PLP and BalCAL
    assert "CPC" in STAGE1_ROWS and not {"PLP", "BalCAL"} & set(STAGE1_ROWS)


@pytest.mark.ray
def test_quick_preset_trains_each_row(tmp_path):
    store = tmp_path / "results"
    out = run_study("compare_methods.py", "--store", str(store), "--seeds", "1", "--methods", "CPC", "PLP", "BalCAL",
                    *TINY)
    assert out.returncode == 0, out.stderr[-3000:]
    for row in ("CPC", "PLP", "BalCAL"):
        assert f"| {row} | 1 |" in out.stdout
    df = pd.read_parquet(store / "trials").set_index("label")
    assert (df["status"] == "ok").all() and len(df) == 3 and df["stage1_id"].nunique() == 3
    assert df.loc["CPC", "loss"] == "cpc" and df.loc["CPC", "loss_exclusion_weight"] == 1.0
    assert df.loc["PLP", "stage1_plp_gamma"] == 1.0 and pd.isna(df.loc["CPC", "stage1_plp_gamma"])
    assert df.loc["BalCAL", "stage1_balcal_delta"] == 0.95
    assert df["test_ece"].between(0, 1).all()
