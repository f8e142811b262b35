//! Several volumes in one pool, in the simulator: real traces merged by time, per-volume
//! settings and results (`docs/design-pool.md`).

use std::path::{Path, PathBuf};
use tiercache_engine::{CacheSize, Counters, EngineConfig, Mode, VolumeConfig};
use tiercache_sim::{merge_volumes, simulate, Input, SimSpec, VolumeInput};

fn shared(rel: &str) -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/traces")
        .join(rel);
    if p.exists() {
        Some(p)
    } else {
        tiercache_testskip::skip!(
            "{} not found; shared-trace volume tests not run",
            p.display()
        );
        None
    }
}

fn trace(p: PathBuf) -> Input {
    Input::Trace {
        path: p,
        format: None,
        options: Default::default(),
    }
}

fn spec(input: Input, lines: u64, volumes: Vec<VolumeConfig>) -> SimSpec {
    SimSpec {
        input,
        cache_size: CacheSize::Bytes(lines * 4096),
        engine: EngineConfig {
            mode: Mode::WriteThrough,
            volumes,
            ..Default::default()
        },
        log: None,
    }
}

fn two() -> Option<(Input, Input)> {
    let msr = shared("msr_cambridge/msr-cambridge1-sample.csv")?;
    let systor = shared("systor17/systor17-traces-sample.csv.gz")?;
    Some((trace(msr), trace(systor)))
}

/// Two real traces merged: every request kept, each trace's requests in its own order and
/// under its own volume id, the stream in time order; per-volume results add up.
#[test]
fn two_traces_merge_into_two_volumes_of_one_pool() {
    let Some((msr, systor)) = two() else { return };
    let alone = |i: &Input| i.open().unwrap().map(|r| r.unwrap()).collect::<Vec<_>>();
    let (a, b) = (alone(&msr), alone(&systor));
    let (merged, table) = merge_volumes(&[
        VolumeInput {
            name: "hm".into(),
            input: msr,
        },
        VolumeInput {
            name: "vdi".into(),
            input: systor,
        },
    ])
    .unwrap();
    assert_eq!(
        table.iter().map(|v| v.name.as_str()).collect::<Vec<_>>(),
        ["hm", "vdi"]
    );
    let m = alone(&merged);
    assert_eq!(m.len(), a.len() + b.len());
    // A merge by time (the SYSTOR sample itself is not sorted): each request taken is no
    // later than the other volume's next one (a tie goes to volume 0).
    let (mut pos, streams) = ([0usize, 0], [&a, &b]);
    for (i, r) in m.iter().enumerate() {
        let (v, o) = (r.volume as usize, 1 - r.volume as usize);
        if let Some(other) = streams[o].get(pos[o]) {
            assert!(
                (r.time_ns, v) < (other.time_ns, o),
                "merged request {i} ({r:?}) is later than volume {o}'s next ({other:?})"
            );
        }
        pos[v] += 1;
    }
    let of = |v: u32| {
        m.iter()
            .filter(move |r| r.volume == v)
            .map(|r| (r.offset, r.len, r.op))
    };
    assert!(of(0).eq(a.iter().map(|r| (r.offset, r.len, r.op))));
    assert!(of(1).eq(b.iter().map(|r| (r.offset, r.len, r.op))));

    let res = simulate(&spec(merged, 256, table), None, None).unwrap();
    assert_eq!(res.volumes.len(), 2);
    assert_eq!(res.volumes[0].requests, a.len() as u64);
    assert_eq!(res.volumes[1].requests, b.len() as u64);
    let mut sum = Counters::default();
    for v in &res.volumes {
        sum += &v.counters;
    }
    assert_eq!(sum, res.counters);
    let held: u64 = res.volumes.iter().map(|v| v.lines).sum();
    assert!(held > 0 && held <= res.capacity_lines);
    let json = serde_json::to_value(&res).unwrap();
    assert_eq!(json["volumes"][1]["name"], "vdi");
    assert!(res.to_string().contains("per volume"), "{res}");
}

/// A pass-through volume takes nothing from the pool: the other volume's counters are
/// exactly those of its trace replayed alone in the same cache.
#[test]
fn a_pass_through_volume_leaves_the_pool_to_the_others() {
    let Some((msr, systor)) = two() else { return };
    let (merged, mut table) = merge_volumes(&[
        VolumeInput {
            name: "hm".into(),
            input: msr,
        },
        VolumeInput {
            name: "vdi".into(),
            input: systor.clone(),
        },
    ])
    .unwrap();
    table[0].mode = Some(Mode::PassThrough);
    let pool = simulate(&spec(merged, 64, table), None, None).unwrap();
    let alone = simulate(&spec(systor, 64, Vec::new()), None, None).unwrap();
    assert_eq!(pool.volumes[0].lines, 0);
    assert_eq!(pool.volumes[0].mode, "pass-through");
    assert!(pool.volumes[0].counters.hdd_bytes_read > 0);
    assert_eq!(pool.volumes[1].counters, alone.counters);
    assert!(
        alone.line_hits > 0 && alone.evictions > 0,
        "a cache under pressure"
    );
}

/// A trace with a volume column (MQSim's tpcc: several devices) keeps its volumes apart in
/// one run and reports each; it cannot be one volume of a merge.
#[test]
fn a_trace_with_a_volume_column_reports_per_volume_and_is_not_merged() {
    let Some(p) = shared("mqsim/tpcc-small.trace") else {
        return;
    };
    let res = simulate(
        &spec(trace(p.clone()), 512, vec![VolumeConfig::new(0, "0")]),
        None,
        None,
    )
    .unwrap();
    assert!(res.volumes.len() > 2, "{:?}", res.volumes.len());
    let mut sum = Counters::default();
    for v in &res.volumes {
        sum += &v.counters;
    }
    assert_eq!(sum, res.counters);
    let err = merge_volumes(&[VolumeInput {
        name: "tpcc".into(),
        input: trace(p),
    }])
    .unwrap_err();
    let msg = format!("{err:#}");
    assert!(
        msg.contains("volume column") && msg.contains("tpcc"),
        "{msg}"
    );
}
