"""Waiting for a cluster node that fits a trial: fake node lists stand in for ``ray.nodes()``."""

from __future__ import annotations

import pytest

from calib._config import ConfigError
from calib.run.execution import ExecutionOptions
from calib.run.resources import (
    RESOURCE_WAIT_ENV,
    alive_node_resources,
    describe_nodes,
    resource_wait_seconds,
    unplaceable_roles,
    wait_for_resources,
)

GPU_TRIALS = ExecutionOptions(address="auto", cpus_per_trial=4, gpus_per_trial=1, cpus_per_cached_trial=1,
                              gpus_per_cached_trial=0.25)
CPU_NODE = {"CPU": 4.0, "memory": 1e9}
GPU_NODE = {"CPU": 4.0, "GPU": 1.0}


@pytest.fixture(autouse=True)
def autoscaler(monkeypatch):
    """What the wait asked the autoscaler for, in order (no Ray here)."""
    import calib.run.resources as resources

    asked: list[list[dict[str, float]]] = []
    monkeypatch.setattr(resources, "ask_autoscaler", lambda requests: asked.append([dict(r) for r in requests]))
    return asked


class Nodes:
    """Successive node lists, one per read; the last repeats."""

    def __init__(self, *lists: list[dict[str, float]]) -> None:
        self.lists, self.reads = list(lists), 0

    def __call__(self) -> list[dict[str, float]]:
        self.reads += 1
        return self.lists[min(self.reads, len(self.lists)) - 1]


def test_a_cluster_with_a_fitting_node_passes_at_once_and_silently():
    said: list[str] = []
    nodes = Nodes([CPU_NODE, GPU_NODE])
    wait_for_resources(GPU_TRIALS, timeout_s=10, poll_s=5, say=said.append, nodes=nodes)
    assert said == [] and nodes.reads == 1


def test_waits_with_one_line_until_a_node_joins(autoscaler):
    said: list[str] = []
    nodes = Nodes([CPU_NODE, CPU_NODE], [CPU_NODE, CPU_NODE], [CPU_NODE, GPU_NODE])
    wait_for_resources(GPU_TRIALS, timeout_s=30, poll_s=0.01, say=said.append, nodes=nodes)
    assert nodes.reads == 3
    assert autoscaler == [[{"CPU": 4.0, "GPU": 1.0}, {"CPU": 1.0, "GPU": 0.25}], []], "asked, then withdrawn"
    assert said == ["waiting up to 30 s for a node with 4 CPU and 1 GPU for a Stage-I trial and 1 CPU and 0.25 GPU "
                    "for a trial on a trained Stage I: the cluster's 2 nodes offer 2 × (4 CPU, 0 GPU) "
                    "(asked the autoscaler, if the cluster has one, for one)"]


def test_times_out_with_an_error_naming_request_nodes_and_flags():
    said: list[str] = []
    options = ExecutionOptions(address="auto", cpus_per_trial=2, gpus_per_trial=1, gpus_per_cached_trial=0)
    with pytest.raises(ConfigError) as error:
        wait_for_resources(options, timeout_s=0.05, poll_s=0.01, say=said.append, nodes=Nodes([CPU_NODE, CPU_NODE]))
    assert len(said) == 1 and said[0].startswith("waiting up to 0.05 s for a node with 2 CPU and 1 GPU for a "
                                                 "Stage-I trial: the cluster's 2 nodes offer 2 × (4 CPU, 0 GPU)")
    message = str(error.value)
    assert message.startswith("No node of the cluster offers 2 CPU and 1 GPU for a Stage-I trial after 0.05 s: "
                              "the cluster's 2 nodes offer 2 × (4 CPU, 0 GPU).")
    assert "(--gpus-per-trial)" in message and f"({RESOURCE_WAIT_ENV}, now 0.05)" in message
    assert "--cpus-per-trial" not in message, "the CPUs fit; only the GPU flag needs changing"


def test_cpus_and_gpus_of_one_trial_must_fit_on_one_node():
    nodes = [{"CPU": 8.0, "GPU": 0.0}, {"CPU": 1.0, "GPU": 1.0}]
    options = ExecutionOptions(address="auto", cpus_per_trial=4, gpus_per_trial=1, cpus_per_cached_trial=1)
    assert unplaceable_roles(options, nodes) == {"stage1": {"CPU": 4.0, "GPU": 1.0}}
    with pytest.raises(ConfigError, match=r"offers 4 CPU and 1 GPU for a Stage-I trial .*1 × \(8 CPU, 0 GPU\), "
                                          r"1 × \(1 CPU, 1 GPU\)\. Ask for what one node has \(--cpus-per-trial, "
                                          r"--gpus-per-trial\)"):
        wait_for_resources(options, timeout_s=0, say=lambda line: None, nodes=lambda: nodes)


def test_same_request_for_both_roles_is_named_once():
    said: list[str] = []
    with pytest.raises(ConfigError, match=r"offers 2 CPU for a trial after 0 s: the cluster has no alive node"):
        wait_for_resources(ExecutionOptions(address="auto", cpus_per_trial=2), timeout_s=0, say=said.append,
                           nodes=lambda: [])
    assert said == ["waiting up to 0 s for a node with 2 CPU for a trial: the cluster has no alive node "
                    "(asked the autoscaler, if the cluster has one, for one)"]


def test_describe_nodes_counts_each_shape():
    assert describe_nodes([GPU_NODE]) == "the cluster's 1 node offer 1 × (4 CPU, 1 GPU)"
    assert describe_nodes([]) == "the cluster has no alive node"


def test_the_wait_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(RESOURCE_WAIT_ENV, raising=False)
    assert resource_wait_seconds() == 300
    monkeypatch.setenv(RESOURCE_WAIT_ENV, "12.5")
    assert resource_wait_seconds() == 12.5
    for bad in ("soon", "-1", "nan"):
        monkeypatch.setenv(RESOURCE_WAIT_ENV, bad)
        with pytest.raises(ConfigError, match=rf"`{RESOURCE_WAIT_ENV}` must be a number of seconds >= 0 .*"
                                              rf"got {RESOURCE_WAIT_ENV}='{bad}'"):
            resource_wait_seconds()
    monkeypatch.setenv(RESOURCE_WAIT_ENV, "0")
    with pytest.raises(ConfigError, match=r"after 0 s"):
        wait_for_resources(GPU_TRIALS, say=lambda line: None, nodes=lambda: [CPU_NODE])


def test_alive_nodes_are_read_from_ray(monkeypatch):
    import ray

    monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True, "Resources": GPU_NODE},
                                               {"Alive": False, "Resources": {"CPU": 64.0, "GPU": 8.0}}])
    assert alive_node_resources() == [GPU_NODE]
