//! Data-reduction speed per core on real bytes: BLAKE3 alone, lz4 alone, the log layout's
//! per-line reduction (BLAKE3 + lz4, and BLAKE3 + zstd:1), 4 KiB lines; and the live write
//! path: the whole data written in 256 KiB requests into a write-back `LogVolume` (dedup
//! index 100 %, lz4; and no reduction for comparison) on files in /dev/shm, one thread.
//!
//! `scripts/bench_reduce.sh` builds the data file from system files and runs this next to
//! `lz4 -b1` on the same file; set `TIERCACHE_REDUCE_DATA=FILE` to use another file.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;
use tiercache_engine::log::Compression;
use tiercache_engine::Mode;
use tiercache_nbd::Export;
use tiercache_server::reduce::Reducer;
use tiercache_server::{format_log, FileDev, LogFormatOptions, LogVolume};

const LINE: usize = 4096;

fn data() -> Vec<u8> {
    if let Ok(p) = std::env::var("TIERCACHE_REDUCE_DATA") {
        let mut d = std::fs::read(&p).unwrap_or_else(|e| panic!("{p}: {e}"));
        d.truncate(d.len() / LINE * LINE);
        assert!(!d.is_empty(), "{p}: less than one line");
        return d;
    }
    // Fallback: the first 64 MiB of files under /usr (binaries, libraries, text).
    let mut d = Vec::new();
    let mut stack = vec![std::path::PathBuf::from("/usr/lib/x86_64-linux-gnu")];
    stack.push("/usr/share/doc".into());
    while let Some(p) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&p) else {
            continue;
        };
        let mut es: Vec<_> = rd.flatten().map(|e| e.path()).collect();
        es.sort();
        for e in es.into_iter().rev() {
            if e.is_dir() && !e.is_symlink() {
                stack.push(e);
            } else if e.is_file() && d.len() < 64 << 20 {
                if let Ok(b) = std::fs::read(&e) {
                    d.extend_from_slice(&b);
                }
            }
        }
    }
    d.truncate((64 << 20).min(d.len() / LINE * LINE));
    d
}

fn bench(c: &mut Criterion) {
    let d = data();
    let mut g = c.benchmark_group("reduce_4k_lines");
    g.throughput(Throughput::Bytes(d.len() as u64));
    g.sample_size(10);
    g.bench_function("blake3", |b| {
        b.iter(|| {
            for l in d.chunks_exact(LINE) {
                black_box(Reducer::hash(l));
            }
        })
    });
    let mut out = Vec::with_capacity(2 * LINE);
    g.bench_function("lz4", |b| {
        b.iter(|| {
            for l in d.chunks_exact(LINE) {
                out.resize(lz4_flex::block::get_maximum_output_size(LINE), 0);
                black_box(lz4_flex::block::compress_into(l, &mut out).unwrap());
            }
        })
    });
    for comp in [Compression::Lz4, Compression::Zstd(1)] {
        let mut r = Reducer::new(comp).unwrap();
        g.bench_function(format!("blake3+{comp}"), |b| {
            b.iter(|| {
                for l in d.chunks_exact(LINE) {
                    black_box(r.reduce(l, &mut out).unwrap());
                }
            })
        });
    }
    g.finish();

    // The live write path. A fresh volume per iteration, big enough that nothing is
    // reclaimed: what is timed is reduction, dedup lookups, packing and segment writes.
    let dir = tempfile::Builder::new()
        .prefix("tiercache-bench")
        .tempdir_in(if std::path::Path::new("/dev/shm").is_dir() {
            "/dev/shm"
        } else {
            "/tmp"
        })
        .unwrap();
    let mut g = c.benchmark_group("live_log_write");
    g.throughput(Throughput::Bytes(d.len() as u64));
    g.sample_size(10);
    for (name, comp, dedup) in [
        ("blake3_dedup+lz4", Compression::Lz4, 1.0),
        ("no_reduction", Compression::None, 0.0),
    ] {
        g.bench_function(name, |b| {
            b.iter_batched(
                || {
                    let (cp, bp) = (dir.path().join("cache"), dir.path().join("backing"));
                    let _ = std::fs::remove_file(&cp);
                    let _ = std::fs::remove_file(&bp);
                    std::fs::File::create(&cp)
                        .unwrap()
                        .set_len(d.len() as u64 * 5 / 4 + (64 << 20))
                        .unwrap();
                    std::fs::File::create(&bp)
                        .unwrap()
                        .set_len(d.len() as u64)
                        .unwrap();
                    let cache = FileDev::open(&cp).unwrap();
                    let o = LogFormatOptions {
                        line_size: LINE as u64,
                        segment_size: 2 << 20,
                        compression: comp,
                        dedup_ratio: dedup,
                        picker: "lru".into(),
                        mode: Mode::WriteBack,
                        journal_records: None,
                    };
                    format_log(&cache, d.len() as u64, &o).unwrap();
                    let backing = FileDev::open(&bp).unwrap();
                    LogVolume::open(Box::new(cache), Box::new(backing))
                        .unwrap()
                        .0
                },
                |vol| {
                    for (i, chunk) in d.chunks(256 << 10).enumerate() {
                        vol.write((i as u64) << 18, chunk, false).unwrap();
                    }
                    vol.flush().unwrap();
                    vol
                },
                criterion::BatchSize::PerIteration,
            )
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
