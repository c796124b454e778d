"""`python -m calib.cluster wait`: a node the autoscaler could not start ends the wait at once, naming the node
and its log; the autoscaler's status is faked the way Ray's monitor publishes it (``AutoscalerSummary`` as
JSON under ``__autoscaling_status``)."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
import ray
from ray.autoscaler._private.autoscaler import AutoscalerSummary

from calib.cluster import main
from calib.cluster import nodes as cluster_nodes

HEAD = {"Alive": True, "NodeManagerHostname": "head", "NodeManagerAddress": "10.0.0.1",
        "Resources": {"CPU": 2.0, "node:__internal_head__": 1.0}}
WORKER = {"Alive": True, "NodeManagerHostname": "w2", "NodeManagerAddress": "10.0.0.2", "Resources": {"CPU": 2.0}}


def published(failed: list[tuple[str, str]], pending: list[tuple[str, str, str]] = ()) -> dict:
    """What the head's monitor writes: its load report plus ``asdict(AutoscalerSummary)``, through JSON."""
    summary = AutoscalerSummary(active_nodes={"ray.head.default": 1, "ray.worker.default": 1}, idle_nodes=None,
                                pending_nodes=list(pending), pending_launches={}, failed_nodes=failed, legacy=True)
    return json.loads(json.dumps({"time": 0.0, "monitor_pid": 1, "autoscaler_report": asdict(summary)}))


def test_failed_nodes_are_the_reported_ones_that_are_not_alive():
    status = published([("10.0.0.3", "ray.worker.default"), ("10.0.0.2", "ray.worker.default")])
    assert cluster_nodes.failed_nodes(status, [HEAD, WORKER]) == [("10.0.0.3", "ray.worker.default")]
    # a node still being set up is pending, not failed; no report yet is no failure
    assert cluster_nodes.failed_nodes(published([], [("10.0.0.3", "ray.worker.default", "setting-up")]),
                                      [HEAD]) == []
    assert cluster_nodes.failed_nodes(None, [HEAD]) == []
    assert cluster_nodes.failed_nodes({"load_metrics_report": {}}, [HEAD]) == []


@pytest.fixture
def fake_cluster(monkeypatch: pytest.MonkeyPatch):
    """A cluster with the head and one worker alive; ``reports`` are the autoscaler's successive statuses."""
    reports: list[dict | None] = []
    reads = []

    def status():
        reads.append(1)
        return reports[min(len(reads), len(reports)) - 1] if reports else None

    monkeypatch.setattr(ray, "init", lambda **kwargs: None)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    monkeypatch.setattr(cluster_nodes, "alive_nodes", lambda: [HEAD, WORKER])
    monkeypatch.setattr(cluster_nodes, "autoscaler_status", status)
    monkeypatch.setattr(cluster_nodes, "_autoscaler_log", lambda: "/tmp/ray/session_x/logs/monitor.out")
    monkeypatch.setattr(cluster_nodes.time, "sleep", lambda seconds: None)
    return reports, reads


def test_wait_exits_1_at_the_first_report_of_a_failed_node(fake_cluster, capsys):
    reports, reads = fake_cluster
    reports += [None, published([]), published([("10.0.0.3", "ray.worker.default")])]
    assert main(["wait", "--nodes", "3", "--timeout", "600"]) == 1
    assert len(reads) == 3  # the third poll saw the failure; the 600 s timeout was not waited out
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: the autoscaler could not start 10.0.0.3 (ray.worker.default)")
    assert "/tmp/ray/session_x/logs/monitor.out on the head" in err[0] and "2 of 3 nodes alive" in err[0]
    assert "worker w2 (10.0.0.2)" in err[0]


def test_wait_without_failures_times_out_naming_the_nodes_it_saw(fake_cluster, capsys, monkeypatch):
    reports, _ = fake_cluster
    reports.append(published([]))
    clock = iter(range(0, 10_000, 100))
    monkeypatch.setattr(cluster_nodes.time, "monotonic", lambda: next(clock))
    assert main(["wait", "--nodes", "3", "--timeout", "600"]) == 1
    err = capsys.readouterr().err
    assert "2 of 3 nodes alive after 600 s: head head (10.0.0.1): CPU 2; worker w2 (10.0.0.2): CPU 2" in err


def test_wait_returns_when_the_nodes_are_up_even_with_an_old_failure_of_a_replaced_node(fake_cluster, capsys):
    reports, _ = fake_cluster
    reports.append(published([("10.0.0.2", "ray.worker.default")]))  # 10.0.0.2 failed once, is alive now
    assert main(["wait", "--nodes", "2"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "2 nodes up:"
