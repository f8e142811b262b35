//! Reads a trace and reports requests per second (format auto-detected unless given):
//! `cargo run --release -p tiercache-trace --example read_speed -- FILE [FORMAT] [BLOCK_SIZE]`.

use std::time::Instant;
use tiercache_trace::{open, stats::StatsBuilder, Format, ReadOptions};

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .expect("usage: read_speed FILE [FORMAT] [BLOCK_SIZE]");
    let format = args
        .next()
        .filter(|f| f != "auto")
        .map(|f| f.parse::<Format>().unwrap());
    let opts = ReadOptions {
        block_size: args.next().map(|b| b.parse().unwrap()),
        ..Default::default()
    };
    for pass in 0..3 {
        let t = Instant::now();
        let mut n = 0u64;
        let mut bytes = 0u64;
        for r in open(path.as_ref(), format, &opts).unwrap() {
            let r = r.unwrap();
            n += 1;
            bytes += r.len;
        }
        let read = t.elapsed();
        let t = Instant::now();
        let mut b = StatsBuilder::new(4096);
        for r in open(path.as_ref(), format, &opts).unwrap() {
            b.add(&r.unwrap());
        }
        let s = b.finish(0);
        println!(
            "pass {pass}: {n} requests ({bytes} bytes) read in {:.1} ms ({:.1} M req/s); with stats {:.1} ms (footprint {})",
            read.as_secs_f64() * 1e3,
            n as f64 / read.as_secs_f64() / 1e6,
            t.elapsed().as_secs_f64() * 1e3,
            s.footprint_blocks
        );
    }
}
