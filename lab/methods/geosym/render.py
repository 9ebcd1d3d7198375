"""Draw a construction with matplotlib (Agg): labelled points, marks, a shaded region.

Segments, polygons and circles are drawn in dark blue; a question's shaded
region (inside one object, outside one it contains) is filled grey; right
angles get a small square, equal segments the same number of tick marks;
points are black dots, and given points are labelled with their integer
coordinates (``A(0, 4)``), the others with their name; circles carry their
name (``c1``) just outside them. Labels are placed
greedily: for each point, of 16 positions around it, the one whose box
overlaps fewest already placed labels, other points and sampled line pixels
(the usual greedy point-feature label placement; Christensen, Marks and
Shieber 1995, "An empirical study of algorithms for point-feature label
placement").

:func:`render` returns the RGB image and where each point and label landed in
pixel coordinates (origin top-left), so that a caller can check the picture
against the construction: the axes fill the figure, so a point ``(x, y)``
lands at ``((x - x0) / (x1 - x0) * W, (y1 - y) / (y1 - y0) * H)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Circle, Polygon

from lab.methods.geosym.grammar import Construction

LINE = "#1f3b73"
SHADE = "#b8b8b8"


@dataclass
class Rendered:
    image: np.ndarray  # uint8 [H, W, 3]
    points_px: dict[str, tuple[float, float]]
    # Point and circle names -> label box x0, y0, x1, y1 (pixels, top-left origin).
    labels_px: dict[str, tuple[float, float, float, float]]
    xlim: tuple[float, float]
    ylim: tuple[float, float]


def label_text(c: Construction, name: str) -> str:
    p = c.points[name]
    if p.given:
        return f"{name}({int(p.exact[0])}, {int(p.exact[1])})"
    return name


def _shape_patch(c: Construction, name: str, **kw):
    s = c.shapes[name]
    if s.kind == "circle":
        return Circle(c.points[s.points[0]].value, s.radius, **kw)
    return Polygon([c.points[p].value for p in s.points], closed=True, **kw)


def _samples(c: Construction) -> list[tuple[float, float]]:
    """Points along every drawn line, for label placement (data coordinates)."""
    out = []
    for s in c.shapes.values():
        if s.kind == "circle":
            cx, cy = c.points[s.points[0]].value
            out += [(cx + s.radius * math.cos(t), cy + s.radius * math.sin(t))
                    for t in np.linspace(0, 2 * math.pi, 96, endpoint=False)]
        else:
            pts = [c.points[p].value for p in s.points]
            pairs = [(pts[0], pts[1])] if s.kind == "segment" else [
                (pts[i], pts[(i + 1) % len(pts)]) for i in range(len(pts))]
            for a, b in pairs:
                out += [(a[0] + t * (b[0] - a[0]), a[1] + t * (b[1] - a[1]))
                        for t in np.linspace(0, 1, 40)]
    return out


def _box_cost(box, placed, pt_px, line_px, size: int) -> float:
    """How bad a label box is: overlap with the labels already placed (as a fraction of its
    area), points and line pixels it covers, and how far it leaves the image."""
    w, h = box[2] - box[0], box[3] - box[1]
    cost = 0.0
    for b in placed:
        ox = max(0.0, min(box[2], b[2]) - max(box[0], b[0]))
        oy = max(0.0, min(box[3], b[3]) - max(box[1], b[1]))
        cost += 50.0 * ox * oy / (w * h)
    cost += 20.0 * _inside(pt_px, box, 6) + 1.0 * _inside(line_px, box, 2)
    out = max(0.0, -box[0]) + max(0.0, -box[1]) + max(0.0, box[2] - size) + max(
        0.0, box[3] - size)
    return cost + 10.0 * out


def _inside(arr: np.ndarray, box, pad: float) -> int:
    if not len(arr):
        return 0
    return int(np.sum((arr[:, 0] > box[0] - pad) & (arr[:, 0] < box[2] + pad)
                      & (arr[:, 1] > box[1] - pad) & (arr[:, 1] < box[3] + pad)))


def render(c: Construction, *, shaded: tuple[str, str] | None = None, size: int = 1024,
           dpi: int = 128, font_size: float = 13.0, margin: float = 0.16) -> Rendered:
    """Render ``c`` as a ``size`` x ``size`` RGB image; ``shaded`` = (outer, inner) shapes."""
    if size < 64:
        raise ValueError(f"render: size {size}, expected at least 64 pixels")
    fig = Figure(figsize=(size / dpi, size / dpi), dpi=dpi)
    canvas = FigureCanvasAgg(fig)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_axis_off()
    xs, ys = zip(*[p.value for p in c.points.values()], strict=True)
    xs, ys = list(xs), list(ys)
    for s in c.shapes.values():
        if s.kind == "circle":
            cx, cy = c.points[s.points[0]].value
            xs += [cx - s.radius, cx + s.radius]
            ys += [cy - s.radius, cy + s.radius]
    span = max(max(xs) - min(xs), max(ys) - min(ys), 1e-9) * (1 + 2 * margin)
    mx, my = (max(xs) + min(xs)) / 2, (max(ys) + min(ys)) / 2
    xlim, ylim = (mx - span / 2, mx + span / 2), (my - span / 2, my + span / 2)
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    lw = 1.6 * size / 768

    if shaded is not None:
        outer, inner = shaded
        ax.add_patch(_shape_patch(c, outer, facecolor=SHADE, edgecolor="none", zorder=0))
        ax.add_patch(_shape_patch(c, inner, facecolor="white", edgecolor="none", zorder=0.5))
    for s in c.shapes.values():
        if s.kind == "segment":
            (x0, y0), (x1, y1) = (c.points[p].value for p in s.points)
            ax.plot([x0, x1], [y0, y1], color=LINE, lw=lw, zorder=1,
                    ls="--" if s.role in ("altitude", "diagonal") else "-")
        else:
            ax.add_patch(_shape_patch(c, s.name, fill=False, edgecolor=LINE, lw=lw, zorder=1))

    mark = 0.025 * span
    for a, b, cc in c.right_angles:
        pa, pb, pc = (np.array(c.points[n].value) for n in (a, b, cc))
        u = (pa - pb) / np.linalg.norm(pa - pb) * mark
        v = (pc - pb) / np.linalg.norm(pc - pb) * mark
        sq = np.array([pb + u, pb + u + v, pb + v])
        ax.plot(sq[:, 0], sq[:, 1], color=LINE, lw=lw * 0.8, zorder=1.5)
    for k, group in enumerate(c.equal):
        for p, q in group:
            pa, pb = np.array(c.points[p].value), np.array(c.points[q].value)
            d = pb - pa
            n = np.array([-d[1], d[0]]) / (np.linalg.norm(d) + 1e-12) * mark * 0.6
            t = d / (np.linalg.norm(d) + 1e-12) * mark * 0.35
            mid = (pa + pb) / 2
            for j in range(k % 3 + 1):
                o = mid + t * (j - (k % 3) / 2)
                ax.plot([o[0] - n[0], o[0] + n[0]], [o[1] - n[1], o[1] + n[1]], color=LINE,
                        lw=lw * 0.8, zorder=1.5)

    names = list(c.points)
    pxy = np.array([c.points[n].value for n in names])
    ax.scatter(pxy[:, 0], pxy[:, 1], s=(4.0 * size / 768) ** 2 * 4, color="black", zorder=3,
               edgecolors="none")

    to_px = lambda x, y: ((x - xlim[0]) / (xlim[1] - xlim[0]) * size,
                          (ylim[1] - y) / (ylim[1] - ylim[0]) * size)
    points_px = {n: to_px(*c.points[n].value) for n in names}
    line_px = np.array([to_px(x, y) for x, y in _samples(c)]) if c.shapes else np.zeros((0, 2))
    pt_px = np.array([points_px[n] for n in names])
    fs_px = font_size * dpi / 72
    placed: list[tuple[float, float, float, float]] = []
    texts = {}
    for n in names:
        text = label_text(c, n)
        w, h = 0.6 * fs_px * len(text) + 4, 1.25 * fs_px
        px, py = points_px[n]
        best, best_score = None, None
        for j in range(16):
            ang = 2 * math.pi * j / 16
            r = 0.9 * fs_px
            cx = px + math.cos(ang) * (r + w / 2)
            cy = py - math.sin(ang) * (r + h / 2)
            box = (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2)
            score = _box_cost(box, placed, pt_px, line_px, size) + 0.01 * j
            if best_score is None or score < best_score:
                best, best_score = box, score
        placed.append(best)
        cx, cy = (best[0] + best[2]) / 2, (best[1] + best[3]) / 2
        dx = xlim[0] + cx / size * (xlim[1] - xlim[0])
        dy = ylim[1] - cy / size * (ylim[1] - ylim[0])
        texts[n] = ax.text(dx, dy, text, fontsize=font_size, ha="center", va="center",
                           color="black", zorder=4)

    for s in c.shapes.values():  # circle names, just outside the circle
        if s.kind != "circle":
            continue
        w, h = 0.6 * fs_px * len(s.name) + 4, 1.25 * fs_px
        ccx, ccy = points_px[s.points[0]]
        rad = s.radius / (xlim[1] - xlim[0]) * size
        best, best_score = None, None
        for j in range(24):
            ang = 2 * math.pi * (j + 0.5) / 24
            dist = rad + 0.6 * max(w, h)
            cx, cy = ccx + math.cos(ang) * dist, ccy - math.sin(ang) * dist
            box = (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2)
            score = _box_cost(box, placed, pt_px, line_px, size) + 0.001 * j
            if best_score is None or score < best_score:
                best, best_score = box, score
        placed.append(best)
        cx, cy = (best[0] + best[2]) / 2, (best[1] + best[3]) / 2
        texts[s.name] = ax.text(xlim[0] + cx / size * (xlim[1] - xlim[0]),
                                ylim[1] - cy / size * (ylim[1] - ylim[0]), s.name,
                                fontsize=font_size, ha="center", va="center", color=LINE,
                                style="italic", zorder=4)

    canvas.draw()
    image = np.asarray(canvas.buffer_rgba())[..., :3].copy()
    renderer = canvas.get_renderer()
    labels_px = {}
    for n, t in texts.items():
        bb = t.get_window_extent(renderer)
        labels_px[n] = (bb.x0, size - bb.y1, bb.x1, size - bb.y0)
    return Rendered(image, points_px, labels_px, xlim, ylim)


def labels_overlap(r: Rendered) -> list[tuple[str, str]]:
    """Pairs of labels whose drawn boxes intersect."""
    names = list(r.labels_px)
    out = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            p, q = r.labels_px[a], r.labels_px[b]
            if min(p[2], q[2]) > max(p[0], q[0]) and min(p[3], q[3]) > max(p[1], q[1]):
                out.append((a, b))
    return out


__all__ = ["Rendered", "label_text", "labels_overlap", "render"]
