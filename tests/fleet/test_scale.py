"""Host-side cost per device of a rollout (issue 28 item 9): the agent files' sums are computed once per
content, never served stale. Real files, real sha256."""

from __future__ import annotations

import hashlib
import os

from edgeopt.deploy import agent_package, file_sum


def test_a_file_changed_right_after_it_was_hashed_is_hashed_again(tmp_path):
    f = tmp_path / "agent.py"
    f.write_bytes(b"A" * 4096)
    assert file_sum(f) == (hashlib.sha256(b"A" * 4096).hexdigest(), 4096)
    # same size, same inode, and (here) within one timestamp tick: the key alone could not tell
    with open(f, "r+b") as fh:
        fh.write(b"B")
    st = os.stat(f)
    assert file_sum(f) == (hashlib.sha256(b"B" + b"A" * 4095).hexdigest(), 4096)
    # a rewrite whose mtime is put back to an old one (as some copy tools do): its ctime moved, hashed again
    os.utime(f, ns=(st.st_atime_ns - 10**10, st.st_mtime_ns - 10**10))
    old = file_sum(f)
    f.write_bytes(b"C" * 4096)
    os.utime(f, ns=(st.st_atime_ns - 10**10, st.st_mtime_ns - 10**10))
    assert file_sum(f) != old and file_sum(f)[0] == hashlib.sha256(b"C" * 4096).hexdigest()


def test_the_agent_package_digest_is_the_files_own(tmp_path):
    pkg = agent_package()
    h = hashlib.sha256()
    for rel, p in pkg.files:
        h.update(rel.encode() + b"\0" + hashlib.sha256(p.read_bytes()).digest())
    assert pkg.digest == h.hexdigest() == agent_package().digest
