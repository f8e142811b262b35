import pandas as pd
import pytest

import tiercache as tc
from conftest import ZIPF

GRID = {"size": ["5%", "20%"], "policy": ["lru", "fifo", "arc"], "mode": ["wt", "wb"]}


def _cmp(a, b):
    # ``method`` says how a cell was computed (a local sweep takes plain-LRU sizes from one
    # stack-distance pass; a cell sent to a worker runs its engine): the results are equal.
    assert set(a["method"]) <= {"stack", "engines"} and set(b["method"]) == {"engines"}
    drop = [c for c in (*tc.WALL_CLOCK_COLUMNS, "method") if c in a.columns]
    pd.testing.assert_frame_equal(a.drop(columns=drop), b.drop(columns=drop), check_exact=True)


def test_sweep_shape_order_and_values(msr):
    df = tc.sweep(GRID, [msr, ZIPF])
    assert len(df) == 2 * 2 * 3 * 2
    assert list(df["trace"][:12]) == [msr] * 12
    # The last grid axis varies fastest.
    first = df[["size", "policy", "mode"]].head(4).values.tolist()
    assert first == [["5%", "lru", "wt"], ["5%", "lru", "wb"], ["5%", "fifo", "wt"], ["5%", "fifo", "wb"]]
    one = tc.simulate({"size": "20%", "policy": "arc", "mode": "wb"}, ZIPF)
    row = df[(df.trace == ZIPF) & (df["size"] == "20%") & (df.policy == "arc") & (df["mode"] == "wb")]
    assert len(row) == 1 and row.iloc[0]["line_hits"] == one.line_hits
    assert (df["result_mode"].isin(["write-through", "write-back"])).all()


def test_sweep_processes_equals_local(msr):
    _cmp(tc.sweep(GRID, [msr]), tc.sweep(GRID, [msr], executor="processes"))


def test_sweep_on_dask_local_cluster_equals_local(msr):
    distributed = pytest.importorskip("distributed")
    local = tc.sweep(GRID, [msr, ZIPF])
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster, distributed.Client(cluster) as client:
        on_dask = tc.sweep(GRID, [msr, ZIPF], executor=client)
        # One task per (trace, configuration) cell ran on the workers.
        assert len(on_dask) == len(local)
        by_address = tc.sweep(GRID, [msr, ZIPF], executor=cluster.scheduler_address)
        workers = client.run(lambda: 1)
        assert len(workers) == 2
    _cmp(local, on_dask)
    _cmp(local, by_address)


def test_sweep_rejects_unknown_axis(msr):
    with pytest.raises(ValueError, match="unknown grid axes"):
        tc.sweep({"colour": ["red"]}, [msr])
