"""HTML screenshots in headless Chromium (Debian's ``chromium`` package) and
a tolerant comparison with stored PNGs (Pillow), for the mail's golden renders.

- :func:`chromium` - the browser's path, or None (tests skip with the reason).
- :func:`shoot` - render an HTML file at a window width into a PNG: Chromium
  draws a ``width x max_height`` page, the blank rows below the content are
  cut and the picture is stored with a 64-colour palette (a few tens of KiB).
- :func:`diff_ratio` - share (0..1) of pixels whose colour differs by more
  than ``channel_tol`` in any channel; 1.0 when the sizes differ.

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
    raw = out_png.with_suffix(".raw.png")
    argv = [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--force-device-scale-factor=1", "--default-background-color=ffffffff",
            f"--screenshot={raw}", f"--window-size={width},{max_height}", "--user-data-dir=" + str(
                out_png.parent / ".chromium-profile")]
    if dark:
        argv.append("--force-dark-mode")
        argv.append("--blink-settings=preferredColorScheme=0")
    argv.append(html_path.resolve().as_uri())
    cp = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    if not raw.exists():
        raise RuntimeError(f"chromium wrote no screenshot (exit {cp.returncode}): {cp.stderr[-2000:]}")
    img = Image.open(raw).convert("RGB")
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


def diff_ratio(a_png: Path, b_png: Path, channel_tol: int = 48) -> float:
    """Share of pixels differing by more than ``channel_tol`` (0-255) in a channel."""
    from PIL import Image, ImageChops

    a = Image.open(a_png).convert("RGB")
    b = Image.open(b_png).convert("RGB")
    if a.size != b.size:
        return 1.0
    diff = ImageChops.difference(a, b).convert("L").point(lambda v: 255 if v > channel_tol // 3 else 0)
    hist = diff.histogram()
    return hist[255] / float(a.width * a.height)
