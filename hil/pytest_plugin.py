"""pytest plugin for hardware-in-the-loop tests (``pytest --edgeopt-rig rig.yaml``).

Registered with the ``pytest11`` entry point, so installing edgeopt makes it available. It is inert
unless ``--edgeopt-rig`` is given: nothing of edgeopt is imported, tests that use its fixtures skip
with the reason, every other test runs as before.

* ``--edgeopt-rig FILE``: the rig, an inventory (devices YAML, or an Ansible inventory; a ``rig:``
  section is allowed). ``--edgeopt-db PATH``: the results database [./edgeopt-results.db].
* fixture ``edgeopt_rig``: the ``edgeopt.inventory.Inventory``.
* fixture ``edgeopt_device``: one test per device of the rig (``[device-name]`` in the test id);
  ``@pytest.mark.hil(target="jetson-orin", label="lab", device="orin-1")`` keeps the devices whose
  target (aliases resolve: ``jetson`` = ``jetson-orin``), labels and name match (each a name or a list).
* fixture ``edgeopt_hil``: ``bench(bundle_dir, device, **opts)`` and ``gate(candidate, baseline, device,
  budget=...)``; their runs go to the results DB and their headline figures to the test's JUnit
  properties (``--junitxml``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

ENABLE = "run pytest with --edgeopt-rig FILE (a devices inventory) to run hardware-in-the-loop tests"
_STATE = "_edgeopt_hil_state"
FIXTURES = ("edgeopt_rig", "edgeopt_device", "edgeopt_hil")


def _skip(reason: str) -> None:
    """Skip the current test, reported at the test's own location (``-rs`` names the test file and line,
    not this plugin, where the skip happens to be raised)."""
    __tracebackhide__ = True
    try:
        exc = pytest.skip.Exception(reason, _use_item_location=True)
    except TypeError:  # a pytest without the keyword: the plain skip
        exc = pytest.skip.Exception(reason)
    raise exc


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("edgeopt", "edgeopt hardware-in-the-loop")
    group.addoption("--edgeopt-rig", metavar="FILE", default=None,
                    help="Rig for HIL tests: a devices YAML or an Ansible inventory. Without it, tests using "
                         "the edgeopt_* fixtures skip.")
    group.addoption("--edgeopt-db", metavar="PATH", default=None,
                    help="Results database for the HIL tests' benches and gates [./edgeopt-results.db].")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "hil(target=None, label=None, device=None): a hardware-in-the-loop test; "
                                       "with the edgeopt_device fixture, runs on the rig's matching devices")
    rig_path = config.getoption("--edgeopt-rig", default=None)
    state: dict[str, Any] = {"rig": None, "path": None,
                             "db": config.getoption("--edgeopt-db", default=None)}
    if rig_path:
        from edgeopt.errors import EdgeoptError
        from edgeopt.inventory import load_inventory

        try:
            state["rig"] = load_inventory(rig_path)
        except EdgeoptError as exc:
            raise pytest.UsageError(f"--edgeopt-rig: {exc.message}") from None
        state["path"] = str(Path(rig_path).resolve())
    setattr(config, _STATE, state)


def _state(config: pytest.Config) -> dict[str, Any]:
    return getattr(config, _STATE, None) or {"rig": None, "path": None, "db": None}


def _names(value: Any) -> list[str]:
    if value is None:
        return []
    items = [value] if isinstance(value, str) else list(value)
    return [p.strip() for item in items for p in str(item).split(",") if p.strip()]


def select(devices, target: Any = None, label: Any = None, device: Any = None) -> list:
    """The devices matching a ``hil`` mark's filters (targets compared canonically: aliases match)."""
    from edgeopt.inventory import canonical_target

    want_t = {canonical_target(t) for t in _names(target)}
    want_l, want_d = set(_names(label)), set(_names(device))
    return [d for d in devices
            if (not want_t or (d.target and canonical_target(d.target) in want_t))
            and (not want_l or want_l & set(d.labels))
            and (not want_d or d.name in want_d)]


def _filters(metafunc: pytest.Metafunc) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in metafunc.definition.iter_markers("hil"):  # closest first: a test's mark wins over its class's
        if m.args:
            out.setdefault("target", m.args[0])
        for k in ("target", "label", "device"):
            if k in m.kwargs:
                out.setdefault(k, m.kwargs[k])
        unknown = set(m.kwargs) - {"target", "label", "device"}
        if unknown:
            raise pytest.UsageError(f"{metafunc.definition.nodeid}: @pytest.mark.hil: unknown argument(s) "
                                    f"{', '.join(sorted(unknown))} (known: target, label, device)")
    return out


def _near(devices, flt: dict[str, Any]) -> str:
    """A did-you-mean for a mark's target/label/device that names nothing known (a typo skips silently)."""
    import difflib

    from edgeopt.inventory import canonical_target

    try:
        from edgeopt.targets.registry import ALIASES, all_targets

        known_targets = list(all_targets()) + list(ALIASES)
    except Exception:  # a registry that cannot load must not break collection
        known_targets = []
    known = {"target": known_targets + [d.target for d in devices if d.target],
             "label": [lb for d in devices for lb in d.labels], "device": [d.name for d in devices]}
    hints = []
    for key, val in flt.items():
        for name in _names(val):
            pool = known.get(key, [])
            if name in pool or (key == "target" and canonical_target(name) in pool):
                continue
            close = difflib.get_close_matches(name, sorted(set(pool)), n=1)
            hints.append(f"{key} {name!r} is unknown" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return ("; " + "; ".join(hints)) if hints else ""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "edgeopt_device" not in metafunc.fixturenames:
        return
    st = _state(metafunc.config)
    if st["rig"] is None:
        metafunc.parametrize("edgeopt_device", [pytest.param(None, marks=pytest.mark.skip(reason=ENABLE))],
                             ids=["no-rig"])
        return
    flt = _filters(metafunc)
    chosen = select(st["rig"].devices, **flt)
    if not chosen:
        why = ", ".join(f"{k}={v!r}" for k, v in flt.items())
        reason = f"no device of the rig {st['path']} matches {why}" + _near(st["rig"].devices, flt)
        metafunc.parametrize("edgeopt_device", [pytest.param(None, marks=pytest.mark.skip(reason=reason))],
                             ids=["no-device"])
        return
    metafunc.parametrize("edgeopt_device", chosen, ids=[d.name for d in chosen])


@pytest.fixture(scope="session")
def edgeopt_rig(request: pytest.FixtureRequest):
    """The rig given with --edgeopt-rig (an ``edgeopt.inventory.Inventory``); skips without it."""
    rig = _state(request.config)["rig"]
    if rig is None:
        _skip(ENABLE)
    return rig


@pytest.fixture
def edgeopt_device(request: pytest.FixtureRequest):
    """One device of the rig (the test is parametrised over the devices its ``hil`` mark selects)."""
    dev = getattr(request, "param", None)
    if dev is None:
        _skip(ENABLE)
    return dev


class Hil:
    """Bench and gate bundles on the rig from a test; every run goes to the results DB."""

    def __init__(self, rig, rig_path: str, db: str | None, node: pytest.Item | None = None,
                 device=None) -> None:
        from edgeopt.results import DEFAULT_DB

        self.rig, self.rig_path, self.node, self.device = rig, rig_path, node, device
        self.db = str(db or DEFAULT_DB)

    def _device(self, device):
        device = device if device is not None else self.device
        if device is None:
            pytest.fail("edgeopt_hil: no device given (pass one, or use the edgeopt_device fixture)", pytrace=False)
        if isinstance(device, str):
            from edgeopt.errors import EdgeoptError

            try:
                return self.rig.get(device)
            except EdgeoptError as exc:
                pytest.fail(f"edgeopt_hil: {exc}".replace("\n  hint: ", "; "), pytrace=False)
        return device

    def _prop(self, name: str, value: Any) -> None:
        if self.node is not None and value is not None:
            self.node.user_properties.append((f"edgeopt.{name}", value))

    def bench(self, bundle_dir: str | Path, device=None, check: bool = True, **opts: Any):
        """Bench every bundle under ``bundle_dir`` that ``device`` takes -> ``fleetbench.FleetResult``.
        ``opts``: ``edgeopt.api.bench_options`` (duration, min_iters, warmup, threads …). With ``check``,
        a failed run fails the test (its error as the message)."""
        from edgeopt.api import bench_options
        from edgeopt.deploy import find_bundles
        from edgeopt.errors import EdgeoptError
        from edgeopt.fleetbench import bench_fleet
        from edgeopt.results import ResultsDB

        dev = self._device(device)
        try:
            with ResultsDB(self.db) as rdb:
                res = bench_fleet([dev], find_bundles(bundle_dir), bench_options(**opts), db=rdb)
        except EdgeoptError as exc:
            pytest.fail(f"edgeopt bench on {dev.name}: {exc.message}", pytrace=False)
        self._prop("run_id", res.run_id)
        for r in res.records:
            lat = (r.bench or {}).get("latency_ms") or {}
            tag = f"{dev.name}.{r.bundle.get('target')}-{r.bundle.get('precision')}"
            self._prop(f"{tag}.status", r.status)
            self._prop(f"{tag}.p50_ms", lat.get("p50"))
            self._prop(f"{tag}.throughput_ips", (r.bench or {}).get("throughput_ips"))
        if check:
            bad = [r for r in res.records if not r.ok]
            if bad:
                pytest.fail(f"edgeopt bench on {dev.name}: " + "; ".join(
                    f"{r.bundle.get('model')} {r.status}: {(r.error or {}).get('message')}" for r in bad),
                    pytrace=False)
        return res

    def gate(self, candidate: str | Path, baseline: str | Path, device=None, budget: str | float = "30s",
             gate: str | None = None, check: bool = True, **kw: Any) -> dict[str, Any]:
        """``edgeopt gate`` on one device of the rig -> the gate's result (``verdict``, per device the
        verdicts). With ``check``: *regressed* fails the test, *inconclusive* skips it, a device or rig
        failure fails it as infrastructure (the message says which) — JUnit's failure/skipped."""
        from edgeopt import api
        from edgeopt.errors import EdgeoptError

        dev = self._device(device)
        try:
            res = api.gate(candidate, baseline, devices=self.rig_path, limit=dev.name, gate=gate, budget=budget,
                           db=self.db, raise_on_failure=False, **kw)
        except EdgeoptError as exc:
            pytest.fail(f"edgeopt gate on {dev.name}: {exc.message}", pytrace=False)
        self._prop("gate_id", res.get("gate_id"))
        self._prop(f"{dev.name}.gate", res.get("verdict"))
        for d in res.get("devices") or []:
            for v in d.get("verdicts") or []:
                self._prop(f"{d['device']}.{v['metric']}", f"{v['verdict']} ratio={v.get('ratio')} "
                                                          f"ci=[{v.get('ci_low')}, {v.get('ci_high')}] n={v.get('n')}")
        if check:
            verdict = res.get("verdict")
            from edgeopt.hil.junit import verdict_cells

            lines = "; ".join(f"{v['metric']} {v['verdict']} ({verdict_cells(v)['change']})"
                              for d in res.get("devices") or [] for v in d.get("verdicts") or []
                              if v.get("ratio") is not None)
            if verdict == "regressed":
                pytest.fail(f"edgeopt gate on {dev.name}: REGRESSED: {lines}", pytrace=False)
            if verdict == "inconclusive":
                _skip(f"edgeopt gate on {dev.name}: inconclusive within {budget}: {lines}")
            if verdict not in ("pass", "improved"):
                errs = "; ".join(str(d.get("error") or d.get("skipped") or d.get("status"))
                                 for d in res.get("devices") or [])
                pytest.fail(f"edgeopt gate on {dev.name}: infrastructure {verdict}: {errs}", pytrace=False)
        return res


@pytest.fixture
def edgeopt_hil(request: pytest.FixtureRequest) -> Hil:
    """Bench/gate helper bound to the rig, the results DB, this test's JUnit properties and (when the
    test also uses ``edgeopt_device``) its device."""
    st = _state(request.config)
    if st["rig"] is None:
        _skip(ENABLE)
    dev = request.getfixturevalue("edgeopt_device") if "edgeopt_device" in request.fixturenames else None
    return Hil(st["rig"], st["path"], st["db"], request.node, dev)
