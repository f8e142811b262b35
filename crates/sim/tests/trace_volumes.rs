//! Traces that name devices by `major,minor` (blkparse, FIU: volume id `major << 20 | minor`,
//! 8388608 for 8,0) simulate: their ids are folded into the engine's key range, each device
//! still its own volume. Before, `tiercache sim` of any blkparse trace of a real disk failed
//! with "volume 8388608 is out of range (0..=65535)".

use tiercache_engine::{CacheSize, EngineConfig};
use tiercache_sim::{simulate, Input, SimSpec};

fn spec(path: &std::path::Path) -> SimSpec {
    SimSpec {
        input: Input::Trace {
            path: path.to_path_buf(),
            format: Some(tiercache_trace::Format::Blkparse),
            options: Default::default(),
        },
        cache_size: CacheSize::Bytes(1 << 20),
        engine: EngineConfig::default(),
        log: None,
    }
}

#[test]
fn blkparse_devices_of_real_disks_are_volumes_of_the_engine() {
    let dir = tempfile::tempdir().unwrap();
    // Two devices (8,0 and dm-1 = 253,1) reading the same sectors: 8 distinct lines (4 per
    // device), each read twice. Were the devices one volume, the second device's reads would
    // hit; as two volumes, only the repeats do.
    let mut lines = String::new();
    let mut seq = 0;
    for round in 0..2 {
        for dev in ["8,0", "253,1"] {
            for s in 0..4u64 {
                seq += 1;
                lines.push_str(&format!(
                    "{dev:>5}    0 {seq:>8} {:>4}.{:09}  1234  Q   R {} + 8 [fio]\n",
                    round,
                    seq,
                    2048 + s * 8
                ));
            }
        }
    }
    let p = dir.path().join("t.blk");
    std::fs::write(&p, lines).unwrap();
    let r = simulate(&spec(&p), None, None).unwrap();
    assert_eq!(r.requests, 16);
    assert_eq!(r.line_hits, 8, "{r:?}");
    // The streaming reader (timed runs, replays) folds the same way.
    let n = spec(&p)
        .input
        .open()
        .unwrap()
        .map(|r| r.unwrap().volume)
        .collect::<Vec<_>>();
    let max = tiercache_engine::engine::MAX_VOLUME;
    assert_eq!(
        &n[..8],
        &[max, max, max, max, max - 1, max - 1, max - 1, max - 1]
    );
}
