"""The local Ray of ``make simulate`` is started again when Ray's start-up times out."""

from __future__ import annotations

import pytest

from app.tooling.errors import FlowerProcessError
from app.tooling.local_ray import STARTUP_TIMEOUT, patient_node_lookup, start_with_retries

RAY_TIMEOUT = Exception(f"The current node {STARTUP_TIMEOUT}. This could happen because "
                        "some of the raylet failed to startup or the GCS has become overloaded.")


class FakeRay:
    """``init`` fails with the given errors in turn, then returns an address."""

    def __init__(self, *errors: Exception):
        self.errors, self.inits, self.shutdowns = list(errors), 0, 0

    def init(self) -> str:
        self.inits += 1
        if self.errors:
            raise self.errors.pop(0)
        return "127.0.0.1:6379"

    def shutdown(self) -> None:
        self.shutdowns += 1


def test_a_start_up_timeout_is_shut_down_and_tried_again():
    ray, said, waits = FakeRay(RAY_TIMEOUT, RAY_TIMEOUT), [], []
    assert start_with_retries(ray.init, ray.shutdown, attempts=3, echo=said.append,
                              pause=5.0, sleep=waits.append) == "127.0.0.1:6379"
    assert (ray.inits, ray.shutdowns) == (3, 2)
    assert len(said) == 2 and "attempt 1 of 3" in said[0]
    assert waits == [5.0, 10.0]  # a load peak passes before the next try


def test_the_last_timeout_and_any_other_error_are_raised_at_once():
    ray = FakeRay(RAY_TIMEOUT, RAY_TIMEOUT)
    with pytest.raises(FlowerProcessError, match="attempt 2 of 2"):
        start_with_retries(ray.init, ray.shutdown, attempts=2, echo=lambda _: None,
                           sleep=lambda _: None)
    other = FakeRay(ValueError("bad init argument"), RAY_TIMEOUT)
    with pytest.raises(FlowerProcessError, match=r"attempt 1 of 3\): bad init argument"):
        start_with_retries(other.init, other.shutdown, attempts=3, echo=lambda _: None,
                           sleep=lambda _: None)
    assert (other.inits, other.shutdowns) == (1, 1)
    with pytest.raises(FlowerProcessError, match="attempts must be >= 1"):
        start_with_retries(other.init, other.shutdown, attempts=0)


class FakeServices:
    """``get_node`` raises Ray's "not available" error ``misses`` times, then answers."""

    def __init__(self, misses: int):
        self.misses, self.calls = misses, 0

    def get_node(self, gcs_address: str, node_id: str) -> dict:
        self.calls += 1
        if self.calls <= self.misses:
            raise RuntimeError(f"node {node_id} is not available yet")
        return {"node_id": node_id, "gcs": gcs_address}


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_the_node_lookup_waits_for_a_slow_raylet_and_is_restored_afterwards():
    services, clock = FakeServices(misses=100), FakeClock()
    original = services.get_node
    with patient_node_lookup(services, wait=60.0, interval=0.5, clock=clock.time,
                             sleep=clock.sleep):
        # Ray's own loop would give up after 30 s; the patient lookup waits 50 s.
        assert services.get_node("127.0.0.1:1", "n1") == {"node_id": "n1", "gcs": "127.0.0.1:1"}
    assert clock.now == pytest.approx(50.0)
    assert services.get_node == original


def test_the_node_lookup_gives_rays_error_after_its_wait():
    services, clock = FakeServices(misses=10**6), FakeClock()
    with patient_node_lookup(services, wait=10.0, interval=1.0, clock=clock.time,
                             sleep=clock.sleep):
        with pytest.raises(RuntimeError, match="not available yet"):
            services.get_node("127.0.0.1:1", "n1")
    assert clock.now == pytest.approx(10.0)
    assert services.calls == 11
