"""Tables and figures regenerated from the result store (matplotlib lives only in ``figures``)."""

from calib.report.steps import report_step
from calib.report.tables import format_mean_ci, mean_ci, mixed_trainings, summarize, to_markdown

__all__ = ["format_mean_ci", "mean_ci", "mixed_trainings", "report_step", "summarize", "to_markdown"]
