//! FIU/SyLab traces with content hashes (`formats/fiu.rs`): a sample in the traces' layout
//! (`ts_ns pid process lba sectors op major minor md5`) is detected by content, read as
//! requests through the registry, and read with its MD5s as a content trace.

use std::path::PathBuf;
use tiercache_engine::Op;
use tiercache_trace::content::ContentModel;
use tiercache_trace::formats::fiu;
use tiercache_trace::{detect, open, Format, ReadOptions};

fn sample() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/sample.fiu")
}

#[test]
fn sample_is_detected_and_read_as_requests() {
    assert_eq!(detect(&sample()).unwrap(), Format::Fiu);
    // By content alone, under a name that hints at nothing.
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("trace.txt");
    std::fs::copy(sample(), &plain).unwrap();
    assert_eq!(detect(&plain).unwrap(), Format::Fiu);
    let reqs: Vec<_> = open(&sample(), None, &ReadOptions::default())
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(reqs.len(), 5);
    assert_eq!(reqs[0].time_ns, 0);
    assert_eq!(reqs[2].time_ns, 89_966_934_100_000 - 89_966_933_207_045);
    assert_eq!(
        (reqs[0].op, reqs[0].offset, reqs[0].len),
        (Op::Write, 904_265_560 * 512, 4096)
    );
    assert_eq!((reqs[2].op, reqs[2].offset), (Op::Read, 16 * 512));
    assert_eq!(reqs[3].len, 8192);
    assert_eq!(reqs[0].volume, 6 << 20);
    assert_eq!(reqs[3].volume, 8 << 20 | 1);
}

#[test]
fn sample_with_content_has_its_duplicates() {
    let text = std::fs::read(sample()).unwrap();
    let t = fiu::read(&text[..], "sample.fiu", &ContentModel::new(4096, 1)).unwrap();
    assert_eq!(t.len(), 5);
    // Lines 1 and 3 carry the same MD5: the same fingerprint; line 2 another.
    assert_eq!(t.content(0)[0].fp, t.content(2)[0].fp);
    assert_ne!(t.content(0)[0].fp, t.content(1)[0].fp);
    // An 8 KiB request covers two 4 KiB lines.
    assert_eq!(t.content(3).len(), 2);
}

#[test]
fn a_bad_md5_names_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.fiu");
    let mut text = std::fs::read_to_string(sample()).unwrap();
    text.push_str("89966936000000 1 init 24 8 R 6 0 not-a-hash\n");
    std::fs::write(&p, text).unwrap();
    let e = open(&p, Some(Format::Fiu), &ReadOptions::default())
        .unwrap()
        .find_map(Result::err)
        .unwrap()
        .to_string();
    assert!(e.contains("bad.fiu:6: column 9 (md5): 'not-a-hash'"), "{e}");
}
