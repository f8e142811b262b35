//! Seeded mutation fuzzing of every trace reader, bounded for CI (the unbounded,
//! coverage-guided version is `fuzz/`, run with cargo fuzz; see RELIABILITY.md).
//!
//! Starting from valid samples each writer produces, inputs are mutated (bit flips, byte
//! overwrites with interesting values, truncation, duplication of ranges, inserted garbage)
//! and read with and without `skip_bad`. A reader must never panic, never loop, never
//! return more requests than the input could hold, and every error must say where it is
//! (`file:line:` for text formats, `record N (byte M)` for binary ones, or a file-level
//! message). `TIERCACHE_FUZZ_ITERS` (per format, default 20,000) runs more.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::io::Cursor;
use std::path::Path;
use tiercache_engine::{Op, Request};
use tiercache_trace::{open_writer, Format, ReadOptions, TraceReader};

fn sample(format: Format, rng: &mut ChaCha8Rng) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("sample.{}", format.name()));
    let mut w = open_writer(&path, format).unwrap();
    for i in 0..40u64 {
        let op = if rng.gen_bool(0.6) {
            Op::Read
        } else {
            Op::Write
        };
        let mut r = Request::new(
            i * 1_000_000,
            op,
            512 * rng.gen_range(0..100_000u64),
            512 * rng.gen_range(1..64u64),
        );
        r.volume = rng.gen_range(0..3);
        w.write(&r).unwrap();
    }
    w.finish().unwrap();
    std::fs::read(&path).unwrap()
}

const INTERESTING: [u8; 10] = [0, 1, 0x7f, 0x80, 0xff, b',', b' ', b'\n', b'-', b'9'];

fn mutate(base: &[u8], rng: &mut ChaCha8Rng) -> Vec<u8> {
    let mut v = base.to_vec();
    for _ in 0..rng.gen_range(1..6) {
        if v.is_empty() {
            v.push(rng.gen());
            continue;
        }
        let at = rng.gen_range(0..v.len());
        match rng.gen_range(0..6) {
            0 => v[at] ^= 1 << rng.gen_range(0..8),
            1 => v[at] = INTERESTING[rng.gen_range(0..INTERESTING.len())],
            2 => v.truncate(at),
            3 => {
                let end = (at + rng.gen_range(1..64)).min(v.len());
                let chunk = v[at..end].to_vec();
                let to = rng.gen_range(0..v.len());
                v.splice(to..to, chunk);
            }
            4 => {
                let junk: Vec<u8> = (0..rng.gen_range(1..16)).map(|_| rng.gen()).collect();
                v.splice(at..at, junk);
            }
            _ => {
                // A long run of digits: numbers past u64.
                let digits = vec![b'9'; rng.gen_range(1..40)];
                v.splice(at..at, digits);
            }
        }
    }
    v
}

fn read_all(format: Format, bytes: &[u8], skip_bad: bool) -> (usize, Vec<String>) {
    let opts = ReadOptions {
        skip_bad,
        ..Default::default()
    };
    let label = Path::new("fuzz.input");
    let reader =
        TraceReader::from_reader(label, format, Box::new(Cursor::new(bytes.to_vec())), &opts);
    let mut n = 0;
    let mut errors = Vec::new();
    for item in reader {
        match item {
            Ok(_) => n += 1,
            Err(e) => errors.push(e.to_string()),
        }
        // Every request needs at least one input byte (text) or a whole record (binary).
        assert!(
            n <= bytes.len(),
            "{format:?}: {n} requests from {} bytes",
            bytes.len()
        );
    }
    (n, errors)
}

#[test]
fn mutated_traces_give_located_errors_never_panics() {
    let iters: u64 = std::env::var("TIERCACHE_FUZZ_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000);
    let mut total = 0u64;
    for (fi, format) in Format::ALL.into_iter().enumerate() {
        let mut rng = ChaCha8Rng::seed_from_u64(fi as u64);
        let base = sample(format, &mut rng);
        // The unmutated sample reads back whole.
        let (n, errors) = read_all(format, &base, false);
        assert!(
            errors.is_empty() && n == 40,
            "{format:?}: clean sample gave {n} requests, {errors:?}"
        );
        for i in 0..iters {
            let input = mutate(&base, &mut rng);
            for skip_bad in [false, true] {
                let result = std::panic::catch_unwind(|| read_all(format, &input, skip_bad));
                let (_, errors) = result.unwrap_or_else(|_| {
                    panic!(
                        "{format:?} reader panicked on input {i} (skip_bad {skip_bad}): {:?}",
                        String::from_utf8_lossy(&input[..input.len().min(300)])
                    )
                });
                for e in errors {
                    assert!(
                        e.starts_with("fuzz.input:") || e.starts_with("fuzz.input: "),
                        "{format:?}: error without a place: {e}"
                    );
                    assert!(
                        e.len() < 2000,
                        "{format:?}: unbounded error message ({} bytes)",
                        e.len()
                    );
                }
                total += 1;
            }
        }
    }
    println!(
        "fuzz: {total} executions over {} formats",
        Format::ALL.len()
    );
}
