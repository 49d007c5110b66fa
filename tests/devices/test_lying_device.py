"""A device that lies, a store that is tampered with, a read-only root, a results database that fills
(issue 38), each on a real device behind a real sshd on 127.0.0.1.

The lying agent is the device's ``python:``: a wrapper that runs the real agent and rewrites one verb's
reply (every float NaN, numbers x10^400, every number negated, the result a string, a 200 000-deep list).
The host refuses that device's reply in one line naming the field; the other device's run is printed and
stored; nothing of the lie is stored as ok."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from edgeopt.deploy import agent_package

from .conftest import device_entry, known_hosts, write_inventory

FAST = ["--duration", "0.2", "--min-iters", "5", "--warmup", "1"]

LIAR = r'''#!{python}
import json, os, re, subprocess, sys
MODE, VERB = {mode!r}, {verb!r}
args = sys.argv[1:]
i = args.index("-m") if "-m" in args else -1
if i < 0 or args[i + 1:i + 3] != ["edgeopt_agent", VERB]:
    os.execv(sys.executable, [sys.executable, *args])
if MODE == "install-noop":  # says the repair is in place without doing anything
    sys.stdin.read()
    print(json.dumps({{"schema": 1, "agent": "0", "verb": VERB, "ok": True, "install": {{"present": True}}}}))
    sys.exit(0)
p = subprocess.run([sys.executable, *args], stdin=sys.stdin, capture_output=True, text=True)
reply = json.loads(p.stdout.strip().splitlines()[-1])

def walk(x, f):
    if isinstance(x, dict):
        return {{k: walk(v, f) for k, v in x.items()}}
    if isinstance(x, list):
        return [walk(v, f) for v in x]
    return f(x)

num = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)
body = reply.get(VERB)
if MODE == "nan":
    reply[VERB] = walk(body, lambda x: float("nan") if isinstance(x, float) else x)
elif MODE == "negate":
    reply[VERB] = walk(body, lambda x: -x if num(x) else x)
elif MODE == "string":
    reply[VERB] = "fast"
elif MODE == "has-string":
    reply["has"] = {{k: "yes" for k in reply["has"]}}
text = json.dumps(reply)
if MODE == "huge":
    text = re.sub(r'(": -?\d+\.\d+)', r'\1e400', text)
elif MODE == "deep":
    text = text.replace('"' + VERB + '": {{', '"' + VERB + '": ' + "[" * 200000 + "]" * 200000 + ', "x": {{', 1)
sys.stdout.write(text + "\n")
sys.exit(p.returncode)
'''


def liar(tmp_path: Path, mode: str, verb: str = "bench") -> str:
    path = tmp_path / f"liar-{mode}"
    path.write_text(LIAR.format(python=sys.executable, mode=mode, verb=verb))
    path.chmod(0o755)
    return str(path)


def _edgeopt(tmp_path: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    # the report's rows are read at an 80-column width (the model column dropped first): said here, not taken
    # from whatever COLUMNS the runner's environment had (a test that monkeypatches COLUMNS unsets it after)
    return subprocess.run([sys.executable, "-m", "edgeopt", *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "80"})


@pytest.mark.parametrize("mode, field", [
    ("nan", "bare NaN"), ("huge", "overflows a float"), ("negate", "cannot be negative"),
    ("string", "bench = \"fast\" (must be an object)"), ("deep", "nests deeper than 64 levels")])
def test_a_lying_device_is_refused_in_one_line_and_the_good_one_is_printed_and_stored(ssh_env, sshd, tmp_path,
                                                                                     cls_bundle, mode, field):
    kh = known_hosts(tmp_path / "kh", sshd)
    write_inventory(tmp_path / "inv.yaml", {
        "good": device_entry(ssh_env, sshd, tmp_path / "r-good", kh, target="cpu"),
        "liar": device_entry(ssh_env, sshd, tmp_path / "r-liar", kh, target="cpu", python=liar(tmp_path, mode))})
    db = tmp_path / "results.db"
    p = _edgeopt(tmp_path, "bench", "--dist", str(cls_bundle), "--devices", "inv.yaml", "--db", str(db), *FAST)
    out = p.stdout + p.stderr
    assert p.returncode == 4 and "Traceback" not in out, out[-3000:]
    assert "liar: the agent's bench reply is not believable:" in out and field in out, out[-3000:]
    good_line = [ln for ln in p.stdout.splitlines() if ln.startswith("good")]
    assert good_line and "ms" in p.stdout, p.stdout  # the good device's measurement is printed
    rows = {r[0]: r for r in sqlite3.connect(db).execute("SELECT device, status, p50_ms, json FROM runs")}
    assert rows["good"][1] == "ok" and rows["good"][2] > 0
    assert rows["liar"][1] == "refused" and rows["liar"][2] is None
    stored = json.loads(rows["liar"][3])
    assert stored["bench"] is None and "not believable" in stored["error"]["message"]
    for _dev, _status, _p50, text in rows.values():  # standard JSON only: no bare NaN/Infinity stored
        json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} stored"))
    # the report reads the database without a traceback, and ships nothing of the liar's
    r = _edgeopt(tmp_path, "report", "--db", str(db))
    assert r.returncode == 0 and "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
    (row,) = [ln for ln in r.stdout.splitlines() if ln.startswith("cpu") and " liar " in ln]
    assert "refused" in row and "SHIP" not in row and " -" not in row, r.stdout
    assert "batch 1 on liar: no SHIP" in r.stdout, r.stdout


def test_a_has_reply_that_cannot_be_true_fails_that_device_in_one_line(ssh_env, sshd, tmp_path, cls_bundle):
    kh = known_hosts(tmp_path / "kh", sshd)
    write_inventory(tmp_path / "inv.yaml", {
        "good": device_entry(ssh_env, sshd, tmp_path / "r-good", kh, target="cpu"),
        "liar": device_entry(ssh_env, sshd, tmp_path / "r-liar", kh, target="cpu",
                             python=liar(tmp_path, "has-string", "has"))})
    p = _edgeopt(tmp_path, "push", "--dist", str(cls_bundle), "--devices", "inv.yaml")
    out = p.stdout + p.stderr
    assert p.returncode == 4 and "Traceback" not in out, out[-3000:]
    assert "liar: the agent's has reply is not believable: has." in out and "must be true or false" in out, out
    assert (tmp_path / "r-good" / "store").is_dir() and not (tmp_path / "r-liar" / "store").exists()


def _store_file(root: Path) -> Path:
    (entry,) = [p for p in (root / "store").iterdir() if len(p.name) == 64]
    return next(p for p in sorted(entry.rglob("*")) if p.is_file() and p.name != "manifest.json"
                and p.stat().st_size > 1000)


def test_push_verify_replaces_a_store_file_swapped_for_a_link_and_verifies_again(ssh_env, sshd, tmp_path,
                                                                                cls_bundle):
    root = tmp_path / "root"
    kh = known_hosts(tmp_path / "kh", sshd)
    write_inventory(tmp_path / "inv.yaml", {"dev": device_entry(ssh_env, sshd, root, kh, target="cpu")})
    assert _edgeopt(tmp_path, "push", "--dist", str(cls_bundle), "--devices", "inv.yaml").returncode == 0
    victim = _store_file(root)
    outside = tmp_path / "outside.bin"
    shutil.copyfile(victim, outside)  # identical bytes, outside the root
    victim.chmod(0o644)
    victim.unlink()
    victim.symlink_to(outside)
    # bench refuses the tampered entry (never follows the link), with the repair in its message
    b = _edgeopt(tmp_path, "bench", "--dist", str(cls_bundle), "--devices", "inv.yaml", "--db", "r.db", *FAST)
    assert b.returncode == 4 and "symlink" in b.stdout + b.stderr and "push --verify" in b.stdout + b.stderr, \
        b.stdout + b.stderr
    p = _edgeopt(tmp_path, "push", "--verify", "--dist", str(cls_bundle), "--devices", "inv.yaml")
    out = p.stdout + p.stderr
    assert p.returncode == 0 and "repaired" in out and "Traceback" not in out, out
    assert not victim.is_symlink() and victim.is_file() and outside.read_bytes() == victim.read_bytes()
    assert oct(outside.stat().st_mode & 0o777) == "0o644"  # what the link pointed at was never touched
    b = _edgeopt(tmp_path, "bench", "--dist", str(cls_bundle), "--devices", "inv.yaml", "--db", "r.db", *FAST)
    assert b.returncode == 0, b.stdout + b.stderr
    # a device whose install says "present" without repairing: verified again, and the push fails (exit 4)
    victim.chmod(0o644)
    victim.unlink()
    victim.symlink_to(outside)
    write_inventory(tmp_path / "inv.yaml", {"dev": device_entry(ssh_env, sshd, root, kh, target="cpu",
                                                                python=liar(tmp_path, "install-noop", "install"))})
    p = _edgeopt(tmp_path, "push", "--verify", "--dist", str(cls_bundle), "--devices", "inv.yaml")
    out = p.stdout + p.stderr
    assert p.returncode == 4 and "still corrupted on the device after the repair" in out, out
    assert "Traceback" not in out and victim.is_symlink()


def test_a_planted_pyc_in_the_agent_folder_is_removed_and_never_runs(ssh_env, sshd, tmp_path, cls_bundle):
    root, proof = tmp_path / "root", tmp_path / "proof"
    kh = known_hosts(tmp_path / "kh", sshd)
    write_inventory(tmp_path / "inv.yaml", {"dev": device_entry(ssh_env, sshd, root, kh, target="cpu")})
    assert _edgeopt(tmp_path, "push", "--dist", str(cls_bundle), "--devices", "inv.yaml").returncode == 0
    pkg = root / "agent" / agent_package().dirname / "edgeopt_agent"
    assert not list(pkg.rglob("*.pyc")), "the agent wrote a __pycache__ although it runs with -B"
    src = pkg / "verbs.py"
    evil = tmp_path / "evil.py"
    evil.write_text(src.read_text() + f"\nopen({str(proof)!r}, 'a').write('ran')\n")
    import marshal

    code = compile(evil.read_text(), str(src), "exec")
    st = src.stat()
    header = importlib.util.MAGIC_NUMBER + (0).to_bytes(4, "little") + int(st.st_mtime).to_bytes(4, "little") \
        + (st.st_size & 0xFFFFFFFF).to_bytes(4, "little")
    pyc = pkg / "__pycache__" / f"verbs.{sys.implementation.cache_tag}.pyc"
    pyc.parent.mkdir(exist_ok=True)
    pyc.write_bytes(header + marshal.dumps(code))  # matches the real source's mtime and size: Python would use it
    p = _edgeopt(tmp_path, "push", "--verify", "--dist", str(cls_bundle), "--devices", "inv.yaml")
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "cached .pyc the agent never writes" in out and "re-installing it" in out, out
    assert not proof.exists()  # the planted bytecode never ran
    assert not pyc.exists() and not list(pkg.rglob("*.pyc"))


def test_a_read_only_root_benches_what_it_already_holds(ssh_env, sshd, tmp_path, cls_bundle, small_fs):
    root = small_fs(40) / "edgeopt"
    write_inventory(tmp_path / "inv.yaml", {"dev": device_entry(ssh_env, sshd, root,
                                                                known_hosts(tmp_path / "kh", sshd), target="cpu")})
    assert _edgeopt(tmp_path, "push", "--dist", str(cls_bundle), "--devices", "inv.yaml").returncode == 0
    r = subprocess.run(["mount", "-o", "remount,ro", str(root.parent)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    p = _edgeopt(tmp_path, "bench", "--dist", str(cls_bundle), "--devices", "inv.yaml", "--db", "r.db", *FAST)
    out = p.stdout + p.stderr
    assert p.returncode == 0 and "Read-only file system" not in out and "Traceback" not in out, out[-2000:]
    for verb in (["--probe"], ["gc", "--dry-run"]):  # the other verbs that only read
        v = _edgeopt(tmp_path, "devices", *verb, "--devices", "inv.yaml")
        assert v.returncode == 0 and "Read-only" not in v.stdout + v.stderr, v.stdout + v.stderr


def test_a_results_database_that_fills_during_the_bench_keeps_the_measurement(tmp_path, cls_bundle, small_fs):
    fs = small_fs(1)
    db = fs / "results.db"
    env = {**os.environ, "EDGEOPT_AGENT_ROOT": str(tmp_path / "agent-root")}

    def fill_once_open() -> None:
        deadline = time.time() + 120
        while time.time() < deadline and not db.exists():
            time.sleep(0.01)
        time.sleep(0.2)  # the database is open and its schema written: now the disk fills
        with open(fs / "hog", "wb") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                return

    hog = threading.Thread(target=fill_once_open, daemon=True)
    hog.start()
    p = subprocess.run([sys.executable, "-m", "edgeopt", "bench", "--dist", str(cls_bundle), "--devices", "local",
                        "--db", str(db), *FAST], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    hog.join(10)
    out = p.stdout + p.stderr
    assert (fs / "hog").exists(), "the disk never filled: nothing was tested"
    assert p.returncode == 4 and "Traceback" not in out, out[-2000:]
    assert "ms" in p.stdout and " ok" in p.stdout, p.stdout  # the table is printed
    line = next(ln for ln in p.stderr.splitlines() if "could not be written" in ln)
    kept = Path(line.rsplit(" kept in ", 1)[1].split(" instead")[0])
    assert kept.parent == tmp_path and kept.is_file(), line  # beside the db was full: the working folder
    data = json.loads(kept.read_text())
    assert data["db"] == str(db) and "full" in data["error"]
    (rec,) = data["records"]
    assert rec["status"] == "ok" and rec["bench"]["latency_ms"]["p50"] > 0
