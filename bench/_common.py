"""Shared helpers of the benchmarks: machine description, quietness, writing docs/BENCHMARKS.md sections."""

from __future__ import annotations

import os
import platform
import re
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH_MD = ROOT / "docs" / "BENCHMARKS.md"


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
        isa = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8") if f" {f}" in flags]
    except (OSError, StopIteration):
        isa = []
    return (f"{cpu}, {os.cpu_count()} cores ({', '.join(isa) or 'no AVX2'}), {platform.system()} "
            f"{platform.machine()}, Python {platform.python_version()}")


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} cores"


def write_section(name: str, body: str) -> None:
    """Replace (or append) the section between `<!-- bench:NAME -->` markers in docs/BENCHMARKS.md."""
    BENCH_MD.parent.mkdir(exist_ok=True)
    text = BENCH_MD.read_text() if BENCH_MD.exists() else (
        "# Benchmarks\n\nEvery figure here was measured by a script in `bench/` on the machine and date it "
        "names; ratios are measured in one interleaved run. Re-run a script to refresh its section.\n")
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{start}\n{body.rstrip()}\n{end}"
    if start in text:
        text = re.sub(re.escape(start) + ".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    BENCH_MD.write_text(text)


def stamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def md_table(rows: list[dict], cols: list[tuple[str, str]]) -> str:
    out = ["| " + " | ".join(h for _, h in cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(r.get(k, "")) for k, _ in cols) + " |")
    return "\n".join(out)
