"""HTML layouts and screenshots in headless Chromium (Debian's ``chromium``
package), for the mail's golden renders.

- :func:`chromium` - the browser's path, or None (tests skip with the reason).
- :func:`shoot` - render an HTML file at a window width into a PNG: Chromium
  draws a ``width x max_height`` page, the blank rows below the content are
  cut and the picture is stored with a 64-colour palette (a few tens of KiB).
- :func:`layout` - the page's boxes as Chromium lays them out (CSS px), and
  :func:`layout_differences` - what differs from a stored layout beyond a
  tolerance that survives other fonts and Chromium versions (text wraps one
  line more or less; widths and positions across the page do not change).

The mail's ``cid:`` image reference is replaced by a ``file://`` path to the
chart PNG beside the HTML, as a mail client shows the inline part.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

CHROMIUM_NAMES = ("chromium", "chromium-browser")
PALETTE_COLOURS = 64


def chromium() -> str | None:
    for name in CHROMIUM_NAMES:
        p = shutil.which(name)
        if p:
            return p
    return None


#: Chromium's headless window is at least this wide: a narrower page is drawn in a frame
MIN_WINDOW_PX = 500


def _framed(html_path: Path, width: int, height: int, script: str = "") -> Path:
    """A page beside ``html_path`` that shows it in a ``width x height`` px
    frame at the top left (``srcdoc``: same origin, relative image paths
    resolve beside ``html_path``), then runs ``script`` (``frame``: the
    frame element) once the frame has loaded."""
    import html as html_mod

    page = html_path.with_name(html_path.stem + f".framed-{width}.html")
    page.write_text(
        '<!DOCTYPE html><html><head><meta charset="utf-8"></head>'
        '<body style="margin:0;background:#fff">'
        f'<iframe id="frame" style="border:0;display:block;width:{width}px;height:{height}px" '
        f'srcdoc="{html_mod.escape(html_path.read_text(), quote=True)}"></iframe>'
        f'<script>var frame = document.getElementById("frame"); frame.onload = function () {{ {script} }};</script>'
        '</body></html>')
    return page


def _argv(exe: str, page: Path, width: int, height: int, profile: Path, *extra: str) -> list[str]:
    return [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--force-device-scale-factor=1", "--default-background-color=ffffffff",
            f"--window-size={max(width, MIN_WINDOW_PX)},{height}", "--user-data-dir=" + str(profile),
            *extra, page.resolve().as_uri()]


def shoot(html_path: Path, out_png: Path, width: int, max_height: int = 4000, dark: bool = False,
          timeout_s: float = 90.0) -> Path:
    """Screenshot ``html_path`` at ``width`` CSS px (device scale 1) into
    ``out_png``, trimmed and palette-quantised (see the module doc).

    Raises:
        RuntimeError: Chromium failed or wrote no picture (its stderr inside).
    """
    from PIL import Image

    exe = chromium()
    if exe is None:
        raise RuntimeError("chromium not installed (apt-get install -y chromium)")
    raw = html_path.with_name(html_path.stem + f".{width}.raw.png")
    extra = [f"--screenshot={raw}"]
    if dark:
        extra += ["--force-dark-mode", "--blink-settings=preferredColorScheme=0"]
    page = _framed(html_path, width, max_height)
    cp = subprocess.run(_argv(exe, page, width, max_height, html_path.parent / ".chromium-profile", *extra),
                        capture_output=True, text=True, timeout=timeout_s)
    if not raw.exists():
        raise RuntimeError(f"chromium wrote no screenshot (exit {cp.returncode}): {cp.stderr[-2000:]}")
    img = Image.open(raw).convert("RGB").crop((0, 0, width, max_height))
    raw.unlink()
    bg = img.getpixel((img.width - 1, img.height - 1))
    # last row that holds anything but the page background
    bottom = img.height
    px = img.load()
    while bottom > 1 and all(px[x, bottom - 1] == bg for x in range(0, img.width, 2)):
        bottom -= 1
    img = img.crop((0, 0, img.width, min(img.height, bottom + 8)))
    img.quantize(colors=PALETTE_COLOURS, method=Image.Quantize.MEDIANCUT).save(out_png, optimize=True)
    return out_png


#: the elements whose boxes make the layout (the mail's blocks, rows and picture)
LAYOUT_SELECTOR = "body > div, h1, h2, h3, p, table, tr, img, pre"
_LAYOUT_JS = """
  var doc = frame.contentDocument, out = [];
  doc.querySelectorAll(%s).forEach(function (e) {
    var r = e.getBoundingClientRect();
    out.push([e.tagName.toLowerCase(), Math.round(r.left), Math.round(r.width), Math.round(r.top),
              Math.round(r.height)]);
  });
  var d = doc.documentElement;
  var pre = document.createElement("pre");
  pre.id = "gsrun-layout";
  pre.textContent = JSON.stringify({boxes: out, scroll_width: d.scrollWidth, height: d.scrollHeight});
  document.body.appendChild(pre);
"""


def layout(html_path: Path, width: int, height: int = 4000, timeout_s: float = 90.0) -> dict:
    """The layout of ``html_path`` in headless Chromium in a ``width x
    height`` px frame -> ``{"boxes": [[tag, x, width, y, height], ...],
    "scroll_width": px, "height": px}`` (CSS px, document order, the
    elements of :data:`LAYOUT_SELECTOR`); ``--dump-dom`` prints what a
    script measured once the frame loaded.

    Raises:
        RuntimeError: Chromium failed or printed no layout (its stderr inside).
    """
    import json
    import re

    exe = chromium()
    if exe is None:
        raise RuntimeError("chromium not installed (apt-get install -y chromium)")
    page = _framed(html_path, width, height, _LAYOUT_JS % json.dumps(LAYOUT_SELECTOR))
    cp = subprocess.run(_argv(exe, page, width, height, html_path.parent / ".chromium-profile", "--dump-dom"),
                        capture_output=True, text=True, timeout=timeout_s)
    m = re.search(r'<pre id="gsrun-layout">(.*?)</pre>', cp.stdout, re.S)
    if not m:
        raise RuntimeError(f"chromium printed no layout (exit {cp.returncode}): {cp.stderr[-2000:]}")
    return json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<")
                      .replace("&gt;", ">"))


#: how far a box may move or grow before the layout counts as changed (CSS px):
#: across the page a box keeps its place within ``X_TOL_PX``; a box as wide as
#: its content (a table narrower than the page) may be ``FIT_WIDTH_TOL`` wider
#: or narrower (DejaVu Sans sets text ~15 % wider than Liberation Sans); a block
#: of text may take ``LINES_TOL`` lines more or fewer (other fonts wrap
#: elsewhere), or ``HEIGHT_TOL`` of its height, whichever is more
X_TOL_PX = 16
FIT_WIDTH_TOL = 0.25
LINE_PX = 22
LINES_TOL = 2
HEIGHT_TOL = 0.25


def layout_differences(got: dict, want: dict, width: int) -> list[str]:
    """What differs between two :func:`layout` results beyond the tolerances
    above, one line each ([] = the same layout): the sequence of boxes, each
    box's left edge and width, each box's height, the page's height, and any
    horizontal overflow of the ``width`` px window (never tolerated)."""
    out: list[str] = []
    if got["scroll_width"] > width:
        out.append(f"the page is {got['scroll_width']} px wide in a {width} px window (horizontal scrolling)")
    tags_got = [b[0] for b in got["boxes"]]
    tags_want = [b[0] for b in want["boxes"]]
    if tags_got != tags_want:
        out.append(f"the blocks differ: {len(tags_got)} boxes {tags_got[:12]}... against {len(tags_want)} "
                   f"{tags_want[:12]}...")
        return out
    page_w = want["boxes"][0][2] if want["boxes"] else width
    for i, (g, w) in enumerate(zip(got["boxes"], want["boxes"])):
        tag, gx, gw, _gy, gh = g
        _t, wx, ww, _wy, wh = w
        width_tol = X_TOL_PX if ww >= page_w - X_TOL_PX else max(X_TOL_PX, FIT_WIDTH_TOL * ww)
        if abs(gx - wx) > X_TOL_PX or abs(gw - ww) > width_tol:
            out.append(f"box {i} <{tag}>: x {gx} width {gw} px, stored x {wx} width {ww} px")
        if abs(gh - wh) > max(LINES_TOL * LINE_PX, HEIGHT_TOL * wh):
            out.append(f"box {i} <{tag}>: height {gh} px, stored {wh} px")
    if abs(got["height"] - want["height"]) > max(LINES_TOL * LINE_PX, HEIGHT_TOL * want["height"]):
        out.append(f"page height {got['height']} px, stored {want['height']} px")
    return out
