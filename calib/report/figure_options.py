"""How calib writes its figures: the file format, the resolution of a PNG and the width the figure is drawn for
(one column of a two-column paper, 3.3 in, or a whole page, 6.9 in). Every command that draws takes them as
``--format``, ``--dpi`` and ``--figure-width`` (:func:`add_figure_args`); :mod:`calib.report.figures` reads the
ones in use. Kept apart from it so that reading the flags does not import matplotlib."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

__all__ = ["FIGURE_FORMATS", "FIGURE_WIDTHS", "FigureOptions", "add_figure_args", "figure_options",
           "figure_options_of", "use_figure_options"]

FIGURE_FORMATS = ("png", "pdf", "svg")
FIGURE_WIDTHS = {"column": 3.3, "page": 6.9}
"""The widths a figure is drawn for, in inches: one column of a two-column paper, and the page's text width."""


@dataclass(frozen=True)
class FigureOptions:
    """``format``: png, pdf or svg; ``dpi``: the pixels per inch of a PNG (and of the raster parts of a PDF or
    SVG); ``width``: column or page (:data:`FIGURE_WIDTHS`)."""

    format: str = "png"
    dpi: int = 200
    width: str = "page"

    def __post_init__(self) -> None:
        if self.format not in FIGURE_FORMATS:
            raise ValueError(f"figure format {self.format!r}: one of {', '.join(FIGURE_FORMATS)}")
        if self.width not in FIGURE_WIDTHS:
            raise ValueError(f"figure width {self.width!r}: one of {', '.join(FIGURE_WIDTHS)}")
        if self.dpi <= 0:
            raise ValueError(f"figure dpi {self.dpi}: a positive integer")

    @property
    def inches(self) -> float:
        """The figure's width in inches."""
        return FIGURE_WIDTHS[self.width]

    @property
    def column(self) -> bool:
        """Drawn for one column: panels stacked rather than side by side, smaller type."""
        return self.width == "column"


_in_use = [FigureOptions()]


def figure_options() -> FigureOptions:
    """The options the figures of this process are drawn with."""
    return _in_use[0]


def use_figure_options(options: FigureOptions) -> None:
    """Draw this process's next figures with ``options``."""
    _in_use[0] = options


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: a positive integer, e.g. 300") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: a positive integer, e.g. 300")
    return value


def add_figure_args(parser: argparse.ArgumentParser) -> None:
    """``--format``, ``--dpi`` and ``--figure-width`` of the figures a command writes."""
    group = parser.add_argument_group("figures")
    default = FigureOptions()
    group.add_argument("--format", dest="figure_format", default=default.format, choices=FIGURE_FORMATS,
                       help="file format of the figures: png, or pdf / svg (vector) for print")
    group.add_argument("--dpi", dest="figure_dpi", type=_positive_int, default=default.dpi, metavar="N",
                       help="pixels per inch of a PNG figure (its width in pixels: N × the figure width)")
    group.add_argument("--figure-width", default=default.width, choices=list(FIGURE_WIDTHS),
                       help=f"draw the figures for one column ({FIGURE_WIDTHS['column']} in wide: panels stacked, "
                            f"smaller type) or a page ({FIGURE_WIDTHS['page']} in)")


def figure_options_of(args: argparse.Namespace) -> FigureOptions:
    """The :class:`FigureOptions` of parsed :func:`add_figure_args` flags."""
    return FigureOptions(args.figure_format, args.figure_dpi, args.figure_width)
