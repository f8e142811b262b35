//! Every registered trace format (`formats::REGISTRY`), by what its `Spec` declares: names
//! and aliases parse back to it, a writable format's output reads back and is detected as
//! itself, a header is written where declared, and a malformed record is reported with its
//! line (text) or record number (binary). A new format gets these checks from its registry
//! line alone.

use std::io::Write;
use tiercache_engine::{Op, Request};
use tiercache_trace::formats::REGISTRY;
use tiercache_trace::{detect, open, open_writer, Format, ReadOptions};

fn requests() -> Vec<Request> {
    (0..40u64)
        .map(|i| {
            let op = if i % 3 == 0 { Op::Write } else { Op::Read };
            // Varied sizes: headerless Tencent records whose sizes (sectors) are all SCSI
            // opcodes fit lcs-csv too; later lines of other sizes tell them apart.
            let len = (1 + i % 5) * 4096;
            let mut r = Request::new(1_000_000_000 * (i + 1), op, (i * 7919 % 512) * 4096, len);
            r.volume = 0;
            r
        })
        .collect()
}

#[test]
fn names_and_aliases_are_unique_and_parse_back() {
    let mut seen = std::collections::HashSet::new();
    assert_eq!(REGISTRY.len(), Format::ALL.len());
    for (spec, f) in REGISTRY.iter().zip(Format::ALL) {
        assert_eq!(spec.name, f.name());
        assert!(!spec.description.is_empty(), "{f}");
        for n in std::iter::once(&spec.name).chain(spec.aliases) {
            assert!(seen.insert(*n), "name {n} registered twice");
            assert_eq!(n.parse::<Format>().unwrap(), f, "{n}");
        }
        assert_eq!(f.is_binary(), spec.record_size != 0);
        if spec.first_record.is_some() {
            assert!(
                spec.record_size > 0,
                "{f}: a first-record size needs a binary format"
            );
        }
        assert!(
            spec.header.is_none() || !f.is_binary(),
            "{f}: a binary format with a header line"
        );
    }
    let e = "nope".parse::<Format>().unwrap_err();
    for f in Format::ALL {
        assert!(e.contains(f.name()), "{e}");
    }
}

#[test]
fn every_writable_format_round_trips_and_detects_its_own_output() {
    let dir = tempfile::tempdir().unwrap();
    let reqs = requests();
    let mut checked = 0;
    for f in Format::ALL.into_iter().filter(|f| f.is_writable()) {
        // A name that hints at no format: detection must go by content alone.
        let path = dir.path().join(format!("conformance-{checked}.dat"));
        let mut w = open_writer(&path, f).unwrap();
        for r in &reqs {
            w.write(r).unwrap();
        }
        assert_eq!(w.written(), reqs.len() as u64, "{f}");
        w.finish().unwrap();
        if let Some(h) = f.spec().header {
            let text = std::fs::read_to_string(&path).unwrap();
            assert_eq!(text.lines().next(), Some(h), "{f}: header");
        }
        assert_eq!(
            detect(&path).unwrap(),
            f,
            "{f}: detection of its own output"
        );
        let back: Vec<Request> = open(&path, None, &ReadOptions::default())
            .unwrap()
            .map(|r| r.unwrap_or_else(|e| panic!("{f}: {e}")))
            .collect();
        assert_eq!(back.len(), reqs.len(), "{f}");
        for (k, (b, r)) in back.iter().zip(&reqs).enumerate() {
            // Units differ (sectors, blocks, seconds): the sector a request starts in stays.
            assert_eq!(b.offset / 512, r.offset / 512, "{f}: request {k}");
            let op = if f.has_op() { r.op } else { Op::Read };
            assert_eq!(b.op, op, "{f}: request {k}");
        }
        // What was read back is what the format can say: a second trip changes nothing.
        let again = dir.path().join(format!("conformance-{checked}-again.dat"));
        let mut w = open_writer(&again, f).unwrap();
        for r in &back {
            w.write(r).unwrap();
        }
        w.finish().unwrap();
        let twice: Vec<Request> = open(&again, Some(f), &ReadOptions::default())
            .unwrap()
            .map(|r| r.unwrap_or_else(|e| panic!("{f}: {e}")))
            .collect();
        assert_eq!(twice, back, "{f}: a second round trip changed requests");
        checked += 1;
    }
    assert!(checked >= 14, "only {checked} writable formats");
}

#[test]
fn a_malformed_record_is_reported_with_its_line_or_record() {
    let dir = tempfile::tempdir().unwrap();
    let reqs = &requests()[..3];
    for (i, f) in Format::ALL.into_iter().enumerate() {
        let path = dir.path().join(format!("bad-{i}.dat"));
        let mut w = open_writer(&path, f).unwrap();
        for r in reqs {
            w.write(r).unwrap();
        }
        w.finish().unwrap();
        let first_error = |extra: &[u8]| {
            let mut file = std::fs::OpenOptions::new()
                .append(true)
                .open(&path)
                .unwrap();
            file.write_all(extra).unwrap();
            drop(file);
            open(&path, Some(f), &ReadOptions::default())
                .unwrap()
                .find_map(Result::err)
                .map(|e| e.to_string())
        };
        let (e, want) = if f.is_binary() {
            // A truncated record after three whole ones.
            let e = first_error(&[1, 2, 3]);
            (e, "record 4 (byte".to_string())
        } else {
            let text = std::fs::read_to_string(&path).unwrap();
            let line_no = text.lines().count() + 1;
            let want = format!("{}:{line_no}: ", path.display());
            match first_error(b"12 zz 34 qq 56 xx 78 yy 9a\n") {
                Some(e) => (Some(e), want),
                None => {
                    // Formats that skip foreign lines (blkparse's summaries): a record of
                    // its own with its last number spoilt.
                    let last = text.lines().last().unwrap();
                    let cut = last
                        .rfind(|c: char| c.is_ascii_digit())
                        .expect("a record has a number");
                    let bad = format!("{}x{}\n", &last[..cut], &last[cut + 1..]);
                    std::fs::write(&path, format!("{text}{bad}")).unwrap();
                    (first_error(b""), want)
                }
            }
        };
        let e = e.unwrap_or_else(|| panic!("{f}: the malformed record was accepted"));
        assert!(e.contains(&want), "{f}: {e:?} does not name {want:?}");
    }
}
