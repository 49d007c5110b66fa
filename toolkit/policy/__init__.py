"""The one accuracy policy and its statistics, below every command and rig.

``edgeopt.policy`` is imported by the build (host check, ``auto``, every INT8 search), the report and its
SHIP verdicts, the gate, the rollout, ``tune`` and ``debug``; it imports none of them (only
``edgeopt.errors`` and the agent's ``edgeopt_agent.compare``, where the output kinds and metrics live
because the device computes them too).

* ``gatefile``: the gate file (``GATE.yaml``, ``--accept FILE``): thresholds and their defaults.
* ``stats``: the gate's statistics (paired and unpaired intervals, Holm, the accuracy/decision verdicts).
* ``accept``: the policy itself: ``accept.judge(accuracy)`` -> ``Acceptance`` (accepted or refused, the
  metric that decided, its value and threshold, k of n distinct samples with an interval).
"""
