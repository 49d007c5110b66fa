"""Named baselines: the figures and rounds of a run, kept under a name (``edgeopt baseline ...``) so a gate
can compare a candidate against them when no baseline bundle is at hand (``--baseline results:NAME``).

A baseline is a set of entries, one per model × target × device: the per-round latency samples (the
candidate arm of a gate run, or a bench run's samples cut into blocks), headline figures (p50/p90/p99),
the accuracy summary and the device fingerprint (runtime versions, kernel, CPU, governor, threads).
They live in the results DB (table ``baselines``, created beside ``runs``) and export to / import from
a JSON file that can be committed next to the model.
"""

from __future__ import annotations

import difflib
import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np

from edgeopt import jsonsafe
from edgeopt.errors import UsageError

PREFIX = "results:"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS baselines (
    name TEXT NOT NULL, model TEXT NOT NULL, target TEXT NOT NULL, device TEXT NOT NULL,
    precision TEXT, bundle_id TEXT, created TEXT NOT NULL, source_run TEXT, json TEXT NOT NULL,
    PRIMARY KEY (name, model, target, device)
);
"""
_NAME_OK = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-/@+")


def _check_name(name: str) -> str:
    if not name or not set(name) <= _NAME_OK or len(name) > 100:
        raise UsageError(f"bad baseline name {name!r}", hint="letters, digits and _ . - / @ + (at most 100)")
    return name


class Baselines:
    """The ``baselines`` table of a results DB."""

    def __init__(self, path: str | Path, create: bool = True) -> None:
        from edgeopt.results import ResultsDB

        ResultsDB(path, create=create).close()  # refuses a missing DB when create=False, validates it
        from edgeopt.results_url import local_path

        self.conn = sqlite3.connect(str(local_path(path)), timeout=30)  # a server's: beside its spool
        self.conn.executescript(_SCHEMA)
        self.conn.commit()

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Baselines:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def names(self) -> list[str]:
        return [r[0] for r in self.conn.execute("SELECT DISTINCT name FROM baselines ORDER BY name")]

    def entries(self, name: str) -> list[dict[str, Any]]:
        rows = self.conn.execute("SELECT json FROM baselines WHERE name = ? ORDER BY model, target, device", (name,))
        return [json.loads(r[0]) for r in rows]

    def get(self, name: str) -> list[dict[str, Any]]:
        """The entries of ``name``; UsageError (did-you-mean) when there is no such baseline."""
        got = self.entries(name)
        if not got:
            known = self.names()
            close = difflib.get_close_matches(name, known, n=1)
            raise UsageError(f"no baseline named {name!r} in the results database" +
                             (f" (did you mean {close[0]!r}?)" if close else ""),
                             hint=("baselines: " + ", ".join(known)) if known else
                             "save one first: edgeopt baseline save NAME --from RUN_ID|latest")
        return got

    def put(self, name: str, entries: list[dict[str, Any]], force: bool = False) -> list[str]:
        """Store entries under ``name`` (all or nothing); an existing entry needs ``force``. Returns what was
        replaced."""
        _check_name(name)
        replaced = []
        with self.conn:
            for e in entries:
                key = (name, e["model"], e["target"], e["device"])
                if self.conn.execute("SELECT 1 FROM baselines WHERE name=? AND model=? AND target=? AND device=?",
                                     key).fetchone():
                    if not force:
                        raise UsageError(f"baseline {name!r} already has {e['model']} / {e['target']} / {e['device']}",
                                         hint="pass --force to replace it, or choose another name")
                    replaced.append(f"{e['model']}/{e['target']}/{e['device']}")
                e = {**e, "name": name}
                self.conn.execute("INSERT OR REPLACE INTO baselines (name, model, target, device, precision, bundle_id, "
                                  "created, source_run, json) VALUES (?,?,?,?,?,?,?,?,?)",
                                  (*key, e.get("precision"), e.get("bundle_id"), e["created"], e.get("source_run"),
                                   jsonsafe.dumps(e)))
        return replaced

    def delete(self, name: str) -> int:
        with self.conn:
            return self.conn.execute("DELETE FROM baselines WHERE name = ?", (name,)).rowcount


def figures(blocks: list[list[float]]) -> dict[str, Any]:
    allv = np.concatenate([np.asarray(b, float) for b in blocks]) if blocks else np.array([])
    if not len(allv):
        return {"n": 0}
    return {"n": int(len(allv)), "rounds": len(blocks), "p50": round(float(np.median(allv)), 4),
            "p90": round(float(np.percentile(allv, 90)), 4), "p99": round(float(np.percentile(allv, 99)), 4),
            "mean": round(float(np.mean(allv)), 4)}


def entry_from_record(rec: dict[str, Any], block_iters: int = 20) -> dict[str, Any] | None:
    """A baseline entry from one results-DB record (a gate run: its candidate's rounds; a bench run: its
    samples cut into blocks of ``block_iters``); None when the record holds no samples."""
    from edgeopt.fleetbench import now_iso
    from edgeopt.hil.paired import fingerprint

    b = rec.get("bundle") or {}
    dev = (rec.get("device") or {}).get("name")
    base = {"model": b.get("model"), "target": b.get("target"), "precision": b.get("precision"), "device": dev,
            "bundle_id": b.get("bundle_id"), "source_run": rec.get("run_id"), "source_time": rec.get("time"),
            "created": now_iso()}
    if rec.get("gate") is not None:
        g = rec["gate"]
        blocks = (rec.get("rounds") or {}).get("B") or []
        acc = next((v for v in g.get("verdicts") or [] if v.get("metric") == "accuracy"), None)
        base.update({"kind": "gate", "blocks": blocks, "fingerprint": g.get("fingerprint") or {},
                     "accuracy": acc, "source_verdict": g.get("verdict"), "health": g.get("health"),
                     "calibration_ms": g.get("calibration_ms")})
    else:
        bench = rec.get("bench") or {}
        samples = [float(s) for s in bench.get("samples_ms") or [] if isinstance(s, (int, float))]
        blocks = [samples[i:i + block_iters] for i in range(0, len(samples) - block_iters + 1, block_iters)]
        base.update({"kind": "bench", "blocks": blocks,
                     "fingerprint": fingerprint(rec.get("probe"), {"runner": bench.get("runner") or {}}),
                     "accuracy": bench.get("accuracy"), "source_verdict": rec.get("status"),
                     "health": {"load": ((((rec.get("probe") or {}).get("environment") or {}).get("loadavg"))
                                         or [None])[0]}})
    if not base["blocks"] or not base["model"] or not dev:
        return None
    base["figures"] = figures(base["blocks"])
    return base


def save(name: str, source: str, db: str | Path = "edgeopt-results.db", model: str | None = None,
         target: str | None = None, device: str | None = None, force: bool = False,
         identity: str | None = None) -> dict[str, Any]:
    """``edgeopt baseline save NAME --from RUN_ID|latest``: the run's entries (model × target × device) kept
    under NAME. ``latest``: the newest run in the DB (optionally of this model / target / device / machine
    ``identity``: on a shared ``--db postgresql://…``, the newest run of any rig of that identity)."""
    from edgeopt.results import ResultsDB

    _check_name(name)
    with ResultsDB(db, create=False) as rdb:
        recs = rdb.query(model=model, target=target, device=device, identity=identity, annotate=True)
        usable = [r for r in recs if r.get("status") in ("ok",) or str(r.get("status", "")).startswith("gate-")
                  and r.get("status") != "gate-error"]
        if source == "latest":
            if not usable:
                raise UsageError(f"no finished run in {db}" + (" matching the filters" if recs else ""),
                                 hint="run `edgeopt bench` or `edgeopt gate` first")
            run_id = usable[-1]["run_id"]
        else:
            run_id = source
        chosen = [r for r in usable if r.get("run_id") == run_id]
        if not chosen:
            ids = list(dict.fromkeys(r["run_id"] for r in reversed(usable)))
            close = difflib.get_close_matches(run_id, ids, n=1)
            raise UsageError(f"no finished run {run_id!r} in {db}" + (f" (did you mean {close[0]!r}?)" if close else ""),
                             hint=("recent runs: " + ", ".join(ids[:5])) if ids else "the database has no finished run")
    entries = [e for e in (entry_from_record(r) for r in chosen) if e]
    if not entries:
        raise UsageError(f"run {run_id!r} holds no latency samples to keep",
                         hint="save from a gate run, or a bench run with samples (not --no-samples)")
    with Baselines(db) as bl:
        replaced = bl.put(name, entries, force)
    return {"name": name, "run_id": run_id, "entries": [_brief(e) for e in entries], "replaced": replaced}


def _brief(e: dict[str, Any]) -> dict[str, Any]:
    return {k: e.get(k) for k in ("model", "target", "precision", "device", "bundle_id", "kind", "source_run",
                                  "source_verdict", "created", "figures", "fingerprint", "health", "calibration_ms")}


def list_baselines(db: str | Path = "edgeopt-results.db") -> list[dict[str, Any]]:
    from edgeopt.results_url import local_path

    if not local_path(db).is_file():
        return []
    with Baselines(db) as bl:
        out = []
        for n in bl.names():
            es = bl.entries(n)
            out.append({"name": n, "entries": len(es), "models": sorted({e["model"] for e in es}),
                        "targets": sorted({e["target"] for e in es}), "devices": sorted({e["device"] for e in es}),
                        "created": max(e["created"] for e in es)})
        return out


def show(name: str, db: str | Path = "edgeopt-results.db") -> dict[str, Any]:
    with Baselines(_existing(db), create=False) as bl:
        return {"name": name, "entries": [_brief(e) for e in bl.get(name)]}


def _existing(db: str | Path) -> str | Path:
    from edgeopt.results_url import exists, mask

    if not exists(db):
        raise UsageError(f"no results database at {mask(str(db))!r}", hint="pass the --db your gates and benches wrote to")
    return db


def export(name: str, db: str | Path = "edgeopt-results.db") -> dict[str, Any]:
    """The baseline as one JSON document (``edgeopt baseline export``), rounds included."""
    with Baselines(_existing(db), create=False) as bl:
        return {"schema": "edgeopt/v1", "kind": "baseline", "name": name, "entries": bl.get(name)}


def write_export(doc: dict[str, Any], out: str | Path) -> None:
    path = Path(out)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(jsonsafe.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)


def import_file(path: str | Path, db: str | Path = "edgeopt-results.db", name: str | None = None,
                force: bool = False) -> dict[str, Any]:
    """Load an exported baseline file into the DB (under its own name or ``name``)."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"baseline file {str(path)!r} does not exist")
    try:
        doc = json.loads(p.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("kind") != "baseline" or not isinstance(doc.get("entries"), list):
        raise UsageError(f"{path}: not an edgeopt baseline export (expected kind: baseline with entries)")
    entries = []
    for i, e in enumerate(doc["entries"]):
        missing = [k for k in ("model", "target", "device", "blocks", "created") if not isinstance(e, dict) or k not in e]
        if missing:
            raise UsageError(f"{path}: entries[{i}] lacks {', '.join(missing)}")
        if not isinstance(e["blocks"], list) or not all(
                isinstance(b, list) and all(isinstance(x, (int, float)) and x > 0 for x in b) for b in e["blocks"]):
            raise UsageError(f"{path}: entries[{i}].blocks must be lists of positive latencies in ms")
        entries.append(e)
    target_name = _check_name(name or str(doc.get("name") or ""))
    with Baselines(db) as bl:
        replaced = bl.put(target_name, entries, force)
    return {"name": target_name, "entries": [_brief(e) for e in entries], "replaced": replaced}


def resolve(spec: str, db: str | Path | None, model: str, target: str) -> tuple[str, list[dict[str, Any]]]:
    """``results:NAME`` → (NAME, its entries for this model and target). Every miss is a UsageError (exit 2)."""
    from edgeopt.inventory import canonical_target

    name = spec[len(PREFIX):]
    if not name:
        raise UsageError("--baseline results: needs a name (results:NAME)")
    from edgeopt.results_url import exists, mask

    if db is None or not exists(db):
        raise UsageError(f"no baseline named {name!r}: no results database at {mask(str(db))!r}",
                         hint="pass the --db the baseline was saved in, or `edgeopt baseline import FILE` first")
    with Baselines(db, create=False) as bl:
        entries = bl.get(name)
    mine = [e for e in entries if e["model"] == model
            and canonical_target(e["target"]) == canonical_target(target)]
    if not mine:
        held = sorted({f"{e['model']} on {e['target']}" for e in entries})
        raise UsageError(f"baseline {name!r} holds {', '.join(held)}, not {model} on {target}: a gate compares two "
                         "versions of one model on one target")
    return name, mine


def fingerprint_diff(stored: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What differs between the baseline's device fingerprint and today's (each one a warning)."""
    out = []
    for k in sorted(set(stored) | set(now)):
        a, b = stored.get(k), now.get(k)
        if a is None or b is None:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            for r in sorted(set(a) | set(b)):
                if a.get(r) != b.get(r):
                    out.append(f"{k}.{r}: {a.get(r)} → {b.get(r)}")
        elif a != b:
            out.append(f"{k}: {a} → {b}")
    return out


def load_warning(stored: dict[str, Any] | None, now: dict[str, Any] | None) -> str | None:
    """A warning when the device's load average now is far from the one the baseline was measured under
    (an unpaired comparison cannot cancel that)."""
    a, b = (stored or {}).get("load"), (now or {}).get("load")
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return None
    if abs(a - b) > max(0.5, 0.5 * min(a, b)):
        return (f"the load average was {a:.2f} when the baseline was measured and is {b:.2f} now: an unpaired "
                "comparison cannot cancel that")
    return None
