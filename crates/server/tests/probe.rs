//! `tiercache_server::probe`: the one function that reads a cache device's superblocks and
//! names its layout (issue 19 item 1), used by `serve`, `format`, `check` and `open_volume`.

mod common;

use common::*;
use std::os::unix::fs::FileExt;
use tiercache_engine::Mode;
use tiercache_server::{probe, FileDev, FormatError, Found, LogFormatOptions};

fn found(f: &Files) -> Found {
    probe(&FileDev::open(&f.cache).unwrap()).unwrap()
}

/// Flips one byte of the cache file at `at`.
fn flip(f: &Files, at: u64) {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&f.cache)
        .unwrap();
    let mut b = [0u8];
    file.read_exact_at(&mut b, at).unwrap();
    b[0] ^= 0x5a;
    file.write_all_at(&b, at).unwrap();
}

#[test]
fn probe_names_each_layout_and_tells_no_cache_from_a_damaged_one() {
    // Nothing on the device: no cache at all.
    let f = files(64, 4096);
    assert!(matches!(found(&f), Found::NoCache(FormatError::BadMagic)));
    assert_eq!(found(&f).layout(), None);
    assert_eq!(found(&f).uuid(), None);

    // A direct-layout cache, with its uuid.
    format(&f, Mode::WriteBack, 4096);
    let sb = tiercache_server::read_superblock(&FileDev::open(&f.cache).unwrap()).unwrap();
    let d = found(&f);
    assert!(matches!(d, Found::Direct(_)), "{d:?}");
    assert_eq!(d.layout(), Some("direct"));
    assert_eq!(d.uuid(), Some(sb.uuid));
    // Its superblock damaged past the magic: still a (damaged) direct-layout cache.
    flip(&f, 40);
    let d = found(&f);
    assert!(
        matches!(d, Found::NoCache(ref e) if !matches!(e, FormatError::BadMagic)),
        "{d:?}"
    );
    assert_eq!(d.layout(), Some("direct"));

    // A log-layout cache, with its uuid.
    let f = log_cache_files(8, 4 * 4096);
    let o = LogFormatOptions {
        segment_size: 4 * 4096,
        ..Default::default()
    };
    let lsb = tiercache_server::format_log(&FileDev::open(&f.cache).unwrap(), VOL, &o).unwrap();
    let l = found(&f);
    assert!(matches!(l, Found::Log(_)), "{l:?}");
    assert_eq!(l.layout(), Some("log"));
    assert_eq!(l.uuid(), Some(lsb.uuid));
    // Its superblock damaged past the magic: a damaged log-layout cache, not "no cache".
    flip(&f, 40);
    let l = found(&f);
    assert!(matches!(l, Found::DamagedLog(_)), "{l:?}");
    assert_eq!(l.layout(), Some("log"));
    assert_eq!(l.uuid(), None);
}
