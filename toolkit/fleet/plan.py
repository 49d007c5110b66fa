"""A rollout's plan: which devices, in which wave, get which bundle — decided before anything changes.

Waves are cumulative (``1,10%,50%,100%``: the canary is one device, then up to 10% of the fleet, …);
devices are ordered by a stable hash of (model, device name), so a resume — or a re-run of the same
rollout — picks the same devices for the same waves.  Every wave adds at least one device and never more
than its cap (or that one device, when the cap is not above what earlier waves cover): ``1,10%`` on 6
devices is 2 devices in all, the other 4 stay out (``Plan.left_out``).  ``--max-fail`` follows Ansible's rule: a wave
fails when its failures *exceed* the limit (a count, or a percentage of the wave).
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field
from typing import Any

from edgeopt.errors import UsageError

_PCT = re.compile(r"^(\d+(?:\.\d+)?)%$")


@dataclass(frozen=True)
class WaveSpec:
    value: float
    percent: bool

    def upto(self, total: int) -> int:
        """Devices covered once this wave is done (cumulative)."""
        n = math.ceil(total * self.value / 100) if self.percent else int(self.value)
        return max(1, min(total, n))

    def __str__(self) -> str:
        return f"{self.value:g}%" if self.percent else f"{int(self.value)}"


def parse_waves(text: str) -> list[WaveSpec]:
    """``1,10%,50%,100%`` → wave specs; refuses 0, > 100%, and waves that shrink."""
    specs = []
    for part in [p.strip() for p in str(text).split(",")]:
        m = _PCT.match(part)
        try:
            spec = WaveSpec(float(m.group(1)), True) if m else WaveSpec(float(int(part)), False)
        except ValueError:
            raise UsageError(f"--waves: {part!r} is not a device count or a percentage (e.g. 1,10%,50%,100%)") \
                from None
        if spec.value <= 0 or (spec.percent and spec.value > 100):
            raise UsageError(f"--waves: {part!r} is out of range (a count >= 1 or a percentage in (0, 100])")
        prev = next((x for x in reversed(specs) if x.percent == spec.percent), None)
        if prev is not None and spec.value < prev.value:
            raise UsageError(f"--waves: {part!r} comes after {prev}: waves are cumulative and cannot shrink")
        specs.append(spec)
    if not specs:
        raise UsageError("--waves is empty")
    return specs


def parse_max_fail(text: str | int | None) -> tuple[float, bool]:
    """``0``, ``2`` or ``10%`` → (value, is_percent)."""
    if text is None:
        return 0.0, False
    t = str(text).strip()
    m = _PCT.match(t)
    try:
        value, pct = (float(m.group(1)), True) if m else (float(int(t)), False)
    except ValueError:
        raise UsageError(f"--max-fail: expected a count (0, 2) or a percentage (10%), got {text!r}") from None
    if value < 0 or (pct and value > 100):
        raise UsageError(f"--max-fail: {text!r} is out of range")
    return value, pct


def wave_failed(failures: int, size: int, max_fail: tuple[float, bool]) -> bool:
    """Ansible's rule: failures must *exceed* the limit."""
    value, pct = max_fail
    return failures > (size * value / 100 if pct else value)


def parse_select(items: list[str] | None) -> dict[str, set[str]]:
    """``label=lab,target=jetson-orin`` (repeatable) → {key: values}; keys: label, target, name."""
    out: dict[str, set[str]] = {}
    for item in items or []:
        for part in [p.strip() for p in item.split(",") if p.strip()]:
            key, eq, value = part.partition("=")
            if not eq or key not in ("label", "target", "name") or not value:
                raise UsageError(f"--select: {part!r} is not label=NAME, target=NAME or name=NAME")
            out.setdefault(key, set()).add(value)
    return out


def selected(device, select: dict[str, set[str]]) -> bool:
    from edgeopt.inventory import canonical_target

    if "label" in select and not (select["label"] & set(device.labels)):
        return False
    if "target" in select and canonical_target(device.target or "") not in {canonical_target(t) for t in
                                                                           select["target"]}:
        return False
    return not ("name" in select and device.name not in select["name"])


def stable_order(devices: list, key: str) -> list:
    return sorted(devices, key=lambda d: hashlib.sha256(f"{key}\0{d.name}".encode()).hexdigest())


@dataclass
class Plan:
    model: str
    waves: list[list[dict[str, Any]]] = field(default_factory=list)  # per wave: {device, bundle_id, target, …}
    skipped: list[dict[str, str]] = field(default_factory=list)
    wave_specs: list[str] = field(default_factory=list)
    left_out: int = 0  # devices that take a bundle but lie beyond the last wave (the waves stop below 100%)

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "waves": self.waves, "skipped": self.skipped, "wave_specs": self.wave_specs,
                "left_out": self.left_out}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        """The plan as the journal keeps it (``as_dict``): what a resume rolls out, device by device."""
        return cls(str(d["model"]), [list(w) for w in d.get("waves", [])], list(d.get("skipped", [])),
                   list(d.get("wave_specs", [])), int(d.get("left_out", 0)))


def make_plan(devices: list, bundles: list, waves: list[WaveSpec], select: dict[str, set[str]] | None = None
              ) -> Plan:
    """Each selected device gets the bundle of its own target; waves by stable hash."""
    from edgeopt.inventory import canonical_target

    models = sorted({b.model for b in bundles})
    if len(models) != 1:
        raise UsageError(f"a rollout ships one model; these bundles are of {len(models)}: {', '.join(models)}")
    by_target: dict[str, Any] = {}
    for b in bundles:
        t = canonical_target(b.target)
        if t in by_target and by_target[t].bundle_id != b.bundle_id:
            import os
            import shlex

            def ref(x: Any) -> str:  # the folder as the user would type it: relative to here when under it
                rel = os.path.relpath(x.path)
                return shlex.quote(str(x.path) if rel.startswith("..") else rel)

            pair = sorted([by_target[t], b], key=lambda x: str(x.path))
            raise UsageError(f"two bundles for target {t!r} ({', '.join(f'{x.precision}: {ref(x)}' for x in pair)}): "
                             "a device runs one bundle per model and target",
                             hint="name the one to ship: " + " or ".join(
                                 f"edgeopt rollout {ref(x)} --devices FILE" for x in pair))
        by_target[t] = b
    plan = Plan(models[0], wave_specs=[str(w) for w in waves])
    chosen = [d for d in devices if selected(d, select or {})]
    if not chosen:
        raise UsageError("--select matches no device of the inventory")
    eligible = []
    for d in chosen:
        b = by_target.get(canonical_target(d.target)) if d.target else None
        if b is None:
            plan.skipped.append({"device": d.name, "reason": f"no bundle for target {d.target!r}" if d.target
                                 else "the device has no `target` in the inventory"})
        else:
            eligible.append((d, b))
    if not eligible:
        raise UsageError("no device takes any of these bundles: " + "; ".join(
            f"{s['device']}: {s['reason']}" for s in plan.skipped))
    order = stable_order([d for d, _ in eligible], plan.model)
    bundle_of = {d.name: b for d, b in eligible}
    done = 0
    for w in waves:
        if done >= len(order):
            break
        # every wave adds at least one device and no more than its cap (or that one device): a wave whose
        # cap is not above what is done (`1,10%` on 6 devices: 10% is 1) adds one, it never takes the rest
        upto = max(w.upto(len(order)), done + 1)
        plan.waves.append([{"device": d.name, "target": bundle_of[d.name].target,
                            "bundle_id": bundle_of[d.name].bundle_id, "bytes": bundle_of[d.name].size}
                           for d in order[done:upto]])
        done = upto
    if done < len(order):  # the last wave given was below 100%: the rest are not part of this rollout
        plan.skipped.extend({"device": d.name, "reason": "beyond the last wave"} for d in order[done:])
        plan.left_out = len(order) - done
    return plan
