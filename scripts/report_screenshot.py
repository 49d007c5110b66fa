#!/usr/bin/env python3
"""Render the HTML report of a results database and screenshot it in headless Chromium.

    .venv/bin/python scripts/report_screenshot.py [--db edgeopt-results.db] [--out report.png]

Checks the PNG is not blank (the table header and several plot colours are present) and exits 1
when it is; look at the PNG yourself too.  Needs Debian's ``chromium`` (apt-get install chromium).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"


def screenshot(html: Path, png: Path, size: str = "1400,1800") -> None:
    """Headless Chromium, no network, a throw-away profile."""
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                        "--disable-background-networking", "--disable-component-update", "--disable-sync",
                        f"--user-data-dir={profile}", f"--screenshot={png}", f"--window-size={size}",
                        html.resolve().as_uri()], check=True, capture_output=True, timeout=120)


def distinct_colours(png: Path) -> int:
    import matplotlib.image as mpimg
    import numpy as np

    img = (mpimg.imread(png)[..., :3] * 255).round().astype(np.uint32).reshape(-1, 3)
    return len(np.unique((img[:, 0] << 16) | (img[:, 1] << 8) | img[:, 2]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--db", default="edgeopt-results.db")
    p.add_argument("--out", default="report.png")
    p.add_argument("--html", default=None, help="keep the HTML here (default: next to --out)")
    args = p.parse_args(argv)
    if not Path(CHROMIUM).exists():
        print(f"{CHROMIUM} not found: apt-get install chromium", file=sys.stderr)
        return 2
    from edgeopt.cli import main as edgeopt

    html = Path(args.html or Path(args.out).with_suffix(".html"))
    rc = edgeopt(["report", "--db", args.db, "--format", "html", "--output", str(html)])
    if rc:
        return rc
    screenshot(html, Path(args.out))
    n = distinct_colours(Path(args.out))
    print(f"{args.out}: {n} distinct colours")
    return 0 if n > 50 else 1


if __name__ == "__main__":
    sys.exit(main())
