"""Hardware-in-the-loop rigs (``edgeopt.hil``): rig files, a pytest plugin and the local rig used in CI.

Planned (see docs/ARCHITECTURE.md); the device side it builds on — the agent, SSH transport, push,
bench and the results database — is in place. Nothing here yet.
"""
