"""lab.parallel.initialize: reads the multi-host environment and calls jax.distributed.initialize.

Here the call is recorded instead, so the tests check what would be passed to
JAX and which environments are refused; test_sharded_train.py starts two real
processes on localhost through it.
"""

from __future__ import annotations

import jax
import pytest

from lab import parallel


@pytest.fixture()
def calls(monkeypatch):
    recorded = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: recorded.append(kw))
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
    return recorded


def test_single_process_environment_does_nothing(calls):
    assert parallel.initialize({}) is False
    assert parallel.initialize({"LAB_DISTRIBUTED": "0"}) is False
    assert calls == []


def test_explicit_coordinator(calls):
    env = {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAX_NUM_PROCESSES": "4",
           "JAX_PROCESS_ID": "3"}
    assert parallel.initialize(env) is True
    assert calls == [dict(coordinator_address="10.0.0.1:1234", num_processes=4, process_id=3)]


def test_auto_detected_cluster(calls):
    assert parallel.initialize({"LAB_DISTRIBUTED": "1"}) is True
    assert calls == [{}]


@pytest.mark.parametrize("env, pattern", [
    ({"JAX_COORDINATOR_ADDRESS": "10.0.0.1"}, r"JAX_COORDINATOR_ADDRESS='10.0.0.1'.*host:port"),
    ({"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_PROCESS_ID": "0"}, r"JAX_NUM_PROCESSES=None"),
    ({"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "two", "JAX_PROCESS_ID": "0"},
     r"JAX_NUM_PROCESSES='two'"),
    ({"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "2"},
     r"JAX_PROCESS_ID=2 is not below JAX_NUM_PROCESSES=2"),
])
def test_malformed_environment_is_named(calls, env, pattern):
    with pytest.raises(ValueError, match=pattern):
        parallel.initialize(env)
    assert calls == []
