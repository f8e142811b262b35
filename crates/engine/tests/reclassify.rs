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

/// `Engine::set_class_table` (`ctl classes load`): cached lines keep their class ids and are
/// judged by the new table from the next request on (DSS eviction order, `never` bypass);
/// a policy that is not class-aware keeps its LRU order; partitions can appear.
mod table_reload {
    use super::*;
    use std::sync::Arc;
    use tiercache_engine::ClassTable;

    fn table(text: &str) -> Option<Arc<ClassTable>> {
        Some(Arc::new(ClassTable::parse(text, "t.toml").unwrap()))
    }

    const AB: &str = "version = 1\n[[class]]\nid = 1\nname = \"a\"\npriority = 0\nallocation = \"always\"\n[[class]]\nid = 2\nname = \"b\"\npriority = 5\nallocation = \"always\"\n";
    const BA_NEVER_B: &str = "version = 1\n[[class]]\nid = 1\nname = \"a\"\npriority = 5\nallocation = \"always\"\n[[class]]\nid = 2\nname = \"b\"\npriority = 0\nallocation = \"never\"\n";

    fn dss(text: &str, cap: u64) -> Engine {
        Engine::new(EngineConfig {
            capacity_lines: cap,
            mode: Mode::WriteThrough,
            policy: "dss".into(),
            policy_params: tiercache_engine::policy::PolicyConfig {
                classes: table(text),
                ..Default::default()
            },
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn dss_follows_the_new_priorities_and_allocation() {
        // Under AB class 2 (priority 5) goes first; after the reload class 1 does.
        let mut e = dss(AB, 2);
        write(&mut e, 0, 1);
        write(&mut e, 1, 2);
        e.set_class_table(table(BA_NEVER_B)).unwrap();
        assert_eq!(e.len(), 2, "cached lines stay");
        let s1 = e.lookup(Engine::line_key(0, 1)).unwrap();
        assert_eq!(e.line_class(s1), 2, "a cached line keeps its class id");
        write(&mut e, 2, 1);
        assert!(
            e.lookup(Engine::line_key(0, 0)).is_none(),
            "class 1 is now the lowest priority: its line is evicted"
        );
        assert!(e.lookup(Engine::line_key(0, 1)).is_some());
        // Class 2 is now never allocated: a miss of it bypasses.
        let before = e.class_counters(2).bypasses.class;
        write(&mut e, 3, 2);
        assert!(e.lookup(Engine::line_key(0, 3)).is_none());
        assert_eq!(e.class_counters(2).bypasses.class, before + 1);

        // The same requests without the reload: class 2's line goes first.
        let mut f = dss(AB, 2);
        write(&mut f, 0, 1);
        write(&mut f, 1, 2);
        write(&mut f, 2, 1);
        assert!(f.lookup(Engine::line_key(0, 0)).is_some());
        assert!(f.lookup(Engine::line_key(0, 1)).is_none());
    }

    #[test]
    fn lru_keeps_its_order_and_partitions_can_appear() {
        let mut e = engine("lru");
        write(&mut e, 0, 1);
        write(&mut e, 1, 2);
        e.set_class_table(table(AB)).unwrap();
        write(&mut e, 2, 1);
        assert!(e.lookup(Engine::line_key(0, 0)).is_none(), "LRU order kept");
        // A table with a never class wraps LRU in partitions: class 2 now bypasses.
        e.set_class_table(table(BA_NEVER_B)).unwrap();
        assert_eq!(e.len(), 2);
        write(&mut e, 5, 2);
        assert!(e.lookup(Engine::line_key(0, 5)).is_none());
        assert_eq!(e.class_counters(2).bypasses.class, 1);
        // Back to no table: plain LRU again, class 2 cached.
        e.set_class_table(None).unwrap();
        write(&mut e, 6, 2);
        assert!(e.lookup(Engine::line_key(0, 6)).is_some());
    }
}
