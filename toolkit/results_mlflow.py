"""``edgeopt export mlflow``: each results record as an MLflow run, through MLflow's REST API (stdlib
``urllib``: the host needs no mlflow package).

One run per record, in the experiment given (``--experiment``) or ``edgeopt-<model>``: params (model,
target, precision, backend, device, identity, bundle id, batch, rig), metrics (latency p50…p99.9, mean,
throughput, load, first inference, cold start, peak memory, accuracy share and cosine, energy per
inference; each per-iteration sample as ``latency_sample_ms`` at its step), tags (device truth, run id,
status/verdict, the identity's facts, ``edgeopt.record_key``). ``runs/log-batch`` takes at most 1000
metrics, 100 params, 100 tags, 1000 items in all and 1 MB per request: ``batches`` cuts within them.
Idempotent: the record key is the last tag written, and a record whose key is already in the experiment
(a FINISHED run) is skipped, so an export cut short and run again logs each record once. A refusal from
the server is one line (exit 4) naming the call and the server's own error code and message.
Authentication, when the server wants it: ``MLFLOW_TRACKING_TOKEN`` (bearer) or
``MLFLOW_TRACKING_USERNAME``/``MLFLOW_TRACKING_PASSWORD`` (basic), never printed.
"""

from __future__ import annotations

import base64
import datetime as _dt
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

from edgeopt.errors import DeviceError, UsageError

MAX_METRICS, MAX_PARAMS, MAX_TAGS, MAX_ITEMS, MAX_BYTES = 1000, 100, 100, 1000, 1_000_000
KEY_TAG = "edgeopt.record_key"


class MlflowRefused(DeviceError):
    """The tracking server refused a call (or could not be reached). Exit 4."""


class Mlflow:
    """A minimal MLflow REST client (``/api/2.0/mlflow/…``)."""

    def __init__(self, uri: str, timeout: float = 30.0) -> None:
        parts = urllib.parse.urlsplit(uri)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise UsageError(f"bad --tracking-uri {uri!r}: an http(s):// URL of an MLflow tracking server")
        if parts.password:
            raise UsageError("--tracking-uri has a password in it, which edgeopt refuses",
                             hint="use MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD or MLFLOW_TRACKING_TOKEN")
        self.uri = uri.rstrip("/")
        self.timeout = timeout
        self.calls = 0

    def _auth(self) -> dict[str, str]:
        if os.environ.get("MLFLOW_TRACKING_TOKEN"):
            return {"Authorization": f"Bearer {os.environ['MLFLOW_TRACKING_TOKEN']}"}
        if os.environ.get("MLFLOW_TRACKING_USERNAME"):
            pair = f"{os.environ['MLFLOW_TRACKING_USERNAME']}:{os.environ.get('MLFLOW_TRACKING_PASSWORD', '')}"
            return {"Authorization": "Basic " + base64.b64encode(pair.encode()).decode()}
        return {}

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        url = f"{self.uri}/api/2.0/mlflow/{path}"
        data = None
        if method == "GET" and body:
            url += "?" + urllib.parse.urlencode(body)
        elif body is not None:
            data = json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json", **self._auth()})
        self.calls += 1
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                text = resp.read().decode() or "{}"
        except urllib.error.HTTPError as exc:
            raw = exc.read().decode(errors="replace")
            err = _json(raw)
            code = err.get("error_code") if isinstance(err, dict) else None
            why = (f"{code or exc.code}: {' '.join(str(err.get('message', '')).split())[:300]}" if isinstance(err, dict)
                   else f"HTTP {exc.code}: {' '.join(raw.split())[:200]}")
            e = MlflowRefused(f"the MLflow server {self.uri} refused {path}: {why}",
                              hint="nothing already exported is changed; fix the cause and run the export again "
                                   "(records exported are skipped)")
            e.status, e.code = exc.code, code
            raise e from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise MlflowRefused(f"the MLflow server {self.uri} cannot be reached: {reason}",
                                hint="check --tracking-uri and that `mlflow server` runs there") from None
        return json.loads(text)

    def experiment(self, name: str) -> str:
        """The id of experiment ``name``, created when absent."""
        try:
            return self.call("GET", "experiments/get-by-name", {"experiment_name": name})["experiment"]["experiment_id"]
        except MlflowRefused as exc:
            if getattr(exc, "code", None) != "RESOURCE_DOES_NOT_EXIST":
                raise
        try:
            return self.call("POST", "experiments/create", {"name": name})["experiment_id"]
        except MlflowRefused as exc:  # created meanwhile by another exporter
            if getattr(exc, "code", None) != "RESOURCE_ALREADY_EXISTS":
                raise
            return self.call("GET", "experiments/get-by-name", {"experiment_name": name})["experiment"]["experiment_id"]

    def search(self, experiment_id: str, filter_string: str = "") -> Iterator[dict[str, Any]]:
        """Every run of the experiment (matching ``filter_string``), page by page."""
        token = None
        while True:
            body: dict[str, Any] = {"experiment_ids": [experiment_id], "max_results": 1000,
                                    "filter": filter_string}
            if token:
                body["page_token"] = token
            res = self.call("POST", "runs/search", body)
            yield from res.get("runs") or []
            token = res.get("next_page_token")
            if not token:
                return

    def exported_keys(self, experiment_id: str) -> set[str]:
        keys = set()
        for run in self.search(experiment_id, "attributes.status = 'FINISHED'"):
            for t in (run.get("data") or {}).get("tags") or []:
                if t.get("key") == KEY_TAG:
                    keys.add(t.get("value"))
        return keys


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _num(v: Any) -> float | None:
    import math

    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _ms(time_text: str | None) -> int:
    try:
        t = _dt.datetime.fromisoformat(str(time_text).replace("Z", "+00:00"))
        if t.tzinfo is None:
            t = t.replace(tzinfo=_dt.timezone.utc)
        return int(t.timestamp() * 1000)
    except ValueError:
        return int(_dt.datetime.now(_dt.timezone.utc).timestamp() * 1000)


def run_of(rec: dict[str, Any]) -> tuple[str, list[dict], list[dict], list[dict]]:
    """(run name, params, metrics, tags) of one record as MLflow takes them."""
    from edgeopt.results import record_from_dict
    from edgeopt.results_schema import identity_of, record_key

    r = record_from_dict(rec)
    ts = _ms(r.time)
    ident = identity_of(rec) or {}
    b, lat, acc, en = r.bundle, r.latency, r.accuracy, r.energy
    params = {"model": b.model, "target": b.target, "precision": b.precision, "backend": b.backend,
              "device": r.device.name, "identity": ident.get("id"), "bundle_id": b.id, "batch": b.batch,
              "rig": rec.get("rig")}
    metrics: dict[str, float | None] = {}
    if lat is not None:
        metrics.update({"latency_p50_ms": lat.p50_ms, "latency_p90_ms": lat.p90_ms, "latency_p95_ms": lat.p95_ms,
                        "latency_p99_ms": lat.p99_ms, "latency_p99_9_ms": lat.p999_ms, "latency_mean_ms": lat.mean_ms,
                        "throughput_ips": lat.throughput_ips, "load_s": lat.load_s,
                        "first_inference_ms": lat.first_inference_ms, "cold_start_ms": lat.cold_start_ms,
                        "peak_rss_mb": lat.peak_rss_mb})
    if acc is not None:
        metrics.update({"accuracy_share": acc.share, "accuracy_cosine_min": acc.cosine_min,
                        "accuracy_passed": None if acc.passed is None else float(bool(acc.passed))})
    if en is not None:
        metrics.update({"energy_j_per_inference": en.joules_per_inference, "mean_power_w": en.mean_power_w})
    mlist = [{"key": k, "value": _num(v), "timestamp": ts, "step": 0} for k, v in metrics.items() if _num(v) is not None]
    if lat is not None:
        mlist += [{"key": "latency_sample_ms", "value": float(v), "timestamp": ts, "step": i}
                  for i, v in enumerate(lat.samples_ms) if _num(v) is not None]
    tags = {"edgeopt.device_truth": r.device.device_truth, "edgeopt.run_id": r.run_id,
            "edgeopt.status": r.status, "edgeopt.verdict": ((rec.get("gate") or {}).get("verdict") or r.status),
            "edgeopt.device": r.device.name, "edgeopt.identity_facts": json.dumps(ident.get("facts") or {},
                                                                                 sort_keys=True)[:4900],
            "edgeopt.time": r.time}
    if r.error is not None:
        tags["edgeopt.error"] = (r.error.message or "")[:4900]
    plist = [{"key": k, "value": str(v)[:6000]} for k, v in params.items() if v is not None]
    tlist = [{"key": k, "value": str(v)} for k, v in tags.items() if v is not None]
    tlist.append({"key": KEY_TAG, "value": record_key(rec)})  # last: its presence means the run is whole
    name = f"{b.model}-{b.target}-{b.precision}@{r.device.name}"
    return name, plist, mlist, tlist


def batches(params: list[dict], metrics: list[dict], tags: list[dict]) -> Iterator[dict[str, list[dict]]]:
    """``runs/log-batch`` bodies within MLflow's limits (1000 metrics, 100 params, 100 tags, 1000 items,
    1 MB), in order: params first, then metrics, then tags (the record key last of all)."""
    cur: dict[str, list[dict]] = {"params": [], "metrics": [], "tags": []}
    size = 0
    limits = {"params": MAX_PARAMS, "metrics": MAX_METRICS, "tags": MAX_TAGS}
    for kind, items in (("params", params), ("metrics", metrics), ("tags", tags)):
        for item in items:
            n = len(json.dumps(item)) + 2
            full = (len(cur[kind]) >= limits[kind] or sum(len(v) for v in cur.values()) >= MAX_ITEMS
                    or size + n > MAX_BYTES - 1000)
            if full:
                yield cur
                cur, size = {"params": [], "metrics": [], "tags": []}, 0
            cur[kind].append(item)
            size += n
    if any(cur.values()):
        yield cur


def export(records: list[dict[str, Any]], tracking_uri: str, experiment: str | None = None,
           progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Log each record as a run (see the module's doc): ``{"exported", "skipped", "batches", "experiments"}``."""
    client = Mlflow(tracking_uri)
    out: dict[str, Any] = {"exported": 0, "skipped": 0, "batches": 0, "experiments": {}, "runs": []}
    from edgeopt.results_schema import record_key

    known: dict[str, set[str]] = {}
    for rec in records:
        name = experiment or f"edgeopt-{(rec.get('bundle') or {}).get('model') or 'unknown'}"
        if name not in out["experiments"]:
            out["experiments"][name] = client.experiment(name)
            known[name] = client.exported_keys(out["experiments"][name])
        exp_id = out["experiments"][name]
        key = record_key(rec)
        if key in known[name]:
            out["skipped"] += 1
            continue
        run_name, params, metrics, tags = run_of(rec)
        run = client.call("POST", "runs/create", {"experiment_id": exp_id, "run_name": run_name,
                                                  "start_time": _ms(rec.get("time")),
                                                  "tags": [{"key": "mlflow.runName", "value": run_name}]})["run"]
        run_id = run["info"]["run_id"]
        try:
            for body in batches(params, metrics, tags):
                client.call("POST", "runs/log-batch", {"run_id": run_id, **body})
                out["batches"] += 1
        except MlflowRefused:
            try:  # the run is marked FAILED (and has no record key): the next export logs the record anew
                client.call("POST", "runs/update", {"run_id": run_id, "status": "FAILED"})
            except MlflowRefused:
                pass
            raise
        client.call("POST", "runs/update", {"run_id": run_id, "status": "FINISHED",
                                            "end_time": _ms(rec.get("time"))})
        known[name].add(key)
        out["exported"] += 1
        out["runs"].append(run_id)
        if progress:
            progress(f"exported {run_name} as run {run_id}")
    out["calls"] = client.calls
    return out
