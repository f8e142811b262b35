//! Generator throughput, for a quick check after changing a workload generator:
//!
//!     cargo run --release -p tiercache-trace --example workload_throughput [SPEC...]
//!
//! Prints million requests per second for each spec (defaults: every kind over 1 M blocks).

use std::hint::black_box;
use std::time::Instant;
use tiercache_trace::workload::WorkloadSpec;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let specs: Vec<String> = if args.is_empty() {
        [
            // Zipf sampling alone (all reads, fixed arrivals): 1 M blocks.
            "zipf:theta=1.0,wss=4GiB,requests=2e7,read=100",
            "zipf:theta=0.9,wss=4GiB,requests=2e7,read=100",
            "zipf:theta=0.6,wss=4GiB,requests=2e7,read=100",
            "zipf:theta=1.0,wss=4GiB,requests=2e7",
            "zipf:theta=0.9,wss=4GiB,requests=2e7",
            "zipf:theta=1.2,wss=4GiB,requests=2e7",
            "uniform:wss=4GiB,requests=2e7",
            "hotspot:wss=4GiB,requests=2e7",
            "seq:streams=8,wss=4GiB,requests=2e7",
            "8k; 70% read; 50% random; wss=4GiB; requests=2e7",
            "uniform:wss=4GiB,requests=2e7,size=4k@60+64k@30+1m@10,arrival=poisson",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    } else {
        args
    };
    for s in specs {
        let spec: WorkloadSpec = match s.parse() {
            Ok(spec) => spec,
            Err(e) => {
                eprintln!("{s}: {e}");
                std::process::exit(2);
            }
        };
        let start = Instant::now();
        let mut sum = 0u64;
        for r in spec.generate(1) {
            sum = sum.wrapping_add(r.offset ^ r.len ^ r.time_ns);
        }
        black_box(sum);
        let secs = start.elapsed().as_secs_f64();
        println!(
            "{:8.1} M req/s  {}",
            spec.requests as f64 / secs / 1e6,
            spec
        );
    }
}
