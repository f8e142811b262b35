//! The DSS seed's claim at a small scale: selective allocation and eviction beat LRU by at
//! least 1.5x on the find phases (metadata walks) and are no worse than LRU overall.

use tiercache_sim::dss::{self, DssOptions};
use tiercache_sim::fileserver::FileserverSpec;

#[test]
fn dss_beats_lru_on_find_phases_and_overall() {
    let opts = DssOptions {
        workload: FileserverSpec::scaled(0.001),
        disks: vec!["hdd:7200".into()],
        ..Default::default()
    };
    let rep = dss::run(&opts, None).unwrap();
    println!("{}", dss::render(&rep));
    let lru = rep.run("hdd:7200", "lru").unwrap();
    let d = rep.run("hdd:7200", "dss").unwrap();
    let none = rep.run("hdd:7200", "none").unwrap();
    for phase in ["MacroPrefind", "MacroFind"] {
        let (l, s) = (lru.phase(phase).unwrap(), d.phase(phase).unwrap());
        assert!(
            l.seconds >= 1.5 * s.seconds,
            "{phase}: LRU {:.2} s, DSS {:.2} s: less than 1.5x",
            l.seconds,
            s.seconds
        );
    }
    assert!(
        d.total_s() <= lru.total_s(),
        "DSS {:.1} s overall, LRU {:.1} s",
        d.total_s(),
        lru.total_s()
    );
    assert!(d.total_s() < none.total_s());
    assert!(d.mean_iops() > lru.mean_iops());
}
