//! `tiercache_server::probe`: the one function that reads a cache device's superblocks and
//! names its layout (issue 19 item 1), used by `serve`, `format`, `check` and `open_volume`;
//! and `open_live`, the one function that opens a served volume of either layout.

mod common;

use common::*;
use std::os::unix::fs::FileExt;
use tiercache_engine::Mode;
use tiercache_server::{
    open_live, probe, DirectRun, FileDev, FormatError, Found, LiveOpenOptions, LiveOpenReport,
    LiveVolume, LogFormatOptions, LogGiven,
};

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

type OpenResult = Result<(std::sync::Arc<dyn LiveVolume>, LiveOpenReport), String>;

/// `open_live` with the run's options for `f`; the messages it said are collected.
fn open_live_with(
    f: &Files,
    adjust: impl FnOnce(&mut LiveOpenOptions),
) -> (OpenResult, Vec<String>) {
    let said = std::cell::RefCell::new(Vec::new());
    let say = |l: &str| said.borrow_mut().push(l.to_string());
    let state = |_: &[u8; 16]| None;
    let mut o = LiveOpenOptions {
        cache_name: &f.cache,
        mode: None,
        line_size: None,
        max_cache_errors: None,
        accept_backing_rename: false,
        accept_backing_changes: false,
        state_path: &state,
        direct: DirectRun::default(),
        direct_only: Vec::new(),
        log: LogGiven::default(),
        say: &say,
    };
    adjust(&mut o);
    let r = open_live(
        Box::new(FileDev::open(&f.cache).unwrap()),
        Box::new(FileDev::open(&f.backing).unwrap()),
        &o,
    );
    drop(o);
    (r, said.into_inner())
}

/// `open_live` (issue 19 item 1): one function opens either layout from its superblock and
/// returns it behind the contract; each layout refuses the other's options by name, a wrong
/// line size is refused for both, `--mode` is applied and stored by both, and no cache is
/// an error that says what to do.
#[test]
fn open_live_picks_the_layout_and_refuses_the_other_layouts_options() {
    // No cache.
    let f = files(64, 4096);
    let (r, _) = open_live_with(&f, |_| {});
    let e = r.err().unwrap();
    assert!(e.contains("holds no tiercache cache"), "{e}");

    // Direct layout.
    format(&f, Mode::WriteThrough, 4096);
    let (r, said) = open_live_with(&f, |o| o.mode = Some(Mode::WriteBack));
    let (v, rep) = r.unwrap();
    assert_eq!((v.layout(), rep.layout), ("direct", "direct"));
    assert!(
        said.iter().any(|l| l.contains("lines restored")),
        "{said:?}"
    );
    v.shutdown().unwrap();
    drop(v);
    let sb = tiercache_server::read_superblock(&FileDev::open(&f.cache).unwrap()).unwrap();
    assert_eq!(
        Mode::ALL[sb.mode as usize],
        Mode::WriteBack,
        "--mode stored (direct)"
    );
    let (r, _) = open_live_with(&f, |o| {
        o.log.flags = vec!["--segment-size".into()];
    });
    let e = r.err().unwrap();
    assert!(
        e.contains("--segment-size") && e.contains("is in the direct layout"),
        "{e}"
    );
    let (r, _) = open_live_with(&f, |o| o.line_size = Some(8192));
    let e = r.err().unwrap();
    assert!(e.contains("4096-byte lines, not 8192"), "{e}");

    // Log layout.
    let f = log_cache_files(8, 4 * 4096);
    let o = LogFormatOptions {
        segment_size: 4 * 4096,
        ..Default::default()
    };
    tiercache_server::format_log(&FileDev::open(&f.cache).unwrap(), VOL, &o).unwrap();
    let (r, said) = open_live_with(&f, |o| o.mode = Some(Mode::WriteBack));
    let (v, rep) = r.unwrap();
    assert_eq!((v.layout(), rep.layout), ("log", "log"));
    assert!(said.iter().any(|l| l.contains("(log layout)")), "{said:?}");
    v.shutdown().unwrap();
    drop(v);
    let lsb = tiercache_server::read_log_superblock(&FileDev::open(&f.cache).unwrap())
        .unwrap()
        .unwrap();
    assert_eq!(lsb.mode, Mode::WriteBack, "--mode stored (log)");
    let (r, _) = open_live_with(&f, |o| o.direct_only = vec!["--unmap-batch".into()]);
    let e = r.err().unwrap();
    assert!(
        e.contains("--unmap-batch") && e.contains("direct layout only"),
        "{e}"
    );
    let (r, _) = open_live_with(&f, |o| o.log.segment_size = Some(8 * 4096));
    let e = r.err().unwrap();
    assert!(e.contains("keeps the layout it was formatted with"), "{e}");
    let (r, _) = open_live_with(&f, |o| o.line_size = Some(8192));
    let e = r.err().unwrap();
    assert!(e.contains("4096-byte lines, not 8192"), "{e}");
}
