//! Line keys stay exact whatever their width (issue 16 item 1: the slot array keeps 32-bit
//! keys until a key needs its high word). Keys that share their low 32 bits — a volume tag
//! (`vol << 48 | line`), a line index >= 2^32, the line 2^32 - 1 whose low word is the narrow
//! form's empty mark — must be distinct lines: never aliased, never lost when the key store
//! widens under cached lines, written back to their own volume and offset.

use std::collections::BTreeSet;
use tiercache_engine::{Engine, EngineConfig, Mode, Request, Step};

const LINE: u64 = 4096;

fn engine() -> Engine {
    Engine::new(EngineConfig {
        capacity_lines: 16,
        mode: Mode::WriteBack,
        ..Default::default()
    })
    .unwrap()
}

fn write(e: &mut Engine, volume: u32, line: u64) {
    let mut r = Request::write(line * LINE, LINE);
    r.volume = volume;
    e.process(&r).unwrap();
}

/// The SSD offsets a read of the line is served from; panics when it goes to the backing
/// device (a miss: the line was lost or another line's data would be returned).
fn hit_at(e: &mut Engine, volume: u32, line: u64) -> Vec<u64> {
    let mut r = Request::read(line * LINE, LINE);
    r.volume = volume;
    let p = e.process(&r).unwrap();
    let mut at = Vec::new();
    for s in &p.steps {
        match *s {
            Step::ReadSsd { ssd, .. } => at.push(ssd),
            Step::ReadHdd { .. } => panic!("vol {volume} line {line}: a miss, {p:?}"),
            _ => {}
        }
    }
    assert!(
        !at.is_empty(),
        "vol {volume} line {line}: no SSD read, {p:?}"
    );
    at
}

/// (volume, line) pairs whose keys share the low word 5 or are at the narrow form's edge.
const LINES: [(u32, u64); 6] = [
    (0, 5),
    (0, u32::MAX as u64 - 1),
    // Same low word as (0, 5): a volume tag, then a line index >= 2^32.
    (1, 5),
    (0, (1 << 32) | 5),
    // Low word u32::MAX: the narrow form's empty mark.
    (0, u32::MAX as u64),
    (7, (3 << 32) | 5),
];

fn key(volume: u32, line: u64) -> u64 {
    Engine::line_key(volume, line)
}

#[test]
fn keys_sharing_their_low_word_are_distinct_lines() {
    let mut e = engine();
    // Narrow keys first: the store widens under them at the first wide key.
    for &(v, l) in &LINES {
        write(&mut e, v, l);
    }
    let got: BTreeSet<u64> = e
        .entries()
        .map(|(k, _, dirty)| {
            assert!(dirty);
            k
        })
        .collect();
    let want: BTreeSet<u64> = LINES.iter().map(|&(v, l)| key(v, l)).collect();
    assert_eq!(got, want, "cached keys");
    assert_eq!(e.len(), LINES.len() as u64);
    // Each line is a hit in its own slot.
    let mut slots = BTreeSet::new();
    for &(v, l) in &LINES {
        let s = e.lookup(key(v, l)).expect("cached");
        assert_eq!(e.slot_key(s), Some(key(v, l)));
        assert!(slots.insert(s), "vol {v} line {l}: slot {s} shared");
        assert_eq!(hit_at(&mut e, v, l), vec![u64::from(s) * LINE]);
    }
    // Lines never written are misses, though their low words match cached ones.
    for (v, l) in [(2, 5), (0, (2 << 32) | 5), (1, u32::MAX as u64 - 1)] {
        assert_eq!(e.lookup(key(v, l)), None, "vol {v} line {l}");
    }
    // Write-back goes to each line's own volume and backing offset.
    let mut wb = BTreeSet::new();
    for _ in 0..4 {
        for s in &e.clean(16).steps {
            if let Step::WriteBack { vol, hdd, len, .. } = *s {
                assert_eq!(len, LINE);
                wb.insert((vol, hdd / LINE));
            }
        }
    }
    assert_eq!(wb, LINES.iter().copied().collect::<BTreeSet<_>>());
    assert_eq!(e.dirty_lines(), 0);
}

#[test]
fn evicting_a_wide_key_keeps_its_narrow_twin() {
    let mut e = engine();
    write(&mut e, 0, 5);
    write(&mut e, 1, 5);
    // Invalidate (a trim) the tagged line only.
    let mut d = Request::new(0, tiercache_engine::Op::Trim, 5 * LINE, LINE);
    d.volume = 1;
    e.process(&d).unwrap();
    assert_eq!(e.lookup(key(1, 5)), None);
    let s = e.lookup(key(0, 5)).expect("the untagged line stays");
    assert_eq!(hit_at(&mut e, 0, 5), vec![u64::from(s) * LINE]);
    // Fill with wide keys until line (0, 5) is evicted, then the tagged twin is not found.
    for l in 0..64u64 {
        write(&mut e, 2, (1 << 32) | l);
    }
    assert_eq!(e.lookup(key(0, 5)), None);
    assert_eq!(e.len(), 16);
    for (k, s, _) in e.entries() {
        assert_eq!(k >> 48, 2, "slot {s}: key {k:#x}");
        assert_eq!(e.lookup(k), Some(s));
    }
}

#[test]
fn restored_wide_keys_are_exact() {
    let mut e = engine();
    for (s, &(v, l)) in LINES.iter().enumerate() {
        e.restore_line(key(v, l), s as u32, 0xff, 0, 0).unwrap();
    }
    for (s, &(v, l)) in LINES.iter().enumerate() {
        assert_eq!(e.lookup(key(v, l)), Some(s as u32));
        assert_eq!(hit_at(&mut e, v, l), vec![s as u64 * LINE]);
    }
    assert_eq!(e.lookup(key(3, 5)), None);
}
