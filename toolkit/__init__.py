"""edgeopt: one ONNX model in; a faithful, measured artifact for every target out.

The API mirrors the CLI (``edgeopt.api``): ``edgeopt.inspect``, ``edgeopt.build``, ``edgeopt.push``,
``edgeopt.bench``, ``edgeopt.report``, ``edgeopt.list_targets`` (``edgeopt targets``) ... take the command's options as keyword arguments, return
what its ``--json`` prints (typed), and raise ``edgeopt.errors.EdgeoptError`` subclasses -- a failed
build, bench, push, tune, gate or rollout too (``BuildFailed``, ``DeviceError``, ``GoalNotMet``,
``GateFailed``, ``Inconclusive``, ``RolloutHalted``, the result as ``err.result``; ``raise_on_failure=False``
returns it). ``dir(edgeopt)`` lists them. Heavy modules load
on use.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

API = ("inspect", "list_targets", "build", "push", "bench", "probe", "gc", "query", "report", "select_devices",
       "bench_options", "gate", "rollout", "tune", "rig_status", "rig_release", "baseline_save", "baseline_list",
       "baseline_show", "baseline_export", "baseline_import", "history", "change_points", "parse_duration",
       "rollback", "RollbackResult", "RollbackDevice", "run", "RunResult", "debug_layers", "fleet_status", "FleetStatus",
       "rollout_list", "rollout_status", "rollout_resume", "cache_list", "cache_clean", "devices", "ocr_check",
       "find_max_qps", "export", "results_sync", "results_info", "cluster_status", "start_worker")
# the typed results (edgeopt.api_types), importable from the package too
TYPES = ("GateResult", "GateDevice", "GateVerdict", "RolloutSummary", "RolloutWave", "RolloutOutcome", "RolloutPlan",
         "InspectResult", "TargetSupport", "TritonExportResult", "MlflowExportResult", "ResultsSyncResult",
         "ResultsInfo", "ClusterStatus", "ClusterWorker", "WorkerProcess", "RolloutRecord", "RolloutStatus", "TargetInfo", "DeviceEntry", "CacheCleanResult",
         "OcrCheckResult", "MaxQpsRow", "RigStatus", "RigRelease", "Baseline", "BaselineSummary")
# the exceptions the API raises (edgeopt.errors), importable from the package too
ERRORS = ("EdgeoptError", "UsageError", "ModelError", "CalibrationError", "MissingDependency", "UnsupportedOps",
          "BuildFailed", "DeviceError", "HostKeyError", "GoalNotMet", "GateFailed", "RolloutHalted", "Inconclusive")
__all__ = ["__version__", *API, *TYPES, *ERRORS]


def __getattr__(name: str) -> Any:
    if name in API:
        from edgeopt import api

        return getattr(api, name)
    if name in TYPES:
        from edgeopt import api_types

        return getattr(api_types, name)
    if name in ERRORS:
        from edgeopt import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'edgeopt' has no attribute {name!r}")


def __dir__() -> list[str]:
    """``dir(edgeopt)`` lists the API (loaded on use, so not in the module's globals until then)."""
    return sorted({*globals(), *__all__})
