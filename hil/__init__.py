"""Hardware-in-the-loop rigs (``edgeopt.hil``): the regression gate CI trusts, and what it stands on.

- ``gate``: ``edgeopt gate`` (paired, interleaved measurement; ``results:NAME`` for a stored baseline);
- ``paired``, ``stats``: the interleaved rounds and their statistics (HL ratios, bootstrap intervals, Holm);
- ``gatefile``: thresholds (``gate.yaml``); ``junit``: JUnit XML and Markdown;
- ``rig``: the rig file's ``rig:`` policy (health, prepare/restore, power cycle, quarantine);
- ``baseline``: stored baselines; ``history``: runs over time with change points;
- ``pytest_plugin``: ``pytest --edgeopt-rig rig.yaml`` (registered as a ``pytest11`` entry point).
"""
