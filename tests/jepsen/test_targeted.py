"""One scenario per finding of the cluster-safety issue, each on a fresh cluster in its own network
namespaces (run one alone with ``-k f3``). What each shows is in scenarios.py; every run ends with a
heal, a drain of the queue and the checker (checker.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from . import scenarios
from .runner import WorkloadConfig

pytestmark = pytest.mark.jepsen
Jepsen = Callable[..., Any]
# Short scenarios that wait for a killed or cut-off leader's lease to run out: the same rules on a shorter
# clock than the default 10 s. The others (and the random schedule) keep the default: their leaders must
# ride out slow etcd answers under load for longer than 4 s without stepping down.
SHORT_LEASE = {"clustering_lease_ttl": 5}


@pytest.mark.timeout(240)
def test_f1_isr_shrink_is_committed_before_confirms(jepsen: Jepsen) -> None:
    jepsen("F1", scenarios.f1_isr_shrink, node_config=SHORT_LEASE)


@pytest.mark.timeout(240)
def test_f2_follower_joins_the_isr_only_when_caught_up(jepsen: Jepsen) -> None:
    jepsen("F2", scenarios.f2_join_caught_up)


@pytest.mark.timeout(240)
def test_f3_leader_cut_off_from_etcd_stops_before_its_lease_expires(jepsen: Jepsen) -> None:
    jepsen("F3", scenarios.f3_lease_deadline, node_config=SHORT_LEASE)


@pytest.mark.timeout(240)
def test_f4_follower_rejoins_after_a_silent_partition(jepsen: Jepsen) -> None:
    jepsen("F4", scenarios.f4_silent_partition)


@pytest.mark.timeout(300)
def test_f5_follower_on_a_full_disk_acknowledges_no_short_write(jepsen: Jepsen) -> None:
    jepsen("F5", scenarios.f5_full_disk)


@pytest.mark.timeout(240)
def test_f6_follower_whose_fsync_failed_recopies_before_it_counts(jepsen: Jepsen) -> None:
    jepsen("F6", scenarios.f6_fsync_eio, needs_shim=True)


@pytest.mark.timeout(300)
def test_f7_half_synced_follower_never_leads(jepsen: Jepsen) -> None:
    jepsen("F7", scenarios.f7_half_synced, workload=WorkloadConfig(declare_interval=5.0))


@pytest.mark.timeout(240)
def test_f8_nodes_move_on_from_an_etcd_endpoint_that_answers_errors(jepsen: Jepsen) -> None:
    jepsen("F8", scenarios.f8_etcd_endpoint_errors, etcd=3)


@pytest.mark.timeout(240)
def test_f9_follower_cut_off_from_the_leader_does_not_depose_it(jepsen: Jepsen) -> None:
    jepsen("F9", scenarios.f9_healthy_leader)


@pytest.mark.timeout(240)
def test_f10_no_leader_without_the_isr_key_until_an_operator_says_so(jepsen: Jepsen) -> None:
    jepsen("F10-ISR", scenarios.f10_isr_key_deleted, node_config=SHORT_LEASE)


@pytest.mark.timeout(240)
def test_f10_data_dir_restored_from_an_old_backup_never_leads(jepsen: Jepsen) -> None:
    jepsen("F10-BACKUP", scenarios.f10_old_backup, node_config=SHORT_LEASE)
