import pytest
import simpy

from traces.recorder import Recorder


@pytest.fixture
def env():
    return simpy.Environment()


@pytest.fixture
def log():
    return []


@pytest.fixture
def recorder():
    return Recorder(level="tiles")
