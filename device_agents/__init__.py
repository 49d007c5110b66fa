"""The on-device agent of edgeopt.

Run on a device as ``python3 -m edgeopt_agent VERB`` with JSON in (stdin or --request) and
JSON out (stdout).  It needs the standard library and numpy alone; each runtime is imported
lazily, inside the runner that uses it.  The schema is written down in SCHEMA.md.
"""

AGENT_VERSION = "0.1.0"
SCHEMA_VERSION = 1
