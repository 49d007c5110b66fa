"""The fault and attack matrix of issues 9 and 29, re-run: every case is a real test (real sshd instances on
127.0.0.1, real agents, real bundles) and this script runs them, times them and tabulates what held.

One implementation: the cases are the tests themselves (listed below with the guarantee each shows);
the script runs them with pytest's JUnit output, reads it back, and writes the table to
docs/BENCHMARKS.md (section `fault_matrix`). docs/RELIABILITY.md says what each guarantee means.

    .venv/bin/python bench/fault_matrix.py [--no-write]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import load, machine, md_table, stamp, write_section  # noqa: E402

# (area, guarantee, test node id) — the guarantee is what the test asserts, in a user's words.
CASES = [
    ("host keys", "an unknown host key is refused unless trusted, then recorded",
     "tests/devices/test_ssh.py::test_ssh_unknown_host_key_refused_unless_trusted_then_recorded"),
    ("host keys", "a changed host key is always refused",
     "tests/devices/test_ssh.py::test_ssh_changed_host_key_always_refused"),
    ("host keys", "a known_hosts with @cert-authority/@revoked, hashed and broken lines reads as OpenSSH reads "
                  "it; a @revoked device key is refused (never recorded)",
     "tests/devices/test_ssh.py::test_known_hosts_markers_are_read_as_openssh_reads_them"),
    ("auth", "a wrong key is refused in one line, not retried",
     "tests/devices/test_ssh.py::test_ssh_wrong_key_refused"),
    ("auth", "a missing key file is refused at once",
     "tests/devices/test_ssh.py::test_a_missing_key_file_is_refused_at_once_not_retried_as_a_network_error"),
    ("network", "ProxyJump is honoured (1 and 2 hops, the jump's key checked), never bypassed: jump host down, "
                "the push fails in one line",
     "tests/devices/test_ssh.py::test_proxyjump_is_honoured_never_bypassed"),
    ("network", "an unreachable port is a device error with a hint",
     "tests/devices/test_ssh.py::test_ssh_unreachable_port_is_a_device_error"),
    ("network", "a port that accepts TCP but never speaks SSH is reported once (~2 s)",
     "tests/devices/test_ssh.py::test_a_port_that_never_speaks_ssh_is_reported_once"),
    ("network", "a command that hangs on the device is given up at its timeout",
     "tests/devices/test_ssh.py::test_ssh_command_timeout"),
    ("network", "a frozen upload (sshd session SIGSTOPped) is given up at its progress deadline",
     "tests/devices/test_transfer_stall.py::test_a_frozen_upload_is_given_up_at_its_deadline"),
    ("network", "Ctrl-C during a frozen upload stops at once (not at the stall deadline) and prints the devices "
                "that had finished",
     "tests/devices/test_transfer_stall.py::test_ctrl_c_during_a_frozen_upload_stops_at_once_and_prints_what_"
     "finished"),
    ("quoting", "a device root with spaces and shell characters works (every remote command quoted)",
     "tests/devices/test_push.py::test_push_to_root_with_spaces_and_shell_characters"),
    ("quoting", "remote commands are quoted argv, never a shell built from device data",
     "tests/devices/test_ssh.py::test_ssh_connects_with_known_host_key_and_runs_quoted_command"),
    ("atomic upload", "a connection dropped mid-push leaves nothing installed",
     "tests/devices/test_push.py::test_push_interrupted_by_dropped_connection_leaves_nothing_installed"),
    ("atomic upload", "an interrupted upload is swept by the next install; free space reported",
     "tests/agent/test_store_integrity.py::test_an_interrupted_upload_is_swept_by_the_next_install_and_has_"
     "reports_free_space"),
    ("disk", "a bundle larger than the device's free space is refused before sending, the margin stated "
             "(real tmpfs)",
     "tests/devices/test_disk_full.py::test_too_little_space_is_refused_before_sending"),
    ("disk", "a read-only filesystem under the root says read-only, not 'no space' (tmpfs remounted ro)",
     "tests/devices/test_disk_full.py::test_a_read_only_filesystem_says_read_only"),
    ("disk", "a disk that fills mid-transfer: one line (not 'connection lost'), bytes sent counted, no partial bundle",
     "tests/devices/test_disk_full.py::test_a_disk_that_fills_during_the_transfer_leaves_no_partial_bundle"),
    ("store integrity", "an edited manifest is not the installed bundle (has/verify/bench/activate)",
     "tests/agent/test_store_integrity.py::test_an_edited_manifest_is_not_the_installed_bundle"),
    ("store integrity", "runtime.artifact must be a listed file of the bundle",
     "tests/agent/test_store_integrity.py::test_the_runtime_artifact_must_be_a_listed_file_of_the_bundle"),
    ("store integrity", "a manifest with an unsafe path is refused by the host",
     "tests/devices/test_push.py::test_push_refuses_manifest_with_unsafe_path"),
    ("store integrity", "a corrupted file is found by verify and repaired",
     "tests/devices/test_push.py::test_push_corrupted_file_detected_by_verify_and_repaired"),
    ("store integrity", "repair of a slot's current bundle swaps the good copy in (never dangling)",
     "tests/agent/test_store_integrity.py::test_repair_of_a_current_bundle_swaps_in_the_good_copy"),
    ("store integrity", "a folder without manifest never blocks a reinstall",
     "tests/agent/test_store_integrity.py::test_a_store_folder_without_manifest_never_blocks_a_reinstall"),
    ("races", "gc never removes a bundle a slot refers to",
     "tests/agent/test_store_integrity.py::test_gc_never_removes_a_bundle_a_slot_refers_to"),
    ("races", "gc keeps a bundle a bench is running (lease) and an upload still being written (aged by its "
              "newest file: a stepped clock or one long file)",
     "tests/agent/test_store_integrity.py::test_gc_keeps_a_bundle_a_bench_is_running_and_an_upload_still_being_"
     "written"),
    ("trials", "an unconfirmed trial reverts at the next agent call after its deadline",
     "tests/agent/test_store_integrity.py::test_a_trial_is_reverted_at_the_next_agent_call_after_its_deadline"),
    ("trials", "the watchdog reverts a trial with no agent call at all; a commit keeps it",
     "tests/agent/test_store_integrity.py::test_the_watchdog_reverts_a_trial_with_no_agent_call_and_a_commit_"
     "keeps_it"),
    ("runtime", "a runtime killed by a signal is reported as crashed",
     "tests/agent/test_agent_bench.py::test_a_runtime_killed_by_a_signal_is_reported_as_crashed"),
    ("runtime", "a runtime that overruns its timeout is killed and reported as hung",
     "tests/agent/test_agent_bench.py::test_a_runtime_that_overruns_timeout_is_killed_and_reported_as_hung"),
    ("device", "a device without the python the inventory names: one clear error",
     "tests/devices/test_push.py::test_missing_python_on_device_is_one_clear_error"),
    ("secrets", "credentials in an inventory are refused, by key and by value, never echoed",
     "tests/devices/test_inventory.py::test_credentials_are_refused_by_value_too_and_never_echoed"),
    ("secrets", "credentials in other spellings (ssh://user:pw@host, a password with / or @, user: 'root:pw') "
                "are refused and never echoed by `edgeopt devices`",
     "tests/devices/test_inventory.py::test_cli_devices_never_echoes_a_credential_in_another_spelling"),
    ("secrets", "Ansible inventories with secrets are refused",
     "tests/devices/test_inventory.py::test_inventory_ansible_secrets_refused"),
    # issue 29: a careless or hostile neighbour (a second local user, a shared lab machine)
    ("neighbour", "a planted agent in a root others can write (0777) never runs: push refuses in one line, "
                  "the planted code's proof file never appears",
     "tests/devices/test_hostile_neighbour.py::test_a_planted_agent_in_a_root_others_can_write_never_runs"),
    ("neighbour", "a planted agent in a root (or parent) a real second user owns never runs",
     "tests/devices/test_hostile_neighbour.py::test_a_planted_agent_in_a_root_another_user_owns_never_runs"),
    ("neighbour", "a sticky world-writable parent (like /tmp) is fine for our own private root; without the "
                  "sticky bit it is refused",
     "tests/devices/test_hostile_neighbour.py::test_a_sticky_world_writable_parent_is_fine_for_our_own_private_"
     "root"),
    ("neighbour", "a damaged or altered agent (truncated store.py, planted files) is re-installed before it runs",
     "tests/devices/test_hostile_neighbour.py::test_a_damaged_or_altered_agent_is_reinstalled_before_it_runs"),
    ("neighbour", "a rejected install changes nothing outside the root (symlink, hard link, symlinked folder, "
                  "fifo: a 0640 file stays 0640)",
     "tests/agent/test_store_integrity.py::test_a_rejected_install_changes_nothing_outside_the_root"),
    ("neighbour", "an upload another process still holds open for writing is refused, not installed (its bytes "
                  "could change after they were hashed)",
     "tests/agent/test_store_integrity.py::test_an_upload_a_process_still_writes_is_refused_not_installed"),
    ("gc", "`devices gc --keep 1` keeps the rollback target: push v1, v2, gc, `edgeopt rollback` works (CLI); "
           "--keep 0 works",
     "tests/devices/test_hostile_neighbour.py::test_gc_keep_1_keeps_the_rollback_target_through_the_cli"),
    ("store integrity", "verify refuses a store file swapped for a link to identical bytes; slot folders are 0700",
     "tests/agent/test_store_integrity.py::test_verify_refuses_a_store_file_swapped_for_a_link_and_slot_folders_"
     "are_private"),
    ("store integrity", "an absolute, ../ or unlisted runtime.artifact is refused by the host: exit 2, nothing sent",
     "tests/devices/test_push.py::test_the_host_refuses_an_unsafe_runtime_artifact_before_sending"),
    ("inventory", "a device defined twice in a devices.yaml is refused with both line numbers",
     "tests/devices/test_inventory.py::test_a_device_defined_twice_is_refused_with_both_line_numbers"),
    ("inventory", "an Ansible host in two groups is one device with both groups' settings",
     "tests/devices/test_inventory.py::test_an_ansible_host_in_two_groups_is_one_device_with_both_groups"),
    ("device", "a device Python older than 3.8 (a real 3.6) is said in one line, before anything is installed",
     "tests/devices/test_push.py::test_a_device_python_older_than_3_8_is_said_in_one_line"),
    ("host", "SIGTERM stops a build and cleans up (exit 130)",
     "tests/core/test_signals.py::test_sigterm_stops_a_build_and_cleans_up"),
    ("fleet", "sshd SIGKILLed mid-wave: unreachable after retries, nothing half-installed",
     "tests/fleet/test_rollout_faults.py::test_sshd_stopped_mid_wave_is_unreachable_and_nothing_is_half_installed"),
    ("fleet", "sshd back within the retry window: the retry finishes the device",
     "tests/fleet/test_rollout_faults.py::test_sshd_back_within_the_retry_window_finishes_the_device"),
    ("fleet", "a device whose store cannot take the bundle fails alone",
     "tests/fleet/test_rollout_faults.py::test_a_device_whose_store_cannot_take_the_bundle_fails_alone"),
    ("fleet", "a halt after first installs puts devices back to nothing",
     "tests/fleet/test_rollout_faults.py::test_a_halt_after_first_installs_puts_devices_back_to_nothing"),
    # issue 38: a device that lies, a disk that fills, a store that is tampered with
    ("lying device", "a bench reply with NaN/Infinity/negative/huge numbers, a string or deep nesting is refused "
                     "for that device in one line; the good device is printed and stored",
     "tests/devices/test_lying_device.py::test_a_lying_device_is_refused_in_one_line_and_the_good_one_is_printed_"
     "and_stored"),
    ("lying device", "a `has` reply that cannot be true fails that device in one line",
     "tests/devices/test_lying_device.py::test_a_has_reply_that_cannot_be_true_fails_that_device_in_one_line"),
    ("lying device", "mutated replies (fuzz, corpus in the repo) are refused or read, never a traceback or a stored ok",
     "tests/devices/test_reply_fuzz.py::test_mutated_replies_are_refused_or_read_without_a_traceback"),
    ("store integrity", "push --verify replaces a store file swapped for a symlink outside the root, verifies "
                        "again, and fails if it is still wrong",
     "tests/devices/test_lying_device.py::test_push_verify_replaces_a_store_file_swapped_for_a_link_and_verifies_"
     "again"),
    ("neighbour", "a planted __pycache__/*.pyc in the agent folder is removed and never runs (-B)",
     "tests/devices/test_lying_device.py::test_a_planted_pyc_in_the_agent_folder_is_removed_and_never_runs"),
    ("disk", "a read-only agent root benches what it already holds",
     "tests/devices/test_lying_device.py::test_a_read_only_root_benches_what_it_already_holds"),
    ("disk", "a results database that fills during the bench keeps the measurement (table printed, JSON beside)",
     "tests/devices/test_lying_device.py::test_a_results_database_that_fills_during_the_bench_keeps_the_"
     "measurement"),
    ("inventory", "a key given twice in flow-style YAML is refused with line numbers",
     "tests/devices/test_inventory.py::test_a_key_given_twice_in_flow_style_is_refused_too"),
    ("store integrity", "two long model names with one prefix never share a slot (hash suffix)",
     "tests/agent/test_agent_store.py::test_two_long_model_names_with_one_prefix_get_two_slots"),
    ("races", "gc never takes an upload a process holds open, whatever its (clock-stepped) times",
     "tests/agent/test_store_integrity.py::test_gc_never_takes_an_upload_a_process_holds_open_whatever_its_times"),
    ("fleet", "a second rollout sharing a device is refused naming the first; a dead holder holds nothing",
     "tests/fleet/test_fleet_lock.py::test_a_second_rollout_on_a_shared_device_is_refused_naming_the_first"),
    ("energy", "absurd rail values are no measurement (never Infinity J/inf); a FIFO at a sensor path is refused, "
               "not read for ever",
     "tests/agent/test_energy.py::test_absurd_rail_values_are_no_measurement_never_infinity"),
    ("energy", "a FIFO planted at a sensor path is refused without blocking",
     "tests/agent/test_energy.py::test_a_fifo_at_a_sensor_path_is_refused_not_read_for_ever"),
    ("network", "Ctrl-C during bench stops at once, names the device that finished (stored) and the one "
                "interrupted",
     "tests/devices/test_transfer_stall.py::test_ctrl_c_during_bench_stops_at_once_and_names_the_device_that_"
     "finished"),
    ("neighbour", "an upload mapped shared and writable (descriptor closed) is refused, not installed",
     "tests/agent/test_store_integrity.py::test_a_shared_writable_mapping_of_an_upload_is_refused_not_installed"),
    ("device", "a device python that is Python 2.7 (no -I) is named in one line",
     "tests/devices/test_push.py::test_a_device_python_2_is_said_in_one_line_not_unknown_option"),
    ("suite", "the throttle-between-blocks test holds at any load (the agent pinned to one CPU at nice 10 beside busy loops)",
     "tests/hil/test_rig.py::test_throttling_between_blocks_drops_the_rounds_measured_after_it"),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    from junitparser import JUnitXml

    xml = Path(tempfile.mkdtemp(prefix="edgeopt-faults-")) / "faults.xml"
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
                           *[c[2] for c in CASES]], cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    got: dict[str, tuple[str, float, str]] = {}
    rank = {"held": 0, "skipped": 1, "BROKEN": 2}
    for suite in JUnitXml.fromfile(str(xml)):
        for case in suite:
            outcome = "held"
            why = ""
            for r in case.result or []:
                kind = type(r).__name__
                outcome = {"Failure": "BROKEN", "Error": "BROKEN", "Skipped": "skipped"}.get(kind, outcome)
                why = (r.message or "")[:120]
            name = case.name.split("[")[0]  # a parametrised test: every parameter must hold
            prev = got.get(name)
            if prev is None or rank[outcome] > rank[prev[0]]:
                got[name] = (outcome, float(case.time or 0) + (prev[1] if prev else 0.0), why)
            else:
                got[name] = (prev[0], prev[1] + float(case.time or 0), prev[2])
    rows = []
    for area, guarantee, node in CASES:
        name = node.split("::")[-1]
        outcome, secs, why = got.get(name, ("not run", 0.0, "not collected"))
        rows.append({"area": area, "guarantee": guarantee, "outcome": outcome + (f" ({why})" if why else ""),
                     "s": f"{secs:.1f}", "test": node.split("::")[0].replace("tests/", "")})
    held = sum(r["outcome"] == "held" for r in rows)
    body = (f"### Fault and attack matrix (`bench/fault_matrix.py`)\n\n{stamp()} · {machine()} · load before: "
            f"{load()}\n\n{len(rows)} cases, each a real test (real sshd on 127.0.0.1, real agents and bundles): "
            f"**{held} held**, {sum(r['outcome'].startswith('BROKEN') for r in rows)} broken, "
            f"{sum(r['outcome'].startswith('skipped') for r in rows)} skipped; {wall:.0f} s in all. What each "
            "guarantee means: docs/RELIABILITY.md.\n\n" + md_table(rows, [(k, k) for k in rows[0]]) + "\n")
    print(body)
    if proc.returncode not in (0, 1):
        print(proc.stdout[-3000:], proc.stderr[-3000:])
    if not a.no_write:
        write_section("fault_matrix", body)


if __name__ == "__main__":
    main()
