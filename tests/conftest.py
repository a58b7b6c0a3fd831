"""Shared fixtures, SimPy style: a fresh environment and an event log per test."""

import pytest
import simpy


@pytest.fixture
def env() -> simpy.Environment:
    return simpy.Environment()


@pytest.fixture
def log() -> list:
    return []
