"""Where the labels of an alert's picture go: inside the plot, off the series and off each other.

Each label has spots to choose from, in order of preference (the threshold's at the right end of its line, then
the left; the start's right of its line, then left of it). The first spot whose text lies inside the plot, clear
of the series and of the labels placed before it, is taken; when none is, inside the plot comes first, then off
the series.
A new alert starts at the right end of its window, so its "fired" label goes left of the line; a series that
crossed the threshold near the right end takes the threshold's label to the left end or under the line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.backend_bases import RendererBase
    from matplotlib.lines import Line2D
    from matplotlib.path import Path
    from matplotlib.text import Annotation, Text
    from matplotlib.transforms import Bbox


HorizontalAlignment = Literal["left", "right"]
VerticalAlignment = Literal["top", "bottom"]
_GAP = 4.0  # points between a label and its anchor


@dataclass(frozen=True)
class Spot:
    """A label's anchor (in the annotation's own coordinates), on which side of it the text goes, and the text's
    alignment that puts it there, `_GAP` points away."""

    xy: tuple[float, float]
    ha: HorizontalAlignment
    va: VerticalAlignment

    @property
    def offset(self) -> tuple[float, float]:
        return (_GAP if self.ha == "left" else -_GAP, _GAP if self.va == "bottom" else -_GAP)


def place_labels(
    axes: Axes, series: Line2D, labels: Sequence[tuple[Annotation, Sequence[Spot]]], fixed: Sequence[Text] = ()
) -> None:
    """Move each label to its best spot, in order; `fixed` labels stay where they are and are avoided."""
    renderer = axes.figure.canvas.get_renderer()  # type: ignore[attr-defined]
    plot = axes.get_window_extent(renderer)
    line = series.get_transform().transform_path(series.get_path())
    taken = [text.get_window_extent(renderer) for text in fixed]
    for label, spots in labels:

        def faults(spot: Spot, label: Annotation = label) -> tuple[bool, bool, bool]:
            box = _put(label, spot, renderer)
            return (not _inside(box, plot), _crosses(line, box), any(box.overlaps(other) for other in taken))

        best = min(spots, key=faults)
        taken.append(_put(label, best, renderer))


def _put(label: Annotation, spot: Spot, renderer: RendererBase) -> Bbox:
    label.xy = spot.xy
    label.xyann = spot.offset
    label.set_horizontalalignment(spot.ha)
    label.set_verticalalignment(spot.va)
    return label.get_window_extent(renderer)


def _inside(box: Bbox, plot: Bbox) -> bool:
    return bool(plot.x0 <= box.x0 and box.x1 <= plot.x1 and plot.y0 <= box.y0 and box.y1 <= plot.y1)


def _crosses(line: Path, box: Bbox) -> bool:
    crosses: bool = line.intersects_bbox(box, filled=False)
    return crosses
