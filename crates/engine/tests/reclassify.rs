//! `Engine::reclassify`: a live classifier relabels a cached line once it learns its class;
//! DSS then evicts by the new class, LRU keeps its order.

use tiercache_engine::{Engine, EngineConfig, Mode, Request};

fn engine(policy: &str) -> Engine {
    Engine::new(EngineConfig {
        capacity_lines: 2,
        mode: Mode::WriteThrough,
        policy: policy.into(),
        ..Default::default()
    })
    .unwrap()
}

fn write(e: &mut Engine, line: u64, class: u8) {
    let mut r = Request::write(line * 4096, 4096);
    r.class = class;
    e.process(&r).unwrap();
}

#[test]
fn dss_evicts_by_the_new_class() {
    // File-system table: 0 unclassified (priority 6), 1 metadata (0), 8 file<4KiB (1).
    let mut e = engine("dss");
    write(&mut e, 0, 0);
    write(&mut e, 1, 8);
    let slot0 = e.lookup(Engine::line_key(0, 0)).unwrap();
    assert!(e.reclassify(Engine::line_key(0, 0), 1));
    assert_eq!(e.line_class(slot0), 1);
    assert!(
        !e.reclassify(Engine::line_key(0, 0), 1),
        "same class: no change"
    );
    assert!(!e.reclassify(Engine::line_key(0, 9), 1), "not cached");
    // A third line evicts the file line (priority 1), not the relabelled metadata line.
    write(&mut e, 2, 8);
    assert!(e.lookup(Engine::line_key(0, 0)).is_some());
    assert!(e.lookup(Engine::line_key(0, 1)).is_none());

    // Without the relabel the unclassified line (priority 6) would have gone first.
    let mut f = engine("dss");
    write(&mut f, 0, 0);
    write(&mut f, 1, 8);
    write(&mut f, 2, 8);
    assert!(f.lookup(Engine::line_key(0, 0)).is_none());
}

#[test]
fn lru_keeps_its_order() {
    let mut e = engine("lru");
    write(&mut e, 0, 0);
    write(&mut e, 1, 8);
    assert!(e.reclassify(Engine::line_key(0, 0), 1));
    write(&mut e, 2, 8);
    assert!(
        e.lookup(Engine::line_key(0, 0)).is_none(),
        "LRU line 0 still goes first"
    );
}
