//! Warm restart of a big cache (issue 16 item 2): `synth` writes a cache device whose
//! metadata maps `--lines` lines (sparse files: only the 32 B records are real), `open`
//! times [`CacheVolume::open`] on it and shuts down cleanly (so it can be opened again).
//! Driven by `scripts/bench_restart_big.sh`.
//!
//!     restart_bench synth DIR LINES     cache.img (LINES lines of 4 KiB) + backing.img (2x)
//!     restart_bench open DIR            prints: open LINES lines: restored R in S s

use std::path::Path;
use std::time::Instant;
use tiercache_engine::Mode;
use tiercache_server::format::{Record, PAGE, RECORDS_PER_PAGE, RECORD_BYTES};
use tiercache_server::{BlockDev, CacheVolume, FileDev, FormatOptions, OpenOptions, Superblock};

const LS: u64 = 4096;
const META_OFFSET: u64 = tiercache_server::format::META_OFFSET;

fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x
}

fn synth(dir: &Path, lines: u64) {
    let (cpath, bpath) = (dir.join("cache.img"), dir.join("backing.img"));
    // Backing lines: a power of two >= 2 x lines, so an odd multiplier permutes them.
    let space = (2 * lines).next_power_of_two();
    let vol = space * LS;
    let cache_bytes = Superblock::data_offset_with(lines, LS, false) + lines * LS;
    std::fs::File::create(&cpath)
        .unwrap()
        .set_len(cache_bytes)
        .unwrap();
    std::fs::File::create(&bpath).unwrap().set_len(vol).unwrap();
    let dev = FileDev::open(&cpath).unwrap();
    let t = Instant::now();
    tiercache_server::format(
        &dev,
        vol,
        &FormatOptions {
            line_size: LS,
            mode: Mode::WriteBack,
            ..Default::default()
        },
    )
    .unwrap();
    // Every slot holds a line: random keys (distinct), 20 % dirty, 5 % partial, sequence
    // numbers in random order per page (as many flushes wrote them).
    let chunk_pages = 16384u64; // 64 MiB of records
    let pages = lines.div_ceil(RECORDS_PER_PAGE);
    let mut buf = vec![0u8; (chunk_pages * PAGE) as usize];
    let mut p = 0;
    while p < pages {
        let n = (pages - p).min(chunk_pages);
        for (i, r) in buf[..(n * PAGE) as usize]
            .chunks_mut(RECORD_BYTES as usize)
            .enumerate()
        {
            let slot = p * RECORDS_PER_PAGE + i as u64;
            if slot >= lines {
                Record::EMPTY.encode(r);
                continue;
            }
            let h = mix(slot);
            let key = slot.wrapping_mul(0x9e37_79b9_7f4a_7c15) & (space - 1);
            let valid = if h.is_multiple_of(20) { 0x0f } else { 0xff };
            let dirty = if h % 5 == 1 { valid } else { 0 };
            let seq = (mix(slot / RECORDS_PER_PAGE) as u32) & 0x3fff_ffff;
            Record {
                key,
                valid,
                dirty,
                seq,
            }
            .encode(r);
        }
        dev.write_at(&buf[..(n * PAGE) as usize], META_OFFSET + p * PAGE)
            .unwrap();
        p += n;
    }
    dev.sync().unwrap();
    println!(
        "synth {lines} lines: {} in {:.1} s",
        cpath.display(),
        t.elapsed().as_secs_f64()
    );
}

fn open(dir: &Path) {
    let t = Instant::now();
    let (vol, rep) = CacheVolume::open(
        Box::new(FileDev::open(&dir.join("cache.img")).unwrap()),
        Box::new(FileDev::open(&dir.join("backing.img")).unwrap()),
        &OpenOptions::default(),
    )
    .unwrap();
    let s = t.elapsed().as_secs_f64();
    // CPU time too: on a shared, loaded machine the wall time mostly measures the others.
    // SAFETY: getrusage fills the struct it is given.
    let cpu = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        tv(u.ru_utime) + tv(u.ru_stime)
    };
    let lines = vol.capacity_lines();
    // Shut down before printing: a closed pipe (`| head`) panics the prints, and must not
    // leave the synthetic cache unclean (the next open would take the crash path).
    vol.shutdown().unwrap();
    println!(
        "open {lines} lines: restored {} ({} dirty) in {s:.3} s wall, {cpu:.3} s CPU (process so far)",
        rep.restored, rep.restored_dirty
    );
    for (name, wall, cpu) in &rep.phases {
        println!("  {name:<24} {wall:.3} s wall {cpu:.3} s CPU");
    }
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    match a.get(1).map(String::as_str) {
        Some("synth") if a.len() == 4 => synth(Path::new(&a[2]), a[3].parse().unwrap()),
        Some("open") if a.len() == 3 => open(Path::new(&a[2])),
        _ => {
            eprintln!("usage: restart_bench synth DIR LINES | restart_bench open DIR");
            std::process::exit(2)
        }
    }
}
