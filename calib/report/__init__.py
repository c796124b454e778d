"""Tables and figures regenerated from the result store (matplotlib lives only in ``figures``)."""

from calib.report.tables import format_mean_ci, mean_ci, summarize, to_markdown

__all__ = ["format_mean_ci", "mean_ci", "summarize", "to_markdown"]
