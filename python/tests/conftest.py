import os
import pathlib

import pytest

TRACES = pathlib.Path(__file__).resolve().parents[2].parent / "shared" / "traces"


@pytest.fixture(scope="session")
def msr():
    p = TRACES / "msr_cambridge" / "msr-cambridge1-sample.csv"
    if not p.is_file():
        pytest.skip(f"shared traces not found at {TRACES} (need ../shared beside the checkout)")
    return str(p)


@pytest.fixture(scope="session")
def cloudphysics():
    p = TRACES / "cloudPhysicsIO" / "cloudPhysicsIO.csv"
    if not p.is_file():
        pytest.skip(f"shared traces not found at {TRACES} (need ../shared beside the checkout)")
    return str(p)


#: A small synthetic workload: runs everywhere, no files needed.
ZIPF = "zipf:theta=0.9,wss=64MiB,requests=2e4"
