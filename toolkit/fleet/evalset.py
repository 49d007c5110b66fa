"""``rollout --eval DATA``: a labelled evaluation set scored on each device, candidate beside incumbent.

DATA is a ``.npz`` with one array per model input (samples on axis 0, the ONNX layout; the batch axis
may be left out for batch-1 models) and ``labels``: the expected class per sample (an integer array
``[N]``, scored against the argmax of the first output). The file goes to the device once
(``<root>/eval/<sha256>.npz``, content-addressed, renamed into place); the labels never leave the host.
On the device both bundles run every sample (agent verb ``evaluate``); here each gets its top-1
accuracy, and the candidate fails the gate when it scores more than ``max_drop`` below the incumbent
(or below ``min_accuracy`` when the device has no incumbent and one is set).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeopt.errors import UsageError


@dataclass
class EvalSet:
    path: Path
    sha256: str
    labels: np.ndarray
    max_drop: float = 0.01
    min_accuracy: float | None = None

    @property
    def n(self) -> int:
        return int(self.labels.shape[0])

    @property
    def remote_name(self) -> str:
        return f"{self.sha256}.npz"

    def score(self, decisions: list[list[int]]) -> float:
        """Top-1 accuracy of one bundle's decisions (first decision of each sample) against the labels."""
        got = np.array([d[0] if d else -1 for d in decisions])
        return float(np.mean(got == self.labels)) if len(got) == self.n else float("nan")


def load_eval(path: str | Path, bundles: list, max_drop: float = 0.01, min_accuracy: float | None = None) -> EvalSet:
    """Check DATA against every bundle's inputs before anything is sent (UsageError, exit 2)."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"--eval: {str(p)!r} does not exist", hint="a .npz with the model's inputs and `labels`")
    try:
        with np.load(p, allow_pickle=False) as z:
            arrays = {k: np.asarray(z[k]) for k in z.files}
    except Exception as exc:  # noqa: BLE001 - numpy raises several kinds on a damaged file
        raise UsageError(f"--eval: {p} is not a readable .npz ({type(exc).__name__}: {exc})") from None
    labels = arrays.get("labels")
    if labels is None or labels.ndim != 1 or labels.dtype.kind not in "iu" or not len(labels):
        raise UsageError(f"--eval: {p} needs `labels`, an integer array with one class per sample",
                         hint=f"it has: {', '.join(f'{k}{list(v.shape)}' for k, v in arrays.items())}")
    for b in bundles:
        manifest = json.loads((Path(b.path) / "manifest.json").read_text())
        for spec in manifest["io"]["inputs"]:
            a = arrays.get(spec["name"])
            if a is None:
                raise UsageError(f"--eval: {p} has no array for input {spec['name']!r} of {b.model}",
                                 hint=f"it has: {', '.join(arrays)}")
            if a.shape[0] != len(labels):
                raise UsageError(f"--eval: {spec['name']!r} has {a.shape[0]} samples but `labels` has {len(labels)}")
            shape = list(spec.get("shape") or [])
            per = list(a.shape[1:]) if a.ndim == len(shape) + 1 else [1, *a.shape[1:]]
            if shape and [int(x) for x in per] != [int(x) for x in shape]:
                raise UsageError(f"--eval: samples of {spec['name']!r} are {per}, the bundle of {b.target} "
                                 f"takes {shape}")
    if not 0 <= max_drop < 1:
        raise UsageError(f"--eval-max-drop must be in [0, 1), got {max_drop}")
    # what goes to devices: the inputs only (the labels stay here), written once per rollout
    import tempfile

    sent = Path(tempfile.mkdtemp(prefix="edgeopt-eval-")) / "inputs.npz"
    np.savez(sent, **{k: v for k, v in arrays.items() if k != "labels"})
    digest = hashlib.sha256(sent.read_bytes()).hexdigest()
    return EvalSet(sent, digest, labels.astype(np.int64), max_drop, min_accuracy)


def upload(sess, ev: EvalSet) -> str:
    """Put the evaluation file on the device once (content-addressed); returns its remote name."""
    tr = sess.transport
    folder = posixpath.join(sess.root, "eval")
    final = posixpath.join(folder, ev.remote_name)
    if tr.stat(final) is None:
        tr.mkdir(folder)
        tmp = final + ".part"
        tr.put(ev.path, tmp)
        try:
            tr.rename(tmp, final)
        except OSError:
            if tr.stat(final) is None:  # not a concurrent upload that won
                raise
    return ev.remote_name


def gate(sess, ev: EvalSet, incumbent: str | None, candidate: str, timeout: float) -> dict[str, Any]:
    """Score candidate (and incumbent) on the device; ``{"passed", "candidate", "incumbent", "n", "reason"}``."""
    from edgeopt.errors import DeviceError

    name = upload(sess, ev)
    ids = [incumbent, candidate] if incumbent else [candidate]
    reply = sess.agent("evaluate", {"root": sess.root, "bundle_ids": ids, "data": name}, timeout=timeout)
    if not reply.get("ok"):
        e = reply.get("error") or {}
        raise DeviceError(f"{sess.device.name}: evaluate failed: {e.get('type')}: {e.get('message')}")
    arms = reply["evaluate"]["arms"]
    scores = [ev.score(a["decisions"]) for a in arms]
    cand = scores[-1]
    inc = scores[0] if incumbent else None
    out: dict[str, Any] = {"metric": "eval_top1", "n": ev.n, "candidate": cand, "incumbent": inc,
                           "max_drop": ev.max_drop, "passed": True, "reason": ""}
    if inc is not None and not cand >= inc - ev.max_drop - 1e-12:
        out.update(passed=False, reason=f"eval top-1 {cand:.1%} vs the incumbent's {inc:.1%} on {ev.n} labelled "
                                        f"samples: dropped more than {ev.max_drop:.1%}")
    elif inc is None and ev.min_accuracy is not None and cand < ev.min_accuracy:
        out.update(passed=False, reason=f"eval top-1 {cand:.1%} on {ev.n} labelled samples < {ev.min_accuracy:.1%}")
    return out
