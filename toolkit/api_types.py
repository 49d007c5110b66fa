"""The typed results of the API functions that once returned dicts (``gate``, ``rollout``, ``inspect``) and of
the commands that got a function last (``export``, ``results sync|info``, ``cluster status``, ``worker``).

Each is a dataclass whose fields are what scripts read (``res.verdict``, ``res.devices[0].verdicts[0].ratio``),
built from the dict the command's ``--json`` prints, which stays whole in ``raw`` (nothing is lost to the typed
view) and comes back with ``to_dict()``. Reading one as that dict (``res["verdict"]``, ``res.get("devices")``,
``"build_s" in res``) still works: code written when these functions returned dicts keeps running.
"""

from __future__ import annotations

import copy
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["GateVerdict", "GateDevice", "GateResult", "RolloutOutcome", "RolloutWave", "RolloutSummary",
           "RolloutPlan", "PlannedDevice", "TensorSpec", "TargetSupport", "InspectResult", "TritonExportResult",
           "MlflowExportResult", "ResultsSyncResult", "ResultsInfo", "ClusterWorker", "ClusterStatus",
           "WorkerProcess", "RolloutRecord", "RolloutStatus", "RolloutDeviceEvent", "RolloutHost", "gate_result",
           "rollout_summary", "rollout_plan", "inspect_result", "TargetInfo", "DeviceEntry", "DeviceProbe",
           "CacheCleanResult", "OcrCheckResult", "MaxQpsRow", "MaxQpsProbe", "RigStatus", "RigDevice", "RigRelease",
           "Baseline", "BaselineEntry", "BaselineSummary", "DeviceGc"]


class _AsDict:
    """``x["key"]``, ``x.get("key")``, ``"key" in x``, ``x.keys()``: the ``raw`` dict's (the ``--json`` shape);
    ``to_dict()`` a copy of it."""

    raw: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.raw.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self.raw

    def keys(self):
        return self.raw.keys()

    def items(self):
        return self.raw.items()

    def __iter__(self) -> Iterator[str]:
        return iter(self.raw)

    def to_dict(self) -> dict[str, Any]:
        """The dict this was made from (what ``--json`` prints), a copy."""
        return copy.deepcopy(self.raw)

    as_dict = to_dict


def _f(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _s(v: Any) -> str | None:
    return None if v is None else str(v)


def _i(v: Any, default: int = 0) -> int:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else default


# --- gate ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GateVerdict(_AsDict):
    """One metric on one device: ``verdict`` pass | regressed | improved | inconclusive; ``ratio`` candidate /
    baseline (latency: above 1 is slower) with its interval ``ci_low``..``ci_high``; ``reason`` when not decided."""

    metric: str
    verdict: str
    ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    p_value: float | None = None
    n: int = 0
    method: str = ""
    reason: str = ""
    baseline: float | None = None
    candidate: float | None = None
    threshold: float | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class GateDevice(_AsDict):
    """One rig device of a gate: ``status`` ok | failed | refused | unfit | quarantined, its ``verdict`` and
    per-metric ``verdicts``; ``error``/``skipped`` say why when it was not judged."""

    device: str
    status: str
    verdict: str
    verdicts: tuple[GateVerdict, ...] = ()
    error: str | None = None
    skipped: str | None = None
    attempts: int = 0
    elapsed_s: float | None = None
    warnings: tuple[str, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class GateResult(_AsDict):
    """What :func:`edgeopt.gate` found (``edgeopt gate --json``): the overall ``verdict`` (pass | regressed |
    improved | inconclusive | error), the ``exit_code`` the CLI exits with, and each device."""

    gate_id: str
    verdict: str
    exit_code: int
    model: str
    target: str
    mode: str  # paired | unpaired (a results:NAME baseline)
    baseline: str
    candidate: str
    baseline_id: str
    candidate_id: str
    devices: tuple[GateDevice, ...] = ()
    budget_s: float | None = None
    elapsed_s: float | None = None
    build_s: float | None = None  # a model CANDIDATE's build, timed apart from the budget
    on_inconclusive: str | None = None
    data_note: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        """The CLI would exit 0 (pass, improved, or inconclusive folded by ``on_inconclusive="pass"``)."""
        return self.exit_code == 0


def gate_result(res: dict[str, Any]) -> GateResult:
    """The gate's dict (``edgeopt.hil.gate.gate``) typed."""
    devs = []
    for d in res.get("devices") or []:
        vs = tuple(GateVerdict(metric=str(v.get("metric")), verdict=str(v.get("verdict")), ratio=_f(v.get("ratio")),
                               ci_low=_f(v.get("ci_low")), ci_high=_f(v.get("ci_high")),
                               p_value=_f(v.get("p_value")), n=_i(v.get("n")), method=str(v.get("method") or ""),
                               reason=str(v.get("reason") or ""), baseline=_f(v.get("baseline")),
                               candidate=_f(v.get("candidate")), threshold=_f(v.get("threshold")), raw=v)
                   for v in d.get("verdicts") or [] if isinstance(v, dict))
        devs.append(GateDevice(device=str(d.get("device")), status=str(d.get("status") or ""),
                               verdict=str(d.get("verdict") or ""), verdicts=vs, error=_s(d.get("error")),
                               skipped=_s(d.get("skipped")), attempts=_i(d.get("attempts")),
                               elapsed_s=_f(d.get("elapsed_s")),
                               warnings=tuple(str(w) for w in d.get("warnings") or ()), raw=d))
    return GateResult(gate_id=str(res.get("gate_id") or ""), verdict=str(res.get("verdict") or ""),
                      exit_code=_i(res.get("exit_code")), model=str(res.get("model") or ""),
                      target=str(res.get("target") or ""), mode=str(res.get("mode") or ""),
                      baseline=str(res.get("baseline") or ""), candidate=str(res.get("candidate") or ""),
                      baseline_id=str(res.get("baseline_id") or ""), candidate_id=str(res.get("candidate_id") or ""),
                      devices=tuple(devs), budget_s=_f(res.get("budget_s")), elapsed_s=_f(res.get("elapsed_s")),
                      build_s=_f(res.get("build_s")), on_inconclusive=_s(res.get("on_inconclusive")),
                      data_note=_s(res.get("data_note")), raw=res)


# --- rollout -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RolloutOutcome(_AsDict):
    """One device of a wave: ``status`` done | already | failed | unreachable | timed-out | refused | paused, the
    ``step`` it ended at and why (``reason``); ``before``/``after`` the bundle ids it ran."""

    device: str
    status: str
    step: str = ""
    reason: str = ""
    before: str | None = None
    after: str | None = None
    time_s: float | None = None
    attempts: int = 1
    activated: bool = False
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class RolloutWave(_AsDict):
    """One wave: its devices, the outcome counts, ``failures``; ``resumed_done`` when a resume found it done."""

    wave: int
    devices: int
    outcomes: tuple[RolloutOutcome, ...] = ()
    counts: dict[str, int] = field(default_factory=dict)
    failures: int = 0
    resumed_done: int = 0
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class RolloutSummary(_AsDict):
    """What :func:`edgeopt.rollout` / :func:`edgeopt.rollout_resume` did: ``status`` done | halted | paused (and
    why, ``reason``), each wave, the devices rolled back (name -> the bundle id it runs now)."""

    rollout_id: str
    model: str
    status: str
    reason: str | None = None
    waves: tuple[RolloutWave, ...] = ()
    rolled_back: dict[str, str] = field(default_factory=dict)
    skipped: tuple[dict[str, str], ...] = ()  # {"device", "reason"}
    left_out: int = 0
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.status == "done"

    @property
    def outcomes(self) -> list[RolloutOutcome]:
        """Every device's outcome, wave after wave."""
        return [o for w in self.waves for o in w.outcomes]


def rollout_summary(s: dict[str, Any]) -> RolloutSummary:
    waves = []
    for w in s.get("waves") or []:
        outs = tuple(RolloutOutcome(device=str(o.get("device")), status=str(o.get("status") or ""),
                                    step=str(o.get("step") or ""), reason=str(o.get("reason") or ""),
                                    before=_s(o.get("before")), after=_s(o.get("after")), time_s=_f(o.get("time_s")),
                                    attempts=_i(o.get("attempts"), 1), activated=bool(o.get("activated")), raw=o)
                     for o in w.get("outcomes") or [])
        waves.append(RolloutWave(wave=_i(w.get("wave")), devices=_i(w.get("devices")), outcomes=outs,
                                 counts={str(k): _i(v) for k, v in (w.get("counts") or {}).items()},
                                 failures=_i(w.get("failures")), resumed_done=_i(w.get("resumed_done")), raw=w))
    return RolloutSummary(rollout_id=str(s.get("rollout_id") or ""), model=str(s.get("model") or ""),
                          status=str(s.get("status") or ""), reason=_s(s.get("reason")), waves=tuple(waves),
                          rolled_back={str(k): str(v) for k, v in (s.get("rolled_back") or {}).items()},
                          skipped=tuple({str(k): str(v) for k, v in x.items()} for x in s.get("skipped") or []),
                          left_out=_i(s.get("left_out")), raw=s)


@dataclass(frozen=True)
class PlannedDevice(_AsDict):
    """One device of a planned wave: its target and the bundle it gets (``bytes`` at most to send)."""

    device: str
    target: str
    bundle_id: str
    bytes: int = 0
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class RolloutPlan(_AsDict):
    """A rollout's plan (``rollout(dry_run=True)``): the waves of devices, those skipped (and why), ``bytes`` at most
    to send, ``left_out`` devices the last wave stops short of."""

    model: str
    waves: tuple[tuple[PlannedDevice, ...], ...]
    skipped: tuple[dict[str, str], ...] = ()
    wave_specs: tuple[str, ...] = ()
    left_out: int = 0
    bytes: int = 0
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def devices(self) -> list[str]:
        return [d.device for w in self.waves for d in w]


def rollout_plan(p: dict[str, Any]) -> RolloutPlan:
    waves = tuple(tuple(PlannedDevice(device=str(w.get("device")), target=str(w.get("target") or ""),
                                      bundle_id=str(w.get("bundle_id") or ""), bytes=_i(w.get("bytes")), raw=w)
                        for w in wave) for wave in p.get("waves") or [])
    return RolloutPlan(model=str(p.get("model") or ""), waves=waves,
                       skipped=tuple({str(k): str(v) for k, v in x.items()} for x in p.get("skipped") or []),
                       wave_specs=tuple(str(x) for x in p.get("wave_specs") or []), left_out=_i(p.get("left_out")),
                       bytes=_i(p.get("bytes")), raw=p)


# --- inspect -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorSpec(_AsDict):
    """A model input or output: name, shape (an int, a symbolic name or None per axis), element type."""

    name: str
    shape: tuple[int | str | None, ...]
    dtype: str
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class OutputKind(_AsDict):
    """What one output means and so how every check judges it: ``kind`` (``edgeopt_agent.compare.OUTPUT_KINDS``),
    ``spec`` as ``--output-kind`` spells it (``regression:px=2``, ``decision@0``), ``source`` (``inferred``,
    ``option``: the user's flag, ``batch 1``), ``guess`` (what an inference leaned on: ``logit``,
    ``coordinates``, ``mediapipe grid``); ``kind_["threshold"]`` reads the kind's own dict."""

    output: str
    kind: str
    spec: str
    source: str = "inferred"
    guess: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


def output_kind(name: str, k: dict[str, Any]) -> OutputKind:
    from edgeopt_agent.compare import kind_text

    return OutputKind(output=name, kind=str(k.get("kind")), spec=kind_text(k),
                      source=str(k.get("source") or "inferred"), guess=_s(k.get("guess")), raw=k)


@dataclass(frozen=True)
class TargetSupport(_AsDict):
    """Can ``target`` take the model: ``supported``; the nodes it cannot (``unsupported``: ``(op, node)``) and
    ``why``; ``probably``: nodes only a conversion can tell about; ``format``: an opset/IR refusal's message;
    ``builds_here``: its converter is installed on this host."""

    target: str
    backend: str
    supported: bool
    unsupported: tuple[tuple[str, str], ...] = ()
    why: str | None = None
    probably: tuple[str, ...] = ()  # "op (node): why"
    format: str | None = None
    builds_here: bool = False
    host_check: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class InspectResult(_AsDict):
    """What :func:`edgeopt.inspect` found (``edgeopt inspect --json``): the model's facts and ``support`` per
    target; ``shapes``/``flops`` for the static shapes given (``shape=``), else ``flops`` as the model states
    them (None when an axis is dynamic)."""

    path: str
    sha256: str
    size_bytes: int
    ir_version: int
    opsets: dict[str, int]
    producer: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    op_histogram: dict[str, int]
    parameters: int
    parameter_bytes: int
    flops: int | None
    support: tuple[TargetSupport, ...] = ()
    shapes: dict[str, list[int]] | None = None
    external_data: tuple[str, ...] = ()
    quantized: dict[str, int] = field(default_factory=dict)
    functions: tuple[str, ...] = ()
    metadata: dict[str, str] = field(default_factory=dict)
    # what each output means, as a build judges it; None: not inferred (``output_kinds_note`` says why)
    output_kinds: dict[str, OutputKind] | None = None
    output_kinds_note: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def supported_targets(self) -> list[str]:
        return [s.target for s in self.support if s.supported]


def _tensor(t: dict[str, Any]) -> TensorSpec:
    return TensorSpec(name=str(t.get("name")), shape=tuple(t.get("shape") or ()), dtype=str(t.get("dtype") or ""),
                      raw=t)


def inspect_result(d: dict[str, Any]) -> InspectResult:
    support = tuple(TargetSupport(
        target=str(r.get("target")), backend=str(r.get("backend") or ""), supported=bool(r.get("supported")),
        unsupported=tuple((str(u.get("op")), str(u.get("node"))) for u in r.get("unsupported") or []),
        why=_s(r.get("why")),
        probably=tuple(f"{p.get('op')} ({p.get('node')}): {p.get('why')}" if isinstance(p, dict) else str(p)
                       for p in r.get("probably") or []),
        format=(r.get("format") or {}).get("message") if isinstance(r.get("format"), dict) else _s(r.get("format")),
        builds_here=bool(r.get("builds_here")), host_check=_s(r.get("host_check")), raw=r)
        for r in d.get("support") or [])
    return InspectResult(path=str(d.get("path") or ""), sha256=str(d.get("sha256") or ""),
                         size_bytes=_i(d.get("size_bytes")), ir_version=_i(d.get("ir_version")),
                         opsets={str(k): _i(v) for k, v in (d.get("opsets") or {}).items()},
                         producer=str(d.get("producer") or ""),
                         inputs=tuple(_tensor(t) for t in d.get("inputs") or []),
                         outputs=tuple(_tensor(t) for t in d.get("outputs") or []),
                         op_histogram={str(k): _i(v) for k, v in (d.get("op_histogram") or {}).items()},
                         parameters=_i(d.get("parameters")), parameter_bytes=_i(d.get("parameter_bytes")),
                         flops=_i(d["flops"]) if isinstance(d.get("flops"), (int, float)) else None,
                         support=support, shapes=d.get("shapes"),
                         external_data=tuple(str(x) for x in d.get("external_data") or []),
                         quantized={str(k): _i(v) for k, v in (d.get("quantized") or {}).items()},
                         functions=tuple(str(x) for x in d.get("functions") or []),
                         metadata={str(k): str(v) for k, v in (d.get("metadata") or {}).items()},
                         output_kinds={str(n): output_kind(str(n), k) for n, k in d["output_kinds"].items()}
                         if isinstance(d.get("output_kinds"), dict) else None, output_kinds_note=str(d.get("output_kinds_note") or ""),
                         raw=d)


# --- export, results, cluster, worker ------------------------------------------------------------------------


@dataclass(frozen=True)
class TritonExportResult(_AsDict):
    """``export(format="triton")``: the model folder written (``model_dir``/config.pbtxt), the config as a dict and
    as text, whether an engine was copied in, and what to do next (build the engine on the Triton host, serve)."""

    model_dir: Path
    config: dict[str, Any]
    config_text: str
    engine_copied: bool
    next_steps: tuple[str, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class MlflowExportResult(_AsDict):
    """``export(format="mlflow")``: records ``exported`` as MLflow runs, ``skipped`` (there already), the
    log-batch calls made, experiment name -> id."""

    tracking_uri: str
    exported: int
    skipped: int
    batches: int
    experiments: dict[str, str] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class ResultsSyncResult(_AsDict):
    """``results_sync``: spooled records ``uploaded`` (``duplicates`` the server had already), the server's
    record count after it (``rows``), the spool file emptied."""

    db: str
    spool: str
    uploaded: int
    duplicates: int
    rows: int
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class ResultsInfo(_AsDict):
    """``results_info``: the database (as shown, password-free), ``db_kind`` sqlite | postgresql, its schema version
    and edgeopt's, the record count, machine identities, rigs; on a server the spool and what waits in it."""

    db: str
    db_kind: str
    schema_version: int | None
    edgeopt_schema: int
    records: int
    identities: int
    rigs: tuple[str, ...] = ()
    spool: str | None = None
    spooled: int | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class ClusterWorker(_AsDict):
    """One ``edgeopt worker``: what it offers (``builds``: ``backend=slots``), the jobs running there, and the
    converter versions that differ from this host's (``differs``: its bundles would get other cache keys)."""

    name: str
    address: str
    nthreads: int
    running: int
    resources: dict[str, float]
    builds: tuple[str, ...] = ()
    differs: tuple[str, ...] = ()
    edgeopt: str | None = None
    python: str | None = None
    host: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class ClusterStatus(_AsDict):
    """``cluster_status``: the scheduler, its workers, and the backends no worker can build for this host
    (``nobody``: backend -> what that is)."""

    scheduler: str
    workers: tuple[ClusterWorker, ...]
    nobody: dict[str, str] = field(default_factory=dict)
    host_resources: dict[str, str] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


def cluster_status_of(d: dict[str, Any]) -> ClusterStatus:
    ws = tuple(ClusterWorker(name=str(w.get("name")), address=str(w.get("address")), nthreads=_i(w.get("nthreads")),
                             running=_i(w.get("running")),
                             resources={str(k): float(v) for k, v in (w.get("resources") or {}).items()},
                             builds=tuple(w.get("builds") or ()), differs=tuple(w.get("differs") or ()),
                             edgeopt=_s(w.get("edgeopt")), python=_s(w.get("python")), host=_s(w.get("host")), raw=w)
               for w in d.get("workers") or [])
    return ClusterStatus(scheduler=str(d.get("scheduler")), workers=ws,
                         nobody={str(k): str(v) for k, v in (d.get("nobody") or {}).items()},
                         host_resources={str(k): str(v) for k, v in (d.get("host_resources") or {}).items()}, raw=d)


@dataclass
class WorkerProcess:
    """``worker``: the ``dask worker`` command line (``argv``) with the resources offered; ``process`` the
    running worker (a ``subprocess.Popen``; None with ``dry_run``). ``stop()`` ends it."""

    scheduler: str
    argv: list[str]
    resources: dict[str, float]
    process: subprocess.Popen | None = None

    def stop(self, timeout: float = 10.0) -> int | None:
        """Terminate the worker (SIGTERM, then SIGKILL after ``timeout``); its exit status."""
        p = self.process
        if p is None:
            return None
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        return p.returncode

    def to_dict(self) -> dict[str, Any]:
        return {"scheduler": self.scheduler, "argv": list(self.argv), "resources": dict(self.resources),
                "pid": self.process.pid if self.process is not None else None}


# --- the rollout journal (rollout list / status) -------------------------------------------------------------


@dataclass(frozen=True)
class RolloutRecord(_AsDict):
    """One journalled rollout (``rollout_list``): ``status`` as it stands (``interrupted`` with ``stale_reason``
    when its host process is gone), ``journal_status`` as written."""

    id: str
    time: str
    model: str
    status: str
    journal_status: str
    stale_reason: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class RolloutDeviceEvent(_AsDict):
    """A device's last journalled step of a rollout: its ``status`` (done, failed, paused ... or ``trial`` for an
    unconfirmed activation, with ``revert_at``), the step, wave, the bundles before/after, why, when."""

    device: str
    status: str
    step: str
    time: str
    wave: int | None = None
    before: str | None = None
    after: str | None = None
    bundle_id: str | None = None
    reason: str | None = None
    revert_at: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class RolloutHost(_AsDict):
    """The process running a rollout: host, pid, when it started, the age of its last heartbeat, alive/stale."""

    host: str
    pid: int
    started: str | None = None
    heartbeat_age_s: float | None = None
    alive: bool | None = None
    stale: bool = False
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class RolloutStatus(_AsDict):
    """One rollout from its journal (``rollout_status``): ``status`` (``stale`` when its host process died, with
    ``stale_reason``), each device's last step, the devices left in an unconfirmed trial, the host process."""

    id: str
    time: str
    model: str
    status: str
    journal_status: str
    devices: dict[str, RolloutDeviceEvent] = field(default_factory=dict)
    unconfirmed_trials: dict[str, RolloutDeviceEvent] = field(default_factory=dict)
    host: RolloutHost | None = None
    stale_reason: str | None = None
    reason: str | None = None  # why it halted or paused
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


def rollout_record(r: dict[str, Any]) -> RolloutRecord:
    return RolloutRecord(id=str(r.get("id")), time=str(r.get("time") or ""), model=str(r.get("model") or ""),
                         status=str(r.get("status") or ""), journal_status=str(r.get("journal_status") or ""),
                         stale_reason=_s(r.get("stale_reason")), raw=r)


def _event(name: str, ev: dict[str, Any]) -> RolloutDeviceEvent:
    return RolloutDeviceEvent(device=name, status=str(ev.get("status") or ""), step=str(ev.get("step") or ""),
                              time=str(ev.get("time") or ""),
                              wave=ev.get("wave") if isinstance(ev.get("wave"), int) else None,
                              before=_s(ev.get("before")), after=_s(ev.get("after")), bundle_id=_s(ev.get("bundle_id")),
                              reason=_s(ev.get("reason")), revert_at=_s(ev.get("revert_at")), raw=ev)


def rollout_status_of(r: dict[str, Any]) -> RolloutStatus:
    h = r.get("host")
    host = None if not isinstance(h, dict) else RolloutHost(
        host=str(h.get("host")), pid=_i(h.get("pid")), started=_s(h.get("started")),
        heartbeat_age_s=_f(h.get("heartbeat_age_s")), alive=h.get("alive") if isinstance(h.get("alive"), bool) else None,
        stale=bool(h.get("stale")), raw=h)
    spec = r.get("spec") if isinstance(r.get("spec"), dict) else {}
    return RolloutStatus(id=str(r.get("id")), time=str(r.get("time") or ""), model=str(r.get("model") or ""),
                         status=str(r.get("status") or ""), journal_status=str(r.get("journal_status") or ""),
                         devices={str(k): _event(str(k), v) for k, v in (r.get("devices") or {}).items()},
                         unconfirmed_trials={str(k): _event(str(k), v)
                                             for k, v in (r.get("unconfirmed_trials") or {}).items()},
                         host=host, stale_reason=_s(r.get("stale_reason")), reason=_s(spec.get("reason")), raw=r)


# --- targets, devices, cache clean, ocr-check, find-max-qps --------------------------------------------------


@dataclass(frozen=True)
class TargetInfo(_AsDict):
    """One target (``list_targets``): its name and aliases, backend, precisions (``default_precision`` what
    ``auto`` builds), whether its converter is installed here (``builds_here``, else ``why_not``)."""

    name: str
    backend: str
    description: str = ""
    precisions: tuple[str, ...] = ()
    default_precision: str | None = None
    user_defined: bool = False
    aliases: tuple[str, ...] = ()
    builds_here: bool = False
    why_not: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


def target_info(d: dict[str, Any]) -> TargetInfo:
    default = d.get("default_precision", d.get("auto"))
    return TargetInfo(name=str(d.get("name")), backend=str(d.get("backend") or ""),
                      description=str(d.get("description") or ""), user_defined=bool(d.get("user_defined")),
                      precisions=tuple(str(p) for p in d.get("precisions") or ()),
                      default_precision=_s(default) if not isinstance(default, (list, tuple)) else ",".join(default),
                      aliases=tuple(str(a) for a in d.get("aliases") or ()), builds_here=bool(d.get("builds_here")),
                      why_not=_s(d.get("why_not")), raw=d)


@dataclass(frozen=True)
class DeviceProbe(_AsDict):
    """A device's probe (``probe``, ``devices(probe=True)``): ``ok``, else ``error``; where the agent lives, how long
    connecting took; the agent's report (CPU, memory, runtimes, energy sources ...) in ``raw["probe"]``."""

    ok: bool
    error: str | None = None
    agent_path: str | None = None
    connect_s: float | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


def device_probe(p: dict[str, Any]) -> DeviceProbe:
    return DeviceProbe(ok=bool(p.get("ok")), error=_s(p.get("error")), agent_path=_s(p.get("agent_path")),
                       connect_s=_f(p.get("connect_s")), raw=p)


@dataclass(frozen=True)
class DeviceGc(_AsDict):
    """One device's ``gc``: ``ok`` (else ``error``), the bundles removed (or, with ``dry_run``, that would go) and
    kept, the staging uploads removed, the MB freed."""

    ok: bool
    error: str | None = None
    removed: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()
    staging_removed: tuple[str, ...] = ()
    freed_mb: float | None = None
    dry_run: bool = False
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


def device_gc(g: dict[str, Any]) -> DeviceGc:
    return DeviceGc(ok=bool(g.get("ok")), error=_s(g.get("error")), removed=tuple(str(x) for x in g.get("removed") or ()),
                    kept=tuple(str(x) for x in g.get("kept") or ()),
                    staging_removed=tuple(str(x) for x in g.get("staging_removed") or ()),
                    freed_mb=_f(g.get("freed_mb")), dry_run=bool(g.get("dry_run")), raw=g)


@dataclass(frozen=True)
class DeviceEntry(_AsDict):
    """One inventory device as ``edgeopt devices --json`` lists it: how it is reached, its target and labels, the
    interpreter and agent store on it, its probe when asked for."""

    name: str
    transport: str
    host: str | None = None
    port: int | None = None
    user: str | None = None
    target: str | None = None
    labels: tuple[str, ...] = ()
    python: str | None = None
    root: str | None = None
    probe: DeviceProbe | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


def device_entry(d: dict[str, Any]) -> DeviceEntry:
    p = d.get("probe")
    probe = None if not isinstance(p, dict) else device_probe(p)
    return DeviceEntry(name=str(d.get("name")), transport=str(d.get("transport") or ""), host=_s(d.get("host")),
                       port=d.get("port") if isinstance(d.get("port"), int) else None, user=_s(d.get("user")),
                       target=_s(d.get("target")), labels=tuple(str(x) for x in d.get("labels") or ()),
                       python=_s(d.get("python")), root=_s(d.get("root")), probe=probe, raw=d)


@dataclass(frozen=True)
class CacheCleanResult(_AsDict):
    """``cache_clean``: the entries removed (or, with ``dry_run``, that would be) as ``CacheEntry`` dicts' keys,
    the bytes freed, what is left."""

    removed: tuple[str, ...]  # the entries' keys
    freed_bytes: int
    left: int
    left_bytes: int
    dry_run: bool
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class OcrCheckResult(_AsDict):
    """``ocr_check``: the lines the det + rec pair read, ``passed``, and each judgement (``expect``'s words found,
    the FP32 reference pair's reading matched) with its figure and bound."""

    image: str
    det: str
    rec: str
    lines: tuple[str, ...]
    passed: bool
    expect_words: float | None = None  # share of the expected words found
    reference_similarity: float | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class MaxQpsProbe(_AsDict):
    """One rate tried by ``find_max_qps``: ``valid`` (the bound held), the percentile measured, why not."""

    qps: float
    valid: bool
    measured_ms: float | None = None
    seconds: float | None = None
    why: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class MaxQpsRow(_AsDict):
    """One (device, bundle) of ``find_max_qps``: ``max_qps`` within the bound (None when not met), ``verdict`` met /
    not met / undetermined, ``status`` ok | failed (``error``), every probe."""

    device: str
    target: str
    precision: str
    model: str
    bundle_id: str
    status: str
    verdict: str | None = None
    max_qps: float | None = None
    percentile: float | None = None
    bound_ms: float | None = None
    service_p50_ms: float | None = None
    load_generator: str | None = None
    probes: tuple[MaxQpsProbe, ...] = ()
    converged: bool = False
    note: str | None = None
    error: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


def max_qps_row(r: dict[str, Any]) -> MaxQpsRow:
    bound = r.get("bound") or {}
    pct = _f(bound.get("percentile"))
    probes = tuple(MaxQpsProbe(qps=float(p.get("qps") or 0), valid=bool(p.get("valid")),
                               measured_ms=_f(p.get(f"p{pct:g}_ms")) if pct is not None else None,
                               seconds=_f(p.get("seconds")), why=_s(p.get("why")), raw=p)
                   for p in r.get("probes") or [])
    return MaxQpsRow(device=str(r.get("device")), target=str(r.get("target") or ""),
                     precision=str(r.get("precision") or ""), model=str(r.get("model") or ""),
                     bundle_id=str(r.get("bundle_id") or ""), status=str(r.get("status") or ""),
                     verdict=_s(r.get("verdict")), max_qps=_f(r.get("max_qps")), percentile=pct,
                     bound_ms=_f(bound.get("ms")), service_p50_ms=_f(r.get("service_p50_ms")),
                     load_generator=_s(r.get("engine")), probes=probes, converged=bool(r.get("converged")),
                     note=_s(r.get("note")), error=_s(r.get("error")), raw=r)


# --- rig and baselines (the HIL gate's state) ----------------------------------------------------------------


@dataclass(frozen=True)
class RigDevice(_AsDict):
    """One rig device (``rig_status``): ``health`` fit | unfit | unreachable | not probed (``problems``,
    ``warnings``), quarantine and its reason, the failures in a row, when it was last seen and how."""

    device: str
    target: str | None
    health: str
    quarantined: bool = False
    quarantine_reason: str | None = None
    consecutive_failures: int = 0
    last_seen: str | None = None
    last_status: str | None = None
    problems: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class RigStatus(_AsDict):
    """``rig_status``: the rig file, the database, every device picked."""

    rig: str | None
    db: str
    devices: tuple[RigDevice, ...]
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


def rig_status_of(d: dict[str, Any]) -> RigStatus:
    return RigStatus(rig=_s(d.get("rig")), db=str(d.get("db") or ""), devices=tuple(
        RigDevice(device=str(r.get("device")), target=_s(r.get("target")), health=str(r.get("health") or ""),
                  quarantined=bool(r.get("quarantined")), quarantine_reason=_s(r.get("quarantine_reason")),
                  consecutive_failures=_i(r.get("consecutive_failures")), last_seen=_s(r.get("last_seen")),
                  last_status=_s(r.get("last_status")), problems=tuple(str(x) for x in r.get("problems") or ()),
                  warnings=tuple(str(x) for x in r.get("warnings") or ()), raw=r)
        for r in d.get("devices") or []), raw=d)


@dataclass(frozen=True)
class RigRelease(_AsDict):
    """``rig_release``: the device, whether it was quarantined, the failures in a row cleared."""

    device: str
    was_quarantined: bool
    failures_cleared: int
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class BaselineEntry(_AsDict):
    """One stored baseline's entry: model x target x precision x device, its bundle, where its rounds came from
    (``kind`` gate | bench, ``source_run``), when; the figures and fingerprint in ``raw``."""

    model: str
    target: str
    precision: str | None
    device: str
    bundle_id: str | None = None
    kind: str | None = None
    source_run: str | None = None
    source_verdict: str | None = None
    created: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Baseline(_AsDict):
    """A stored baseline (``baseline_show``/``baseline_save``/``baseline_import``/``baseline_export``): its name and
    entries; ``run_id`` the run saved from, ``replaced`` the entries a save or import replaced."""

    name: str
    entries: tuple[BaselineEntry, ...]
    run_id: str | None = None
    replaced: tuple[str, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class BaselineSummary(_AsDict):
    """One stored baseline as ``baseline_list`` lists it: how many entries, their models, targets, devices."""

    name: str
    entries: int
    models: tuple[str, ...] = ()
    targets: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    created: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


def baseline_of(d: dict[str, Any]) -> Baseline:
    entries = tuple(BaselineEntry(model=str(e.get("model")), target=str(e.get("target")),
                                  precision=_s(e.get("precision")), device=str(e.get("device")),
                                  bundle_id=_s(e.get("bundle_id")), kind=_s(e.get("kind")),
                                  source_run=_s(e.get("source_run")), source_verdict=_s(e.get("source_verdict")),
                                  created=_s(e.get("created")), raw=e)
                    for e in d.get("entries") or [] if isinstance(e, dict))
    rep = d.get("replaced") or ()
    return Baseline(name=str(d.get("name")), entries=entries, run_id=_s(d.get("run_id")),
                    replaced=tuple(str(x) for x in rep) if isinstance(rep, (list, tuple)) else (), raw=d)


def baseline_summary(d: dict[str, Any]) -> BaselineSummary:
    return BaselineSummary(name=str(d.get("name")), entries=_i(d.get("entries")),
                           models=tuple(d.get("models") or ()), targets=tuple(d.get("targets") or ()),
                           devices=tuple(d.get("devices") or ()), created=_s(d.get("created")), raw=d)
