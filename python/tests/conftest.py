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


# Skips, made visible (as crates/testskip does for the Rust tests): pytest counts a skip
# apart, but CI's log scrolls past it; each skip (a test's, or a whole module's at
# collection, e.g. importorskip) appends `python::NODEID: REASON` to the skip log, which
# `.ci/run` prints at the end (scripts/skip_summary.sh).
def skip_log_path():
    p = os.environ.get("TIERCACHE_SKIP_LOG")
    if p:
        return pathlib.Path(p)
    return pathlib.Path(__file__).resolve().parents[2] / "target" / "test-skips.log"


def _log_skip(report):
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    lr = report.longrepr
    reason = lr[2] if isinstance(lr, tuple) and len(lr) == 3 else str(lr)
    reason = " ".join(str(reason).removeprefix("Skipped: ").split())
    path = skip_log_path()
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"python::{report.nodeid}: {reason}\n")
    except OSError as e:
        print(f"SKIP not logged: cannot append to {path} ({e}; set TIERCACHE_SKIP_LOG)")


def pytest_runtest_logreport(report):
    _log_skip(report)


def pytest_collectreport(report):
    _log_skip(report)
