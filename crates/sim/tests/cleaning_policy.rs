//! `cleaning = "acp"` in an experiment file (the same key as `--cleaning acp`) reaches the
//! engine, and the simulator's cleaning then goes densest chunk first.

use tiercache_engine::{CleaningPolicy, Engine, Op, Request, Step};
use tiercache_sim::experiment::parse_toml;

fn engine(cleaning: &str) -> Engine {
    let exp = parse_toml(&format!(
        "[input]\nworkload = \"zipf:theta=1.0,wss=64MiB,requests=10\"\n[cache]\nsize = \"4MiB\"\n\
         mode = \"write-back\"\nrewrite_chunk = \"64KiB\"\nrewrite_min_runs = 1000\n\
         dirty_high = 1.0\ndirty_low = 1.0\ncleaning = \"{cleaning}\"\n"
    ))
    .unwrap();
    let (size, mut cfg) = exp.cache.resolve(0).unwrap();
    cfg.capacity_lines = size.lines(cfg.line_size, 0);
    Engine::new(cfg).unwrap()
}

fn clean_order(cleaning: &str) -> Vec<u64> {
    let mut e = engine(cleaning);
    // 16-line chunks: chunk 0 two dirty lines, chunk 1 four, chunk 3 three.
    for l in [50u64, 3, 17, 49, 30, 1, 20, 63, 18] {
        e.process(&Request::new(0, Op::Write, l * 4096, 4096))
            .unwrap();
    }
    e.clean(100)
        .steps
        .iter()
        .filter_map(|s| match *s {
            Step::WriteBack { hdd, .. } => Some(hdd / 4096),
            _ => None,
        })
        .collect()
}

#[test]
fn sim_cleaning_acp_cleans_densest_chunk_first() {
    assert_eq!(engine("acp").config().cleaning, CleaningPolicy::Acp);
    assert_eq!(clean_order("acp"), vec![17, 18, 20, 30, 49, 50, 63, 1, 3]);
    assert_eq!(clean_order("lba"), vec![1, 3, 17, 18, 20, 30, 49, 50, 63]);
    assert_eq!(clean_order("alru"), vec![50, 3, 17, 49, 30, 1, 20, 63, 18]);
    let bad = parse_toml("[cache]\ncleaning = \"nope\"\n")
        .unwrap()
        .cache
        .resolve(0);
    assert!(format!("{:#}", bad.unwrap_err()).contains("acp"));
}
