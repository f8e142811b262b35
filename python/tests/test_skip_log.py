"""A skipped Python test lands in the skip log that .ci/run prints (conftest.py's hooks)."""

import os
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent


def test_a_skip_lands_in_the_skip_log(tmp_path):
    (tmp_path / "test_probe.py").write_text(
        "import pytest\n"
        "def test_probe():\n"
        "    pytest.skip('probe-tool is not installed')\n"
        "def test_runs():\n"
        "    assert True\n"
    )
    (tmp_path / "test_probe_module.py").write_text(
        "import pytest\npytest.importorskip('tiercache_no_such_module')\n"
    )
    log = tmp_path / "skips.log"
    env = dict(os.environ, TIERCACHE_SKIP_LOG=str(log))
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-c", os.devnull,
         "--rootdir", str(tmp_path), str(tmp_path)],
        env=env, capture_output=True, text=True, cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    lines = log.read_text().splitlines()
    assert "python::test_probe.py::test_probe: probe-tool is not installed" in lines, lines
    assert any(
        l.startswith("python::test_probe_module.py:") and "tiercache_no_such_module" in l
        for l in lines
    ), lines
    # The test that ran is not in the log.
    assert len(lines) == 2, lines
