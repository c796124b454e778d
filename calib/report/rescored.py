"""Rescored values in the report: the columns ``python -m calib.store rescore`` added (:mod:`calib.store.rescore`).

Each rescored column (``test_ece_bins10``, ``test_smece``) joins the trials by study and trial id. A column the
store's rows already have (a metric computed when the trial ran) keeps the row's value and takes the rescored one
only where the row has none (a metric registered later); a new column is added to every table of the study whose
trials have it, after the study's own columns, headed like the metric's own (``ECE (10 bins)``).
"""

from __future__ import annotations

import os
import re

import pandas as pd

from calib.store.rescore import rescored_values

__all__ = ["rescored_headers", "with_rescored"]

_HEADERS = {"accuracy": "Acc", "ece": "ECE", "aece": "AECE", "mce": "MCE", "nll": "NLL", "brier": "Brier",
            "oece": "O-ECE", "uece": "U-ECE", "cwece": "cwECE", "smece": "smECE", "l2ce_debiased": "dL2-CE"}
_RESCORED = re.compile(r"test_(?P<metric>[a-z0-9_]+?)(?:_bins(?P<bins>\d+))?")


def with_rescored(trials: pd.DataFrame, store: str | os.PathLike) -> pd.DataFrame:
    """``trials`` with the store's rescored values as columns (see the module docstring)."""
    values = rescored_values(store)
    if values.empty or trials.empty:
        return trials
    values = values.assign(study=values["study"].astype(str))
    keys = trials[["study", "trial_id"]].assign(study=trials["study"].astype(str))
    joined = keys.merge(values, on=["study", "trial_id"], how="left")
    out = trials.copy()
    for column in (c for c in values.columns if c not in ("study", "trial_id")):
        if column in out.columns:
            out[column] = out[column].fillna(pd.Series(joined[column].to_numpy(), index=out.index))
        else:
            out[column] = joined[column].to_numpy()
    out.attrs["rescored"] = [c for c in values.columns if c not in ("study", "trial_id")]
    return out


def rescored_headers(rows: pd.DataFrame) -> dict[str, str]:
    """The rescored test columns new to the store that ``rows`` (one study's trials) have values of, with headers."""
    headers = {}
    for column in rows.attrs.get("rescored", []):
        match = _RESCORED.fullmatch(column)
        if match is None or not match["bins"] or rows[column].isna().all():
            continue
        if {int(match["bins"])} == set(rows["num_bins"]) and f"test_{match['metric']}" in rows.columns:
            continue  # the stored column, computed at these bins
        name = _HEADERS.get(match["metric"], match["metric"])
        headers[column] = f"{name} ({match['bins']} bins)"
    return headers
