"""Does ``inspect`` predict ``build``?  ONNX's own backend node tests through every target (issue 32).

The onnx wheel ships its backend node tests: ``onnx/backend/test/data/node/<test>/model.onnx`` with
the inputs and the **spec's expected outputs** (``test_data_set_0/{input,output}_N.pb``).  For every
float32 test (every graph input a float32 tensor, every output float32 or int64 (ArgMax), only the default domain, not an
``_expanded`` variant), as a new user would:

1. ``edgeopt inspect``'s per-target verdict (``edgeopt.api.support_matrix``): yes, no, or "probably
   not" (``probably`` in the row: a refusal that only a conversion can confirm, with its reason);
2. ``edgeopt build -p fp32`` for every target at once (one build call per test, ``-j 1``: the
   machine's cores are shared), with the spec's inputs as ``--calib`` data (in-domain validation: Asin,
   Log) and ``EDGEOPT_SUPPORT_RULES=off`` so that build *tries* every conversion inspect's attribute
   rules would refuse: whether each refusal is right is measured, not assumed;
3. every built artifact the host can run (cpu: ONNX Runtime, intel-cpu: OpenVINO, mobile: LiteRT,
   h100: its prepared ONNX in ONNX Runtime, as the host check does) fed the spec's inputs and compared
   with the spec's outputs (``np.allclose``, rtol 1e-3, atol 1e-5 x the output's largest magnitude (at least
   1): onnx's backend tests use rtol 1e-3);
   apple's ML Program cannot run off macOS: converter only.

Per (test, target) one outcome: ``passed`` (built, allclose to the spec), ``yes-failed`` (inspect said
yes, build failed), ``no-built`` (inspect said no, yet it builds and matches the spec: a rule too strict), ``check-missed`` (passed edgeopt's
host check but not allclose to the spec), ``crash`` (a traceback / exit 1), ``refused`` (inspect said
no and build failed: right), ``probably-failed`` / ``probably-built`` (a "probably not" and what
build did), ``check-caught`` (built, edgeopt's check refused it: a wrong conversion caught).

Resumable: one JSON line per test in ``--work``/results.jsonl; tests already there are skipped.

``--form initializers`` (issue 41): the node tests feed weights, scales and bounds as graph *inputs*; in a real
model they are initializers.  In this form every graph input but the first becomes an initializer holding the
spec's value (the model written to ``--work``/models/<test>/model.onnx), the first stays the input; tests with one
input read the same in both forms and are left out of it.  ``--form inputs`` is the tests as shipped.  Both forms'
tables also give the **held-out** part (every 5th test of the float32 list, index % 5 == 0): the mobile rules of
``targets/support_rules.py`` were written from these runs, so the figure on the tests they were not written
from is reported on its own.

``--fast``: the builds run in this process (``edgeopt.api.build``, not one ``edgeopt build`` CLI per test) and
each backend's converter worker is one long-lived process per backend (restarted every ``--recycle`` jobs,
after a crash and after a timeout) instead of a fresh ``python -m edgeopt.worker`` per (test, target): the
imports (ONNX Runtime, OpenVINO, coremltools, TensorFlow) are paid once, not 499 times.  Only the process
isolation differs from ``edgeopt build``; the worker code, the pipeline, the checks and the cache are the
same.  ``--work`` of a ``--fast`` run and of a plain run can be compared (``--compare DIR``).

    .venv/bin/python bench/bench_conformance.py --targets cpu,intel-cpu,apple,h100 --limit 40
    .venv/bin/python bench/bench_conformance.py --targets mobile --ops Resize,Conv,Split
    .venv/bin/python bench/bench_conformance.py --report      # today's inspect vs the recorded builds

The table in docs/BENCHMARKS.md (all 499 on every target): one ``--fast`` process for cpu,intel-cpu,h100,apple
(``--work A``), two for mobile (``--every 2 --start 0`` / ``--start 1``, ``--work B0`` / ``B1``), a few re-runs
(``--match``, ``--work R``), then ``--report --keep-spec --targets cpu,intel-cpu,mobile,apple,h100 --work EMPTY
--merge A --merge B0 --merge B1 --merge R --preface TEXT --write`` (files are read in that order: a later line wins).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import load, machine, md_table, stamp, write_section  # noqa: E402

TARGETS = ["cpu", "intel-cpu", "mobile", "apple", "h100"]
RTOL, ATOL = 1e-3, 1e-5
BUILT = {"built", "cached", "up-to-date"}
OUTCOMES = ["passed", "yes-failed", "no-built", "check-missed", "crash", "refused", "probably-failed",
            "probably-built", "check-caught", "not-compared"]


# --suite: the node tests (one op each), or the model tests onnx ships beside them -- torch modules exported with
# their weights as initializers (pytorch-converted: Conv1d..3d, BatchNorm, PReLU, GLU, ...; pytorch-operator: torch
# ops; simple: small hand-made graphs) -- which no rule of targets/support_rules.py was written from: a fresh
# held-out set, all of it
SUITES = {"node": ["node"], "pytorch": ["pytorch-converted", "pytorch-operator", "simple"],
          "torchvision": ["torchvision"], "new": ["node"], "zoo": ["zoo"]}
SUITE = "node"
# --suite torchvision: real architectures (torchvision's models, torch's own output as the spec), written in the
# same layout by bench/torchvision_suite.py
TORCHVISION_SUITE = Path("/tmp/edgeopt-torchvision/suite")
# --suite new: the node tests onnx 1.23.2 added (the installed onnx has none of them); --suite zoo: the classic
# model-zoo CNNs at opset 9, weights as initializers, ONNX Runtime's plain run as the spec -- both written by
# bench/onnx_new_suite.py
NEW_SUITE = Path("/tmp/edgeopt-onnx-new/suite")


def data_dir() -> Path:
    import onnx

    if SUITE == "torchvision":
        return TORCHVISION_SUITE
    if SUITE in ("new", "zoo"):
        return NEW_SUITE
    return Path(onnx.__file__).parent / "backend" / "test" / "data"


def node_dir() -> Path:
    return data_dir() / "node"


def test_dir(test: str) -> Path:
    """The folder of ``test`` in the suite run (its model.onnx and test_data_set_0)."""
    for sub in SUITES[SUITE]:
        if (data_dir() / sub / test).is_dir():
            return data_dir() / sub / test
    return node_dir() / test


def float32_tests(ops: set[str] | None = None, match: str | None = None) -> list[tuple[str, list[str]]]:
    """(test name, op types) of every float32 node test of the installed onnx, sorted by name."""
    import onnx

    found = []
    for d in sorted((d for sub in SUITES[SUITE] for d in (data_dir() / sub).iterdir()), key=lambda d: d.name):
        if "_expanded" in d.name or not (d / "model.onnx").exists() or (match and not re.search(match, d.name)):
            continue
        try:
            m = onnx.load(str(d / "model.onnx"))
        except Exception:  # noqa: BLE001 - a test this onnx cannot read is not one a user would try
            continue
        def of(vals, kinds) -> bool:
            return all(v.type.HasField("tensor_type") and v.type.tensor_type.elem_type in kinds for v in vals)

        inits = {i.name for i in m.graph.initializer}  # IR 3 lists every initializer as an input too (the zoo's)
        if not (of([i for i in m.graph.input if i.name not in inits], {onnx.TensorProto.FLOAT})
                and of(m.graph.output, {onnx.TensorProto.FLOAT, onnx.TensorProto.INT64})):
            continue
        if any(o.domain not in ("", "ai.onnx") for o in m.opset_import):
            continue
        types = sorted({n.op_type for n in m.graph.node})
        if ops and not ops & set(types):
            continue
        found.append((d.name, types))
    return found


HELD_OUT_EVERY = 5  # every 5th test of the float32 list (index % 5 == 0) is held out from rule writing


def held_out(test: str) -> bool:
    """Is ``test`` in the held-out part (every ``HELD_OUT_EVERY``-th of the float32 list, from ``HELD_OUT_PART``;
    not one of ``SEEN``, the tests a run the rules were written from measured)?"""
    global _INDEX
    if _INDEX is None:
        _INDEX = {name: i for i, (name, _) in enumerate(float32_tests())}
    if SUITE != "node":  # no rule was written from any test of the other suites
        return test not in SEEN
    i = _INDEX.get(test)
    return i is not None and i % HELD_OUT_EVERY == HELD_OUT_PART and test not in SEEN


_INDEX: dict[str, int] | None = None
HELD_OUT_PART = 0  # --part K: index % 5 == K is the held-out part (0: the first one, which rules have since seen)
SEEN: set[str] = set()  # --seen DIR: tests measured in runs the rules were written from (never held out)


def n_inputs(test: str) -> int:
    import onnx

    m = onnx.load(str(test_dir(test) / "model.onnx"))
    inits = {i.name for i in m.graph.initializer}
    return len([i for i in m.graph.input if i.name not in inits])


def as_initializers(test: str, work: Path) -> Path:
    """The test's model with every graph input but the first made an initializer of the spec's value."""
    import onnx
    from onnx import numpy_helper

    inputs, _ = spec_data(test)
    m = onnx.load(str(test_dir(test) / "model.onnx"))
    inits = {i.name for i in m.graph.initializer}
    feed = [i for i in m.graph.input if i.name not in inits]
    keep = feed[0].name
    for v in feed[1:]:
        m.graph.initializer.append(numpy_helper.from_array(inputs[v.name], v.name))
    kept = [i for i in m.graph.input if i.name == keep or i.name in inits]
    del m.graph.input[:]
    m.graph.input.extend(kept)
    m.ir_version = max(m.ir_version, 4)  # IR < 4 wants every initializer listed as a graph input too
    out = work / "models" / test / "model.onnx"
    out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(m, str(out))
    return out


def spec_data(test: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The spec's inputs and expected outputs of ``test`` ({name: array}), in graph order."""
    import onnx
    from onnx import numpy_helper

    d = test_dir(test)
    m = onnx.load(str(d / "model.onnx"))
    inits = {i.name for i in m.graph.initializer}
    names_in = [i.name for i in m.graph.input if i.name not in inits]
    names_out = [o.name for o in m.graph.output]
    data = d / "test_data_set_0"

    def read(prefix: str, names: list[str]) -> dict[str, Any]:
        out = {}
        for i, name in enumerate(names):
            t = onnx.TensorProto()
            t.ParseFromString((data / f"{prefix}_{i}.pb").read_bytes())
            out[name] = numpy_helper.to_array(t)
        return out

    return read("input", names_in), read("output", names_out)


def verdicts(model: str, targets: list[str]) -> dict[str, dict[str, Any]]:
    """inspect's verdict per target: ``{"verdict": yes|no|probably, "why": ...}``."""
    from edgeopt.api import support_matrix
    from edgeopt.errors import EdgeoptError
    from edgeopt.model import inspect
    from edgeopt.targets.registry import all_targets, get_backend

    try:
        info = inspect(model)
    except EdgeoptError as exc:  # a clear refusal of the whole model (an IR no checker here reads): a "no"
        return {t: {"verdict": "no", "why": str(exc).splitlines()[0][:200]} for t in targets}
    rows = {r["target"]: r for r in support_matrix(info)}
    specs = all_targets(None)
    out = {}
    for t in targets:
        r = rows[t]
        if "probably" not in r:  # an inspect without the field yet: ask the backend as it would
            r["probably"] = get_backend(r["backend"]).probable_refusals(info, specs[t].as_dict())
        if not r["supported"]:
            why = "; ".join(u["op"] for u in r["unsupported"]) or (r.get("format") or {}).get("message")
            out[t] = {"verdict": "no", "why": why}
        elif r.get("probably"):
            out[t] = {"verdict": "probably", "why": "; ".join(p["op"] + ": " + p["why"] for p in r["probably"])}
        else:
            out[t] = {"verdict": "yes", "why": None}
    return out


_FLOORS: dict[str, dict[str, float]] = {}


def spec_floor(model: str, inputs: dict[str, Any], expected: dict[str, Any]) -> dict[str, float]:
    """``--suite torchvision``: per output, how far ONNX Runtime's plain run of the exported file itself (no
    graph optimization) is from torch's output -- the float32 summation-order disagreement of two references on
    one model (inception_v3: 2.1e-4 on logits up to 5.7), which no conversion can be held under.  Empty for the
    other suites (their outputs are the op's spec)."""
    import numpy as np

    if SUITE != "torchvision":
        return {}
    if model not in _FLOORS:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, inputs)))
        _FLOORS[model] = {k: float(np.max(np.abs(v.astype(np.float64) - expected[k]))) for k, v in got.items()}
    return _FLOORS[model]


def spec_compare(bundle: Path, target: str, inputs: dict[str, Any], expected: dict[str, Any],
                 model: str | None = None) -> dict[str, Any]:
    """Run the bundle's artifact on the spec's inputs: ``{"allclose": bool|None, "max_abs": ...}``.  ``model``
    (``--suite torchvision``): the exported file, whose plain ONNX Runtime run sets a floor under atol
    (``spec_floor``: twice that run's distance from torch)."""
    import numpy as np

    from edgeopt_agent.bundle import from_artifact, load_manifest, to_artifact
    from edgeopt_agent.runners import get_runner

    manifest = load_manifest(bundle)
    try:
        if target == "apple":
            return {"allclose": None, "why": "Core ML runs on macOS only"}
        if manifest["runtime"]["name"] == "tensorrt":  # the prepared ONNX, as the host check runs it
            import onnxruntime as ort

            onnx_file = next(p for p in bundle.glob("*.onnx"))
            sess = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
            names = [o.name for o in sess.get_outputs()]
            got = dict(zip(names, sess.run(None, inputs)))
        else:
            io = manifest["io"]
            runner = get_runner(manifest["runtime"]["name"])(bundle, manifest, {})
            runner.load()
            got = from_artifact(runner.run(to_artifact(inputs, io["inputs"])), io["outputs"])
            runner.close()
    except Exception as exc:  # noqa: BLE001 - the artifact does not run on the spec's inputs: say so
        return {"allclose": False, "why": f"runs not on the spec's inputs: {str(exc).splitlines()[0][:200]}"}
    floors = spec_floor(model, inputs, expected) if model else {}
    worst, ok, strict = 0.0, True, True
    for name, want in expected.items():
        have = np.asarray(got.get(name))
        if have.shape != want.shape:
            return {"allclose": False, "why": f"{name}: shape {list(have.shape)}, spec {list(want.shape)}"}
        if want.size:
            worst = max(worst, float(np.nanmax(np.abs(have.astype(np.float64) - want))))
        # atol in units of the output's largest magnitude: a DFT's near-zero imaginary parts next to 540
        # carry float32 rounding of that 540, not of themselves
        scale = max(1.0, float(np.nanmax(np.abs(want)))) if want.size and want.dtype.kind == "f" else 1.0
        floor = floors.get(name, 0.0)
        ok = ok and bool(np.allclose(have, want, rtol=RTOL, atol=max(ATOL * scale, 2 * floor), equal_nan=True))
        strict = strict and bool(np.allclose(have, want, rtol=RTOL, atol=ATOL * scale, equal_nan=True))
    return {"allclose": ok, "max_abs": worst,
            **({"floor": max(floors.values()), "allclose_without_floor": strict} if floors else {})}


_SERVER = r"""
import os, sys
devnull = os.open(os.devnull, os.O_WRONLY)
os.dup2(devnull, 1)  # converters print to stdout: the edgeopt worker's stdout is /dev/null too
from edgeopt import worker
for line in sys.stdin:
    job, res = line.rstrip("\n").split("\t")
    err = os.open(res + ".err", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(err, 2)
    os.close(err)
    code = 0
    try:
        worker.main([job, res])
    except SystemExit as exc:  # a converter calling sys.exit(): the worker process would exit here
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback
        traceback.print_exc()
        code = 1
    sys.stderr.flush()
    with open(res + ".done.tmp", "w") as f:
        f.write(str(code))
    os.replace(res + ".done.tmp", res + ".done")
    if code:
        os._exit(code)
"""


class _Server:
    """One long-lived ``edgeopt.worker`` loop for a backend (``--fast``)."""

    def __init__(self, backend: str, recycle: int) -> None:
        self.backend, self.recycle, self.proc, self.jobs = backend, recycle, None, 0

    def send(self, job: str, result: str) -> None:
        if self.proc is not None and (self.proc.poll() is not None or self.jobs >= self.recycle):
            self.stop()
        if self.proc is None:
            env = {**os.environ, "EDGEOPT_SUPPORT_RULES": "off"}
            self.proc = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True, env=env)
            self.jobs = 0
        self.jobs += 1
        self.proc.stdin.write(f"{job}\t{result}\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            self.proc = None


class _ServedJob:
    """What ``edgeopt.pipeline`` uses of the ``Popen`` of a worker (stderr lines, wait, kill, returncode),
    answered by a ``_Server``."""

    def __init__(self, server: _Server, job: str, result: str) -> None:
        import threading

        self.server, self.result, self.returncode = server, result, None
        self.done = Path(result + ".done")
        self._ended = threading.Event()
        server.send(job, result)
        self.stderr = self._lines()

    def _lines(self):
        self._ended.wait()
        err = Path(self.result + ".err")
        yield from (err.read_text(errors="replace").splitlines(True) if err.exists() else [])

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.time() + timeout
        while True:
            if self.done.exists():
                self.returncode = int(self.done.read_text() or 0)
                if self.returncode:
                    self.server.stop()
                break
            proc = self.server.proc
            if proc is None or proc.poll() is not None:
                self.returncode = proc.returncode if proc is not None else -9
                self.server.stop()
                break
            if deadline is not None and time.time() > deadline:
                raise subprocess.TimeoutExpired("edgeopt.worker", timeout)
            time.sleep(0.02)
        self._ended.set()
        return self.returncode

    def kill(self) -> None:
        self.server.stop()
        self.returncode = -9
        self._ended.set()

    def poll(self) -> int | None:
        return self.returncode


def serve_workers(recycle: int) -> None:
    """``--fast``: ``edgeopt.pipeline`` starts its converter workers through long-lived per-backend loops."""
    import types

    from edgeopt import pipeline

    servers: dict[str, _Server] = {}
    real = subprocess.Popen

    def popen(args, *a, **kw):
        if list(args[1:3]) != ["-m", "edgeopt.worker"]:
            return real(args, *a, **kw)
        job, result = str(args[3]), str(args[4])
        backend = json.loads(Path(job).read_text())["target"]["backend"]
        server = servers.setdefault(backend, _Server(backend, recycle))
        return _ServedJob(server, job, result)

    shim = types.ModuleType("subprocess")
    shim.__dict__.update(subprocess.__dict__)
    shim.Popen = popen
    pipeline.subprocess = shim


def build_in_process(model: str, targets: list[str], dist: Path, calib: Path | None, timeout: int) -> tuple[int, str, str]:
    """``edgeopt build MODEL -t ... -p fp32 --json -j 1 --calib ...`` in this process: (exit code, the --json
    report, stderr)."""
    import traceback

    from edgeopt import api
    from edgeopt.errors import EdgeoptError

    os.environ["EDGEOPT_SUPPORT_RULES"] = "off"
    try:
        rep = api.build(model, targets, precision="fp32", calib=str(calib) if calib else None, dist=str(dist), jobs=1,
                        build_timeout=timeout, raise_on_failure=False)
        return (0 if rep.ok else 3), json.dumps(rep.as_dict(), default=str), ""
    except EdgeoptError as exc:
        code = getattr(exc, "exit_code", 2)
        return code, json.dumps({"kind": "error", "exit_code": code, "message": str(exc)}), ""
    except Exception:  # noqa: BLE001 - a traceback out of build: a crash, as the CLI's exit 1
        return 1, "", traceback.format_exc()
    finally:
        os.environ.pop("EDGEOPT_SUPPORT_RULES", None)


def build_cli(cmd: list[str], timeout: int) -> tuple[int, str, str]:
    """One ``edgeopt build`` CLI per test, as a user runs it: (exit code, stdout, stderr)."""
    try:
        # the build tries every conversion (no attribute-level preflight refusal): is each rule right?
        env = {**os.environ, "EDGEOPT_SUPPORT_RULES": "off"}
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        return 124, "", "timeout"


def _commit() -> str | None:
    """The checkout's HEAD (a record says which code built it; a long run spans commits)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                              cwd=Path(__file__).resolve().parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def run_test(test: str, targets: list[str], work: Path, timeout: int, fast: bool = False,
             form: str = "inputs") -> dict[str, Any]:
    model = str(test_dir(test) / "model.onnx") if form == "inputs" else str(as_initializers(test, work))
    rec: dict[str, Any] = {"test": test, "form": form, "targets": {}, "commit": _commit(),
                           "at": time.strftime("%H:%M:%S")}
    try:
        v = verdicts(model, targets)
    except Exception as exc:  # noqa: BLE001 - inspect itself crashed: that is a finding
        v = {t: {"verdict": "crash", "why": str(exc)[:200]} for t in targets}
    dist = work / "dist" / test
    inputs, expected = spec_data(test)
    if form != "inputs":  # the others are initializers now
        inputs = dict(list(inputs.items())[:1])
    calib = work / "calib" / f"{test}.npz"  # the spec's inputs as the validation data (in-domain: Asin, Log)
    calib.parent.mkdir(parents=True, exist_ok=True)
    import numpy as np

    np.savez(calib, **{k: v[None] for k, v in inputs.items()})
    if not inputs:  # a model without inputs (a Constant): no data to give, as a user would run it
        calib = None
    cmd = [sys.executable, "-m", "edgeopt", "build", model, "-t", ",".join(targets), "-p", "fp32",
           "-o", str(dist), "--json", "-j", "1"] + (["--calib", str(calib)] if calib else [])
    t0 = time.time()
    if fast:
        rc, out, err = build_in_process(model, targets, dist, calib, timeout)
    else:
        rc, out, err = build_cli(cmd, timeout)
    rec.update({"rc": rc, "build_s": round(time.time() - t0, 1)})
    try:
        report = json.loads(out) if out.strip() else {}
    except json.JSONDecodeError:
        report = {}
    results = {r["target"]: r for r in report.get("results", [])}
    crashed = rc == 1 or "Traceback (most recent call last)" in err
    for t in targets:
        r = results.get(t, {})
        status = r.get("status") or ("no-result" if not report else "missing")
        check = r.get("check") or {}
        row = {**v[t], "status": status, "check": check.get("passed"),
               "error": (r.get("error") or (report.get("message") if not results else None) or "")[:600]}
        if status in BUILT and r.get("bundle"):
            row["bundle"] = r["bundle"]
            row["spec"] = spec_compare(Path(r["bundle"]), t, inputs, expected, model)
        row["outcome"] = outcome(row, crashed or status == "crashed")
        rec["targets"][t] = row
    if not results and rc not in (0, 3):
        rec["stderr_tail"] = err.strip().splitlines()[-3:] if err.strip() else []
    return rec


def outcome(row: dict[str, Any], crashed: bool) -> str:
    if crashed:
        return "crash"
    verdict, status = row["verdict"], row["status"]
    built = status in BUILT
    if verdict == "crash":  # inspect itself raised a traceback
        return "crash"
    spec = (row.get("spec") or {}).get("allclose")
    if verdict == "no":  # build refuses it too (the same rules); was the refusal needed?
        return "no-built" if built and spec is not False else "refused"
    if built and row.get("check") is not False and spec is False:
        return "check-missed"
    if verdict == "probably":
        return "probably-built" if built else "probably-failed"
    if not built:
        return "check-caught" if status == "check-failed" else "yes-failed"
    if spec is None:
        return "not-compared" if row.get("check") is not False else "check-caught"
    return "passed"


def table(records: list[dict[str, Any]], targets: list[str]) -> str:
    counts = {t: Counter(r["targets"][t]["outcome"] for r in records if t in r["targets"]) for t in targets}
    labels = {"passed": "built, allclose to the spec", "not-compared": "built (not runnable here: converter only)",
              "yes-failed": "**inspect said yes, build failed**", "check-caught":
              "inspect said yes, edgeopt's check refused a wrong conversion", "refused": "inspect said no, build failed",
              "no-built": "**inspect said no, would have built**", "probably-failed":
              "inspect said probably not (reason given), build failed", "probably-built":
              "inspect said probably not, built", "check-missed": "**passed edgeopt's check, not allclose to the spec**",
              "crash": "**crash / traceback**"}
    rows = []
    for o in OUTCOMES:
        rows.append({"o": labels[o], **{t: counts[t].get(o, 0) for t in targets}})
    rows.append({"o": "tests", **{t: sum(counts[t].values()) for t in targets}})
    return md_table(rows, [("o", "")] + [(t, t) for t in targets])


def failures(records: list[dict[str, Any]], targets: list[str]) -> str:
    bad = {"yes-failed", "no-built", "check-missed", "crash", "check-caught"}
    lines = []
    for r in records:
        for t in targets:
            row = r["targets"].get(t)
            spec = (row or {}).get("spec") or {}
            if row and row["outcome"] == "passed" and spec.get("allclose_without_floor") is False:
                lines.append(f"- `{r['test']}` {t}: allclose only with the floor -- max |artifact - torch| "
                             f"{spec['max_abs']:.3g}, ONNX Runtime's plain run of the exported file {spec['floor']:.3g}")
            if row and row["outcome"] in bad:
                why = row.get("error") or (row.get("spec") or {}).get("why") or ""
                lines.append(f"- `{r['test']}` {t}: {row['outcome']} — {why.splitlines()[0][:160] if why else ''}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--limit", type=int, default=0, help="at most N tests (after --ops/--match)")
    ap.add_argument("--ops", default="", help="only tests with one of these op types: A,B")
    ap.add_argument("--match", default=None, help="only tests whose name matches this regex")
    ap.add_argument("--every", type=int, default=1, help="every N-th test (a spread sample)")
    ap.add_argument("--start", type=int, default=0, help="with --every: begin at this index (another sample)")
    ap.add_argument("--work", default="/tmp/edgeopt-conformance")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per build call")
    ap.add_argument("--fast", action="store_true", help="builds in this process, one long-lived converter worker "
                    "per backend (imports paid once; see the module's doc)")
    ap.add_argument("--recycle", type=int, default=40, help="with --fast: restart a backend's worker after N jobs")
    ap.add_argument("--merge", action="append", default=[], help="also read DIR/results.jsonl (another --work; "
                    "a later line wins): runs split over processes")
    ap.add_argument("--sample", action="append", default=[], help="TARGET=K: that target measured on every K-th "
                    "test of the full list (its other rows left out of the table)")
    ap.add_argument("--report", action="store_true", help="no builds: today's inspect verdicts against the builds results.jsonl holds")
    ap.add_argument("--as-run", action="store_true", help="with --report: inspect's verdicts as recorded during the "
                    "run (the held-out figure, before any rule was read off it); the spec comparisons today's")
    ap.add_argument("--keep-spec", action="store_true", help="with --report: the recorded comparisons with the spec "
                    "(not run again)")
    ap.add_argument("--preface", default=None, help="with --write: a file whose text goes above the figures")
    ap.add_argument("--write", action="store_true", help="write docs/BENCHMARKS.md section conformance "
                    "(conformance-initializers for that form)")
    ap.add_argument("--form", choices=["inputs", "initializers"], default="inputs",
                    help="the tests as shipped (extra inputs as graph inputs) or with every input but the first "
                    "as an initializer (a real model's form; tests with one input left out)")
    ap.add_argument("--section", default=None, help="with --write: the docs/BENCHMARKS.md section [conformance, or "
                    "conformance-initializers]")
    ap.add_argument("--suite", choices=sorted(SUITES), default="node",
                    help="node: ONNX's node tests; pytorch: its pytorch-converted, pytorch-operator and simple model "
                         "tests (weights as initializers), none of which a rule was written from; torchvision: "
                         "real architectures (bench/torchvision_suite.py writes them first); new: the node tests "
                         "a newer onnx added; zoo: the classic zoo CNNs at opset 9 (bench/onnx_new_suite.py "
                         "writes both first)")
    ap.add_argument("--part", type=int, default=0, help="the held-out part is index %% 5 == PART (a part no "
                    "rule was written from: the first, 0, has been read since)")
    ap.add_argument("--seen", action="append", default=[], help="DIR of a run the rules were written from: its "
                    "tests are never counted as held out (repeatable)")
    a = ap.parse_args()
    global HELD_OUT_PART, SUITE
    HELD_OUT_PART = a.part
    SUITE = a.suite
    for d in a.seen:
        for line in (Path(d) / "results.jsonl").read_text().splitlines():
            if line.strip():
                SEEN.add(json.loads(line)["test"])
    targets = [t for t in a.targets.split(",") if t]
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    res = work / "results.jsonl"
    done: dict[str, dict[str, Any]] = {}
    for f in [res] + [Path(d) / "results.jsonl" for d in a.merge]:  # a later line wins (a re-run)
        if f.exists():
            for line in f.read_text().splitlines():
                if line.strip():
                    rec = json.loads(line)
                    done.setdefault(rec["test"], {"test": rec["test"], "targets": {}})["targets"].update(rec["targets"])
    samples = {t: int(k) for t, k in (x.split("=") for x in a.sample)}
    if samples:  # a target measured on every K-th test of the full list only: its other rows are left out
        index = {name: i for i, (name, _) in enumerate(float32_tests())}
        for name, rec in done.items():
            for t, k in samples.items():
                if t in rec["targets"] and index.get(name, 0) % k:
                    del rec["targets"][t]
    tests = float32_tests({o for o in a.ops.split(",") if o} or None, a.match)[a.start::max(a.every, 1)]
    if a.form == "initializers":
        tests = [(n, ts) for n, ts in tests if n_inputs(n) > 1]
    if a.limit:
        tests = tests[:a.limit]
    if not a.report:
        os.environ.setdefault("EDGEOPT_NO_COLOR", "1")
        if a.fast:
            import faulthandler

            # a native crash in this process (--fast runs the pipeline here) leaves its Python stack in the work dir
            faulthandler.enable(file=(work / "faults.txt").open("a"))
            serve_workers(a.recycle)
        for i, (test, _types) in enumerate(tests):
            todo = [t for t in targets if t not in done.get(test, {}).get("targets", {})]
            if not todo:
                continue
            rec = run_test(test, todo, work, a.timeout, a.fast, a.form)
            with res.open("a") as f:
                f.write(json.dumps(rec) + "\n")
            done.setdefault(test, {"test": test, "targets": {}})["targets"].update(rec["targets"])
            print(f"[{i + 1}/{len(tests)}] {test} ({rec['build_s']}s): "
                  + ", ".join(f"{t}={rec['targets'][t]['outcome']}" for t in todo), flush=True)
    names = {t for t, _ in tests}
    records = [r for n, r in sorted(done.items()) if n in names or a.report]
    if a.report:  # today's inspect against the recorded builds (a build's result does not depend on it)
        for r in records:
            src = test_dir(r["test"]) / "model.onnx" if a.form == "inputs" else as_initializers(r["test"], work)
            now = ({t: {"verdict": row["verdict"], "why": row.get("why")} for t, row in r["targets"].items()}
                   if a.as_run else verdicts(str(src), list(r["targets"])))
            spec = None
            for t, row in r["targets"].items():
                bundle = Path(row.get("bundle") or work / "dist" / r["test"] / "model" / f"{t}-fp32")
                if row.get("spec") and not a.keep_spec and (bundle / "manifest.json").exists():  # today's comparison
                    spec = spec or spec_data(r["test"])
                    if a.form != "inputs":
                        spec = (dict(list(spec[0].items())[:1]), spec[1])
                    row["spec"] = spec_compare(bundle, t, *spec, str(src))
                row.setdefault("verdict_at_run", row["verdict"])
                row.update(now[t])
                row["outcome"] = outcome(row, row["outcome"] == "crash")
    form = ("as exported (weights as initializers)" if SUITE == "torchvision" else
            "weights as initializers, IR 3 (each also a graph input)" if SUITE == "zoo" else
            "extra inputs as graph inputs (the tests as shipped)" if a.form == "inputs" else
            "every input but the first as an initializer of the spec's value (a real model's form; tests with "
            "one input left out)")
    held = [r for r in records if held_out(r["test"])]
    what = ("ONNX backend node tests" if SUITE == "node" else
            "the node tests onnx 1.23.2 added (generated by its own code, bench/onnx_new_suite.py; its reference "
            "outputs as the spec)" if SUITE == "new" else
            "the classic model-zoo CNNs onnx ships as light models (opset 9, weights seeded again as initializers "
            "by bench/onnx_new_suite.py; ONNX Runtime's plain run of each file on a photo as the spec)"
            if SUITE == "zoo" else
            "torchvision's models (the smallest of each family up to 32 M parameters, exported at opset 17 by "
            "bench/torchvision_suite.py; torch's output on a real photo as the spec)" if SUITE == "torchvision" else
            "ONNX backend model tests (" + ", ".join(SUITES[SUITE]) + ": torch modules and small graphs, weights as "
            "initializers)")
    body = (f"{what} (onnx {__import__('onnx').__version__}), float32, form: {form}; `inspect` "
            f"verdict vs `build -p fp32`, artifacts vs the spec's outputs (rtol {RTOL}, atol {ATOL} x max|spec "
            f"output|" + (", or twice ONNX Runtime's own distance from torch on the exported file where larger "
                          "(`spec_floor`)" if SUITE == "torchvision" else "")
            + f"); {len(records)} tests (per target: the last row)"
            + "".join(f"; {t}: every {k}th test of the list (a sample)" for t, k in samples.items()) + "; "
            f"{machine()}; {load()}; {stamp()}.\n\n" + table(records, targets)
            + (f"\n\n**Held out** (every {HELD_OUT_EVERY}th test of the float32 list, index % {HELD_OUT_EVERY} == "
               f"{HELD_OUT_PART}" if SUITE == "node" else "\n\n**Held out** (the whole suite")
            + (f", less the {len(SEEN)} tests of the runs the rules were written from" if SEEN else "")
            + f": {len(held)} of these tests; no rule was written from them):\n\n" + table(held, targets)
            + "\n\n" + failures(records, targets))
    if a.preface:  # what the run was (processes, samples, rule changes), written above the figures
        body = Path(a.preface).read_text().rstrip() + "\n\n" + body
    print(body)
    if a.write:
        write_section(a.section or ("conformance" if a.form == "inputs" else "conformance-initializers"), body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
