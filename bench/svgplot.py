#!/usr/bin/env python3
"""A small, dependency-free SVG line plot for the benchmark docs (standard library only).

    from svgplot import plot
    plot("docs/scale.svg", "Launch time", "nodes", "wall time (ms)", [
        {"label": "measured", "points": [(16, 26.9), (64, 76.5)], "style": "points"},
        {"label": "model", "points": model_pts, "style": "line", "dash": True},
    ], notes=["python3 bench/scale.py --plot"])

Axes are log-10 by default (whole decades, minor ticks at 2..9), linear with nice round
ticks otherwise. x tick labels read 10, 100, 1k, 10k, 100k; y tick labels 1, 10, 100, 1,000,
10,000. The legend goes in whichever inside corner of the plot covers the least data
(top-left when nothing is in the way). The output is deterministic: the same input gives a
byte-identical file.

`python3 bench/svgplot.py` writes a demo to /tmp/svgplot-demo.svg.
"""

import math
from xml.sax.saxutils import escape as _xml_escape

__all__ = ["plot", "PALETTE"]

# Okabe-Ito colour-blind-friendly palette (yellow last: it is faint on white).
PALETTE = (
    "#0072B2",  # blue
    "#D55E00",  # vermillion
    "#009E73",  # bluish green
    "#CC79A7",  # reddish purple
    "#E69F00",  # orange
    "#56B4E9",  # sky blue
    "#000000",  # black
    "#F0E442",  # yellow
)

FONT = "sans-serif"
TITLE_SIZE = 16
LABEL_SIZE = 13
TICK_SIZE = 12
LEGEND_SIZE = 12
NOTE_SIZE = 11
NOTE_LINE = 15
MARKER_R = 3.6
LINE_W = 2
DASH = "7 4"

TEXT_COLOR = "#222222"
AXIS_COLOR = "#444444"
GRID_MAJOR = "#dddddd"
GRID_MINOR = "#f0f0f0"
NOTE_COLOR = "#555555"


# --- text --------------------------------------------------------------------------------------

def _esc(s):
    """Escape text for XML content and attribute values."""
    return _xml_escape(str(s), {'"': "&quot;", "'": "&apos;"})


_NARROW = set("iljtfI.,:;'|!()[] ")
_WIDE = set("mwMW@%")


def _text_width(s, size):
    """Rendered width of s at size px, erring wide: DejaVu Sans metrics (what sans-serif is
    on most Linux systems; Helvetica and Arial are narrower)."""
    em = 0.0
    for c in str(s):
        if c in _NARROW:
            em += 0.32
        elif c in _WIDE:
            em += 0.92
        elif c.isupper():
            em += 0.72
        else:
            em += 0.62
    return em * size


def _num(v):
    """A coordinate, to 2 decimals, with no trailing zeros (deterministic, compact)."""
    s = "%.2f" % v
    if "." in s:
        s = s.rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


def _wrap(line, max_w, size):
    """Break a note line at spaces so that it fits max_w (a single long word stays whole)."""
    words = str(line).split(" ")
    out, cur = [], ""
    for w in words:
        cand = w if not cur else cur + " " + w
        if cur and _text_width(cand, size) > max_w:
            out.append(cur)
            cur = "    " + w  # indent continuation lines
        else:
            cur = cand
    out.append(cur)
    return out


# --- number formats ----------------------------------------------------------------------------

def _trim(s):
    if "." in s:
        s = s.rstrip("0").rstrip(".")
    return s


def _fmt_small(v):
    """Numbers below 1, e.g. 0.5, 0.02, 0.001 (enough decimals, no float noise)."""
    if v == 0:
        return "0"
    d = max(0, -math.floor(math.log10(abs(v)))) + 2
    return _trim("%.*f" % (d, v))


def _fmt_si(v):
    """x labels: 1, 10, 100, 1k, 10k, 100k, 1M, 2.5M ..."""
    a = abs(v)
    if a >= 1e3:
        for div, suf in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
            if a >= div:
                return _trim("%.2f" % (v / div)) + suf
    if a >= 1 or v == 0:
        return _trim("%.2f" % v)
    return _fmt_small(v)


def _fmt_comma(v):
    """y labels: 1, 10, 100, 1,000, 10,000 (SI beyond ten million), 0.1, 0.01 below 1."""
    a = abs(v)
    if a >= 1e7:
        return _fmt_si(v)
    if a >= 1 or v == 0:
        if abs(v - round(v)) < 1e-9 * max(1.0, a):
            return "{:,}".format(int(round(v)))
        return _trim("{:,.2f}".format(v))
    return _fmt_small(v)


# --- axes --------------------------------------------------------------------------------------

class _Axis:
    """Maps data values to pixels and lists ticks: (value, label-or-None, major?)."""

    def __init__(self, rng, log, fmt, p0, p1):
        """rng: (first, last) decade exponents for a log axis, (lo, hi, step) for a linear
        one; p0, p1: the pixel positions of the low and high ends."""
        self.log = log
        self.fmt = fmt
        self.p0, self.p1 = p0, p1
        if log:
            self.e0, self.e1 = rng
            self.lo, self.hi = 10.0 ** self.e0, 10.0 ** self.e1
        else:
            self.lo, self.hi, self.step = rng
            self.i0 = round(self.lo / self.step)
            self.i1 = round(self.hi / self.step)
        # 10,000,000 is too long a label: an axis that reaches it is all SI (1k .. 10M).
        if fmt is _fmt_comma and max(abs(self.lo), abs(self.hi)) >= 1e7:
            self.fmt = _fmt_si

    def _t(self, v):
        if self.log:
            return (math.log10(v) - self.e0) / (self.e1 - self.e0)
        return (v - self.lo) / (self.hi - self.lo)

    def px(self, v):
        return self.p0 + (self.p1 - self.p0) * self._t(v)

    def label(self, v):
        return self.fmt(v) if self.log else self._lin_label(v)

    def ticks(self, min_label_gap):
        """Major ticks with labels (thinned so labels sit at least min_label_gap px apart),
        minor ticks without (log axes: 2..9 in each decade)."""
        out = []
        if self.log:
            n = self.e1 - self.e0
            per_decade = abs(self.p1 - self.p0) / n
            every = max(1, math.ceil(min_label_gap / per_decade)) if per_decade > 0 else 1
            for e in range(self.e0, self.e1 + 1):
                lab = self.fmt(10.0 ** e) if (e - self.e0) % every == 0 else None
                out.append((10.0 ** e, lab, True))
                if e == self.e1 or per_decade < 40:
                    continue
                # With a single decade, label 2 and 5 too so the axis is readable.
                for m in range(2, 10):
                    v = m * 10.0 ** e
                    lab = self.fmt(v) if (n == 1 and m in (2, 5)) else None
                    out.append((v, lab, False))
        else:
            count = self.i1 - self.i0
            per = abs(self.p1 - self.p0) / max(1, count)
            every = max(1, math.ceil(min_label_gap / per)) if per > 0 else 1
            for i in range(self.i0, self.i1 + 1):
                v = i * self.step
                if abs(v) < self.step * 1e-9:
                    v = 0.0
                lab = self._lin_label(v) if (i - self.i0) % every == 0 else None
                out.append((v, lab, True))
        return out

    def _lin_label(self, v):
        d = max(0, -math.floor(math.log10(self.step) + 1e-9))
        if self.step * 10 ** d != round(self.step * 10 ** d):  # e.g. step 2.5
            d += 1
        if self.fmt is _fmt_comma:
            return "{:,.{}f}".format(v, d)
        if abs(v) >= 1e3 and self.step >= 100:
            return _fmt_si(v)
        return "%.*f" % (d, v)


def _log_range(vals):
    vals = [v for v in vals if v > 0]
    if not vals:
        return 0, 1
    e0 = math.floor(math.log10(min(vals)) + 1e-12)
    e1 = math.ceil(math.log10(max(vals)) - 1e-12)
    if e1 <= e0:  # one value, a power of ten: put it in the middle
        e0, e1 = e0 - 1, e0 + 1
    return e0, e1


def _nice_step(span, target=6):
    raw = span / target
    mag = 10.0 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * mag >= raw * 0.999:
            return m * mag
    return 10 * mag


def _lin_range(vals):
    if not vals:
        return (0.0, 1.0, 0.2)
    lo, hi = min(vals), max(vals)
    # Start from zero when the data are all positive and not far from it.
    if lo > 0 and lo < 0.5 * hi:
        lo = 0.0
    if hi < 0 and hi > 0.5 * lo:
        hi = 0.0
    if hi == lo:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    step = _nice_step(hi - lo)
    i0 = math.floor(lo / step + 1e-9)
    i1 = math.ceil(hi / step - 1e-9)
    if i1 <= i0:
        i1 = i0 + 1
    return (i0 * step, i1 * step, step)


# --- the plot ----------------------------------------------------------------------------------

def plot(path, title, xlabel, ylabel, series, logx=True, logy=True, width=820, height=520,
         notes=()):
    """series: list of dicts {"label": str, "points": [(x, y), ...], "style": "line"|"points"|"both",
    optional "dash": bool, optional "color": "#rrggbb"}. Writes an SVG file at path.

    Axis ranges cover every series' points, padded to whole decades (log axes) or nice round
    numbers (linear). Points that a log axis cannot show (zero, negative) and non-finite
    values are left out. `height` is that of the plot; each line of `notes` (small grey text
    under it, wrapped at spaces to fit) makes the image taller. Returns the SVG text.
    """
    series = list(series)
    notes = [str(n) for n in notes]

    # Clean points: drop what an axis cannot show.
    def usable(v, log):
        return isinstance(v, (int, float)) and math.isfinite(v) and (v > 0 or not log)

    cleaned = []
    for i, s in enumerate(series):
        pts = [(float(x), float(y)) for x, y in s.get("points", ())
               if usable(x, logx) and usable(y, logy)]
        style = s.get("style", "line")
        if style not in ("line", "points", "both"):
            raise ValueError("series %r: style must be line, points or both, not %r"
                             % (s.get("label"), style))
        cleaned.append({
            "label": str(s.get("label", "")),
            "points": pts,
            "style": style,
            "dash": bool(s.get("dash", False)),
            "color": s.get("color") or PALETTE[i % len(PALETTE)],
        })

    xs = [x for s in cleaned for x, _ in s["points"]]
    ys = [y for s in cleaned for _, y in s["points"]]
    xfmt, yfmt = _fmt_si, _fmt_comma
    xr = _log_range(xs) if logx else _lin_range(xs)
    yr = _log_range(ys) if logy else _lin_range(ys)

    # Layout. The y-tick label width decides the left margin, so build the y axis first with
    # provisional pixels, measure its labels, then fix the geometry.
    W = width
    top = 20 + (TITLE_SIZE + 18 if title else 0)
    bottom_axis = 8 + TICK_SIZE + 10 + (LABEL_SIZE + 8 if xlabel else 0) + 6
    plot_bottom = height - bottom_axis
    yax = _Axis(yr, logy, yfmt, plot_bottom, top)
    ylabels = [lab for _, lab, _ in yax.ticks(TICK_SIZE * 1.6) if lab]
    ylab_w = max([_text_width(l, TICK_SIZE) for l in ylabels] + [0])
    left = 14 + (LABEL_SIZE + 12 if ylabel else 0) + ylab_w + 10
    left = max(left, 56)

    xax = _Axis(xr, logx, xfmt, 0, 1)
    last_lab = xax.label(xax.hi)
    right = max(24, _text_width(last_lab, TICK_SIZE) / 2 + 10)
    x0, x1 = left, W - right
    xax = _Axis(xr, logx, xfmt, x0, x1)
    y0, y1 = plot_bottom, top  # pixel rows of the y range's low and high ends

    note_lines = []
    for n in notes:
        note_lines.extend(_wrap(n, W - 2 * 14, NOTE_SIZE))
    H = height + (len(note_lines) * NOTE_LINE + 8 if note_lines else 0)

    out = []
    a = out.append
    a('<?xml version="1.0" encoding="UTF-8"?>\n')
    a('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
      'font-family="%s" text-rendering="geometricPrecision">\n' % (W, H, W, H, FONT))
    if title:
        a('<title>%s</title>\n' % _esc(title))
    a('<rect x="0" y="0" width="%d" height="%d" fill="#ffffff"/>\n' % (W, H))

    # Grid and ticks.
    xticks = xax.ticks(max([_text_width(l or "", TICK_SIZE) for _, l, _ in
                            xax.ticks(0)] + [0]) + 14)
    yticks = yax.ticks(TICK_SIZE * 1.6)
    a('<g stroke-width="1" shape-rendering="crispEdges">\n')
    for grid_major in (False, True):  # minor lines first, under the major ones
        color = GRID_MAJOR if grid_major else GRID_MINOR
        for v, _, major in xticks:
            if major == grid_major:
                px = xax.px(v)
                a('<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s"/>\n'
                  % (_num(px), _num(y1), _num(px), _num(y0), color))
        for v, _, major in yticks:
            if major == grid_major:
                py = yax.px(v)
                a('<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s"/>\n'
                  % (_num(x0), _num(py), _num(x1), _num(py), color))
    # Plot frame and tick marks (outside the frame).
    a('<rect x="%s" y="%s" width="%s" height="%s" fill="none" stroke="%s"/>\n'
      % (_num(x0), _num(y1), _num(x1 - x0), _num(y0 - y1), AXIS_COLOR))
    for v, _, major in xticks:
        px = xax.px(v)
        a('<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s"/>\n'
          % (_num(px), _num(y0), _num(px), _num(y0 + (6 if major else 3)), AXIS_COLOR))
    for v, _, major in yticks:
        py = yax.px(v)
        a('<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s"/>\n'
          % (_num(x0 - (6 if major else 3)), _num(py), _num(x0), _num(py), AXIS_COLOR))
    a('</g>\n')

    # Tick labels.
    a('<g font-size="%d" fill="%s">\n' % (TICK_SIZE, TEXT_COLOR))
    for v, lab, _ in xticks:
        if lab:
            a('<text x="%s" y="%s" text-anchor="middle">%s</text>\n'
              % (_num(xax.px(v)), _num(y0 + 8 + TICK_SIZE), _esc(lab)))
    for v, lab, _ in yticks:
        if lab:
            a('<text x="%s" y="%s" text-anchor="end">%s</text>\n'
              % (_num(x0 - 9), _num(yax.px(v) + TICK_SIZE * 0.35), _esc(lab)))
    a('</g>\n')

    # Axis labels and title.
    if xlabel:
        a('<text x="%s" y="%s" font-size="%d" fill="%s" text-anchor="middle">%s</text>\n'
          % (_num((x0 + x1) / 2), _num(y0 + 8 + TICK_SIZE + 10 + LABEL_SIZE + 2), LABEL_SIZE,
             TEXT_COLOR, _esc(xlabel)))
    if ylabel:
        cx, cy = 14 + LABEL_SIZE, (y0 + y1) / 2
        a('<text x="%s" y="%s" font-size="%d" fill="%s" text-anchor="middle" '
          'transform="rotate(-90 %s %s)">%s</text>\n'
          % (_num(cx), _num(cy), LABEL_SIZE, TEXT_COLOR, _num(cx), _num(cy), _esc(ylabel)))
    if title:
        a('<text x="%s" y="%s" font-size="%d" font-weight="bold" fill="%s" '
          'text-anchor="middle">%s</text>\n'
          % (_num((x0 + x1) / 2), _num(20 + TITLE_SIZE), TITLE_SIZE, TEXT_COLOR, _esc(title)))

    # Data: lines first, then markers on top.
    def pix(p):
        return (xax.px(p[0]), yax.px(p[1]))

    a('<g fill="none" stroke-linejoin="round" stroke-linecap="round">\n')
    for s in cleaned:
        if s["style"] in ("line", "both") and len(s["points"]) >= 2:
            coords = " ".join("%s,%s" % (_num(px), _num(py)) for px, py in map(pix, s["points"]))
            dash = ' stroke-dasharray="%s"' % DASH if s["dash"] else ""
            a('<polyline points="%s" stroke="%s" stroke-width="%s"%s/>\n'
              % (coords, _esc(s["color"]), LINE_W, dash))
    a('</g>\n')
    a('<g stroke="#ffffff" stroke-width="1.2">\n')
    for s in cleaned:
        if s["style"] in ("points", "both") or len(s["points"]) == 1:
            for px, py in map(pix, s["points"]):
                a('<circle cx="%s" cy="%s" r="%s" fill="%s"/>\n'
                  % (_num(px), _num(py), _num(MARKER_R + (0.4 if s["style"] == "points" else 0)),
                     _esc(s["color"])))
    a('</g>\n')

    # Legend: whichever inside corner covers the fewest data pixels (ties: top-left first).
    shown = [s for s in cleaned if s["label"]]
    if shown:
        row = LEGEND_SIZE + 8
        sample_w = 26
        lw = 10 + sample_w + 8 + max(_text_width(s["label"], LEGEND_SIZE) for s in shown) + 12
        lh = 8 + row * len(shown) + 2
        inset = 10
        corners = [
            (x0 + inset, y1 + inset),            # top-left
            (x1 - inset - lw, y1 + inset),       # top-right
            (x0 + inset, y0 - inset - lh),       # bottom-left
            (x1 - inset - lw, y0 - inset - lh),  # bottom-right
        ]
        samples = []
        for s in cleaned:
            pp = [pix(p) for p in s["points"]]
            samples.extend(pp)
            if s["style"] in ("line", "both"):
                for (ax_, ay), (bx, by) in zip(pp, pp[1:]):
                    n = max(1, int(math.hypot(bx - ax_, by - ay) / 4))
                    samples.extend((ax_ + (bx - ax_) * k / n, ay + (by - ay) * k / n)
                                   for k in range(1, n))

        def covered(c):
            lx, ly = c
            m = 4
            return sum(1 for px, py in samples
                       if lx - m <= px <= lx + lw + m and ly - m <= py <= ly + lh + m)

        lx, ly = min(corners, key=covered)  # min() keeps the first of equals: top-left
        a('<g font-size="%d" fill="%s">\n' % (LEGEND_SIZE, TEXT_COLOR))
        a('<rect x="%s" y="%s" width="%s" height="%s" rx="3" fill="#ffffff" '
          'fill-opacity="0.92" stroke="#bbbbbb"/>\n' % (_num(lx), _num(ly), _num(lw), _num(lh)))
        for k, s in enumerate(shown):
            cy = ly + 8 + row * k + row / 2 - 1
            sx0, sx1 = lx + 10, lx + 10 + sample_w
            if s["style"] in ("line", "both"):
                dash = ' stroke-dasharray="%s"' % DASH if s["dash"] else ""
                a('<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="%s"%s/>\n'
                  % (_num(sx0), _num(cy), _num(sx1), _num(cy), _esc(s["color"]), LINE_W, dash))
            if s["style"] in ("points", "both"):
                a('<circle cx="%s" cy="%s" r="%s" fill="%s" stroke="#ffffff" '
                  'stroke-width="1.2"/>\n'
                  % (_num((sx0 + sx1) / 2), _num(cy), _num(MARKER_R + 0.4), _esc(s["color"])))
            a('<text x="%s" y="%s">%s</text>\n'
              % (_num(sx1 + 8), _num(cy + LEGEND_SIZE * 0.35), _esc(s["label"])))
        a('</g>\n')

    # Notes under the plot.
    if note_lines:
        a('<g font-size="%d" fill="%s">\n' % (NOTE_SIZE, NOTE_COLOR))
        for k, line in enumerate(note_lines):
            a('<text x="14" y="%s" xml:space="preserve">%s</text>\n'
              % (_num(height + 4 + NOTE_LINE * k + NOTE_SIZE), _esc(line)))
        a('</g>\n')

    a('</svg>\n')
    svg = "".join(out)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(svg)
    return svg


# --- demo --------------------------------------------------------------------------------------

def _demo(path="/tmp/svgplot-demo.svg"):
    # A model of launch time over nodes (ms): a fixed start-up plus a per-node cost, and
    # "measured" points scattered around it by fixed factors (deterministic).
    def model(n):
        return 4.0 + 1.21 * n

    grid = [10 * 10 ** (k / 20) for k in range(81)]  # 10 .. 100,000, log-spaced
    measured_n = [16, 32, 64, 128, 256, 512, 1024]
    wobble = [1.35, 1.12, 0.94, 1.05, 0.97, 1.03, 1.01]
    plot(path, "Launch time against nodes (demo)", "nodes (fake, one rank each)",
         "wall time (ms)", [
             {"label": "rlaunch, measured (median of 7)",
              "points": [(n, model(n) * w) for n, w in zip(measured_n, wobble)],
              "style": "points"},
             {"label": "model: 4 ms + 1.21 ms/node", "points": [(n, model(n)) for n in grid],
              "style": "line", "dash": True},
         ], notes=["made by: python3 bench/svgplot.py (demo data, not a measurement) & <check "
                   "escaping>"])
    return path


if __name__ == "__main__":
    print(_demo())
