//! Every format: requests the format can represent, written by its writer (plain and through
//! each compressor), detected and read back unchanged.

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::path::Path;
use tiercache_engine::{Op, Request};
use tiercache_trace::{detect, open, open_writer, Format, ReadOptions};

/// What survives a round trip through `f`.
fn representable(f: Format, mut r: Request) -> Request {
    let sector = |x: u64| x / 512 * 512;
    // Writers of sector-granular formats cover the request: offset down, end up.
    let cover = |r: &Request| {
        (
            sector(r.offset),
            r.end().div_ceil(512) * 512 - sector(r.offset),
        )
    };
    // Byte-length formats with sector offsets keep the end.
    let keep_end = |r: &Request| (sector(r.offset), r.end() - sector(r.offset));
    let rw = |op: Op| if op == Op::Write { Op::Write } else { Op::Read };
    match f {
        Format::Simple => return r,
        Format::Msr => {
            r.op = rw(r.op);
            r.time_ns = r.time_ns / 100 * 100;
        }
        Format::Systor => r.op = rw(r.op),
        Format::Tencent => {
            r.op = rw(r.op);
            r.time_ns = r.time_ns / 1_000_000_000 * 1_000_000_000;
            (r.offset, r.len) = cover(&r);
        }
        Format::Alibaba => {
            r.op = rw(r.op);
            r.time_ns = r.time_ns / 1000 * 1000;
        }
        Format::Spc => {
            r.op = rw(r.op);
            (r.offset, r.len) = keep_end(&r);
        }
        Format::Disksim => {
            r.op = rw(r.op);
            (r.offset, r.len) = cover(&r);
        }
        Format::Arc => {
            let (o, l) = cover(&r);
            r = Request::new(0, Op::Read, o, l);
        }
        Format::LcsTxt => r = Request::new(0, Op::Read, r.offset / 512 * 512, 512),
        Format::Blkparse => {
            (r.offset, r.len) = cover(&r);
            match r.op {
                Op::Flush => (r.offset, r.len) = (0, 0),
                Op::Trim => r.fua = false,
                _ => {}
            }
            r.class = 0;
            return r;
        }
        Format::LcsCsv => {
            r.time_ns = r.time_ns / 1_000_000_000 * 1_000_000_000;
            (r.offset, r.len) = keep_end(&r);
            r.volume = 0;
        }
        Format::OracleGeneral => {
            let t = r.time_ns / 1_000_000_000 * 1_000_000_000;
            let (o, l) = keep_end(&r);
            r = Request::new(t, Op::Read, o, l);
        }
        Format::Vscsi => {
            r.time_ns = r.time_ns / 1000 * 1000;
            (r.offset, r.len) = keep_end(&r);
            r.volume = 0;
        }
        Format::Fiu => {
            r.op = rw(r.op);
            (r.offset, r.len) = cover(&r);
        }
        other => panic!("{other}: add what survives its round trip here"),
    }
    r.class = 0;
    r.fua = false;
    r
}

fn random_requests(seed: u64, n: usize) -> Vec<Request> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut t = rng.gen_range(0..2_000_000_000_000_000u64);
    (0..n)
        .map(|_| {
            t += rng.gen_range(0..5_000_000_000u64);
            let op = [
                Op::Read,
                Op::Write,
                Op::Write,
                Op::Read,
                Op::Trim,
                Op::Flush,
            ][rng.gen_range(0..6)];
            let mut r = Request::new(
                t,
                op,
                rng.gen_range(0..1u64 << 40),
                rng.gen_range(0..4u64 << 20),
            );
            r.class = rng.gen_range(0..32);
            r.volume = if rng.gen_bool(0.5) {
                rng.gen_range(0..8)
            } else {
                rng.gen()
            };
            r.fua = rng.gen_bool(0.2);
            r
        })
        .collect()
}

fn relative(reqs: &[Request]) -> Vec<Request> {
    let t0 = reqs.first().map_or(0, |r| r.time_ns);
    reqs.iter()
        .map(|r| Request {
            time_ns: r.time_ns.saturating_sub(t0),
            ..*r
        })
        .collect()
}

fn write_all(path: &Path, f: Format, reqs: &[Request]) -> u64 {
    let mut w = open_writer(path, f).unwrap();
    for r in reqs {
        w.write(r).unwrap();
    }
    let dropped = w.dropped();
    w.finish().unwrap();
    dropped
}

fn read_all(path: &Path, f: Option<Format>) -> Vec<Request> {
    open(path, f, &ReadOptions::default())
        .unwrap()
        .map(|r| r.unwrap_or_else(|e| panic!("{e}")))
        .collect()
}

#[test]
fn every_format_round_trips_through_every_compression() {
    let dir = tempfile::tempdir().unwrap();
    for (i, f) in Format::ALL.into_iter().enumerate() {
        let input = random_requests(i as u64, 300);
        let kept: Vec<Request> = input
            .iter()
            .filter(|r| match f {
                Format::Simple | Format::Blkparse | Format::LcsCsv | Format::Vscsi => true,
                Format::Arc | Format::LcsTxt | Format::OracleGeneral => {
                    matches!(r.op, Op::Read | Op::Write)
                }
                _ => matches!(r.op, Op::Read | Op::Write),
            })
            .map(|r| representable(f, *r))
            .collect();
        let want = relative(&kept);
        for ext in ["", ".gz", ".zst", ".xz", ".bz2"] {
            let path = dir.path().join(format!("trace{i}.dat{ext}"));
            let dropped = write_all(&path, f, &input);
            assert_eq!(dropped as usize, input.len() - kept.len(), "{f}{ext}");
            assert_eq!(detect(&path).unwrap(), f, "detect {f}{ext}");
            let got = read_all(&path, Some(f));
            assert_eq!(got.len(), want.len(), "{f}{ext}");
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g, w, "{f}{ext}: request {k}");
            }
            assert_eq!(read_all(&path, None), got, "auto {f}{ext}");
        }
    }
}

#[test]
fn compression_is_found_by_magic_bytes_not_name() {
    let dir = tempfile::tempdir().unwrap();
    let reqs = relative(&random_requests(7, 50));
    for ext in ["gz", "zst", "xz", "bz2"] {
        let path = dir.path().join(format!("t.csv.{ext}"));
        write_all(&path, Format::Simple, &reqs);
        let renamed = dir.path().join(format!("t-{ext}.csv"));
        std::fs::rename(&path, &renamed).unwrap();
        assert_eq!(read_all(&renamed, None), reqs, "{ext}");
    }
}

#[test]
fn vscsi_version_2_records() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v2.vscsi");
    let reqs: Vec<Request> = random_requests(3, 100)
        .into_iter()
        .map(|mut r| {
            r.len %= 1 << 20;
            representable(Format::Vscsi, r)
        })
        .collect();
    let mut bytes = Vec::new();
    for (i, r) in reqs.iter().enumerate() {
        bytes.extend_from_slice(&tiercache_trace::formats::vscsi::encode_v2(r, i as u32));
    }
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(detect(&path).unwrap(), Format::Vscsi);
    assert_eq!(read_all(&path, None), relative(&reqs));
}

#[test]
fn arc_and_oracle_block_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.lis");
    std::fs::write(&path, "100 8 0 0\n7 1 0 1\n").unwrap();
    let opts = ReadOptions {
        block_size: Some(4096),
        ..Default::default()
    };
    let got: Vec<_> = open(&path, None, &opts)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        got,
        [
            Request::new(0, Op::Read, 100 * 4096, 8 * 4096),
            Request::new(0, Op::Read, 7 * 4096, 4096)
        ]
    );
    let path = dir.path().join("t.oracleGeneral.bin");
    let mut w = open_writer(&path, Format::OracleGeneral).unwrap();
    w.set_block_size(4096);
    w.write(&Request::new(0, Op::Read, 3 * 4096, 4096)).unwrap();
    w.write(&Request::new(2_000_000_000, Op::Write, 3 * 4096, 8192))
        .unwrap();
    w.finish().unwrap();
    let bytes = std::fs::read(&path).unwrap();
    // next_access_vtime of the first record points at the second; the second has none.
    assert_eq!(i64::from_le_bytes(bytes[16..24].try_into().unwrap()), 1);
    assert_eq!(i64::from_le_bytes(bytes[40..48].try_into().unwrap()), -1);
    let got: Vec<_> = open(&path, None, &opts)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        got[1],
        Request::new(2_000_000_000, Op::Read, 3 * 4096, 8192)
    );
}

fn any_request() -> impl Strategy<Value = Request> {
    (
        any::<u64>(),
        prop_oneof![
            Just(Op::Read),
            Just(Op::Write),
            Just(Op::Trim),
            Just(Op::Flush)
        ],
        any::<u64>(),
        any::<u64>(),
        0u8..=31,
        any::<u32>(),
        any::<bool>(),
    )
        .prop_map(|(time_ns, op, offset, len, class, volume, fua)| Request {
            time_ns,
            op,
            offset,
            len,
            class,
            volume,
            fua,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn simple_format_is_lossless(mut reqs in proptest::collection::vec(any_request(), 0..40)) {
        reqs.sort_by_key(|r| r.time_ns);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.csv");
        write_all(&path, Format::Simple, &reqs);
        prop_assert_eq!(read_all(&path, Some(Format::Simple)), relative(&reqs));
    }

    #[test]
    fn unsorted_times_saturate_at_zero(reqs in proptest::collection::vec(any_request(), 1..20)) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("u.csv");
        write_all(&path, Format::Simple, &reqs);
        prop_assert_eq!(read_all(&path, Some(Format::Simple)), relative(&reqs));
    }

    /// Arbitrary bytes never panic a reader, whatever the format.
    #[test]
    fn garbage_never_panics(bytes in proptest::collection::vec(
        prop_oneof![any::<u8>(), Just(b','), Just(b'\n'), Just(b' '), Just(b'1'), Just(b'R')],
        0..400,
    )) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.dat");
        std::fs::write(&path, &bytes).unwrap();
        let _ = detect(&path);
        for f in Format::ALL {
            for skip_bad in [false, true] {
                let opts = ReadOptions { skip_bad, ..Default::default() };
                let mut reader = open(&path, Some(f), &opts).unwrap();
                for r in reader.by_ref().take(1000) {
                    let _ = r;
                }
                let _ = reader.skipped();
            }
        }
    }
}
