//! Warm restart from random record areas (issue 16 item 2: one decode, duplicates found by
//! sorting keys, `Engine::restore_bulk`, only changed records rewritten): after an unclean
//! stop with duplicate keys (torn flushes), records failing their checksum, records mapping
//! no sector and records in flux, the open restores exactly the newest record of each key
//! (the lower slot among equal sequence numbers), reports what it dropped, and a clean
//! restart after it finds the same lines (so the dropped records were emptied on the
//! device and no kept one was lost).

mod common;

use common::*;
use rand::Rng;
use std::collections::BTreeMap;
use tiercache_engine::Mode;
use tiercache_server::format::{seq_newer, Record, META_OFFSET, RECORD_BYTES};
use tiercache_server::{BlockDev, CacheVolume, FileDev, LineState, OpenOptions};

const LINES: u64 = 200;

#[test]
fn open_restores_the_newest_record_of_each_key() {
    for seed in 0..40u64 {
        let mut rng = rng(seed);
        let f = files(LINES, 4096);
        format(&f, Mode::WriteBack, 4096);
        let dev = FileDev::open(&f.cache).unwrap();
        let mut sb = tiercache_server::read_superblock(&dev).unwrap();
        sb.clean = false;
        dev.write_at(&sb.encode(), 0).unwrap();
        // Keys from a small range (many duplicates), sequence numbers around a wrap.
        let keys = VOL / 4096;
        let base: u32 = if seed % 2 == 0 { 100 } else { u32::MAX - 50 };
        let mut area = vec![0u8; (LINES * RECORD_BYTES) as usize];
        let mut want: BTreeMap<u64, (u32, Record)> = BTreeMap::new();
        let (mut bad, mut dups) = (0u64, 0u64);
        let mut flagged: BTreeMap<u32, bool> = BTreeMap::new();
        for slot in 0..LINES as u32 {
            let at = slot as usize * RECORD_BYTES as usize;
            let rec = &mut area[at..at + RECORD_BYTES as usize];
            let kind = rng.gen_range(0..20);
            if kind == 0 {
                Record::EMPTY.encode(rec);
                rec[3] ^= 0x40; // torn: fails its checksum
                bad += 1;
                continue;
            }
            if kind == 1 {
                Record::EMPTY.encode(rec);
                continue;
            }
            let valid: u64 = match kind {
                2 => 0, // maps no sector: not restored
                3..=5 => rng.gen_range(1..=0xff),
                _ => 0xff,
            };
            let r = Record {
                key: rng.gen_range(0..keys),
                valid,
                dirty: if rng.gen_bool(0.3) { valid } else { 0 },
                seq: base.wrapping_add(rng.gen_range(0..100)),
            };
            // Some in flux (rule 5): restart compares them with the backing device, whose
            // bytes the winners' slots hold (below), so they stay as recorded.
            let flux = rng.gen_bool(0.1);
            r.encode_flagged(rec, flux);
            if valid == 0 {
                continue;
            }
            flagged.insert(slot, flux);
            match want.get(&r.key) {
                Some((_, old)) if !seq_newer(r.seq, old.seq) => dups += 1,
                Some(_) => {
                    dups += 1;
                    want.insert(r.key, (slot, r));
                }
                None => {
                    want.insert(r.key, (slot, r));
                }
            }
        }
        dev.write_at(&area, META_OFFSET).unwrap();
        // Every slot's data equals the backing device's line its winner maps (so the clean
        // sample finds no difference and drops nothing).
        let data_offset = sb.data_offset;
        let backing = std::fs::read(&f.backing).unwrap();
        for &(slot, r) in want.values() {
            let l = (r.key * 4096) as usize;
            dev.write_at(&backing[l..l + 4096], data_offset + slot as u64 * 4096)
                .unwrap();
        }
        dev.sync().unwrap();
        drop(dev);
        let mut expect: Vec<LineState> = want
            .values()
            .map(|&(slot, r)| LineState {
                key: r.key,
                slot,
                valid: r.valid,
                dirty: r.dirty,
            })
            .collect();
        expect.sort_by_key(|l| l.slot);
        let (vol, rep) = open(&f, None);
        assert_eq!(
            vol.lines(),
            expect,
            "seed {seed}: lines after the unclean open"
        );
        assert_eq!(
            (
                rep.restored,
                rep.dropped_duplicates,
                rep.dropped_bad_checksum,
                rep.in_flux,
                rep.in_flux_dirty + rep.in_flux_dropped
            ),
            (
                expect.len() as u64,
                dups,
                bad,
                expect.iter().filter(|l| flagged[&l.slot]).count() as u64,
                0
            ),
            "seed {seed}: report {rep:?}"
        );
        vol.shutdown().unwrap();
        drop(vol);
        let (vol, rep) = open(&f, None);
        assert!(rep.was_clean, "seed {seed}");
        assert_eq!(
            (rep.dropped_duplicates, rep.dropped_bad_checksum),
            (0, 0),
            "seed {seed}: the first open left stale records on the device"
        );
        assert_eq!(
            vol.lines(),
            expect,
            "seed {seed}: lines after a clean restart"
        );
        vol.shutdown().unwrap();
    }
}

/// The same at a size where open reads the record area in chunks on every core and the
/// radix sorts split into buckets (`volume::bulk`: > 32 MiB of records, > 65,536 values):
/// 1.2 M slots, duplicate keys planted across chunks, bad, empty, unmapping and in-flux
/// records spread over the area. Sparse files: only the records are written.
#[test]
fn open_of_a_big_record_area_restores_the_newest_record_of_each_key() {
    const BIG: u64 = 1_200_000;
    const SPACE: u64 = 1 << 21; // backing lines
    let dir = tmp();
    let (cpath, bpath) = (dir.path().join("cache.img"), dir.path().join("backing.img"));
    let bytes = tiercache_server::Superblock::data_offset_with(BIG, 4096, false) + BIG * 4096;
    std::fs::File::create(&cpath)
        .unwrap()
        .set_len(bytes)
        .unwrap();
    std::fs::File::create(&bpath)
        .unwrap()
        .set_len(SPACE * 4096)
        .unwrap();
    let dev = FileDev::open(&cpath).unwrap();
    let sb = tiercache_server::format(
        &dev,
        SPACE * 4096,
        &tiercache_server::FormatOptions {
            line_size: 4096,
            mode: Mode::WriteBack,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(sb.capacity_lines, BIG);
    let mut sb = sb;
    sb.clean = false;
    dev.write_at(&sb.encode(), 0).unwrap();
    let mut rng = rng(7);
    let mut area = vec![0u8; (BIG * RECORD_BYTES) as usize];
    let mut want: BTreeMap<u64, (u32, Record)> = BTreeMap::new();
    let (mut bad, mut dups, mut flux_n) = (0u64, 0u64, 0u64);
    for slot in 0..BIG as u32 {
        let at = slot as usize * RECORD_BYTES as usize;
        let rec = &mut area[at..at + RECORD_BYTES as usize];
        let kind = rng.gen_range(0..1000);
        if kind == 0 {
            Record::EMPTY.encode(rec);
            rec[5] ^= 1; // torn
            bad += 1;
            continue;
        }
        if kind < 20 {
            Record::EMPTY.encode(rec);
            continue;
        }
        // Distinct keys (a permutation of the slots), but 1 in 500 takes the key of a slot
        // ~600,000 before or after it (another chunk): a torn flush's duplicate.
        let mut key = (slot as u64).wrapping_mul(0x9e37_79b9) & (SPACE - 1);
        if kind < 22 {
            let other = (slot as u64 + 600_000) % BIG;
            key = other.wrapping_mul(0x9e37_79b9) & (SPACE - 1);
        }
        let valid: u64 = match kind {
            22..=24 => 0,
            25..=100 => rng.gen_range(1..=0xff),
            _ => 0xff,
        };
        let r = Record {
            key,
            valid,
            dirty: if rng.gen_bool(0.2) { valid } else { 0 },
            seq: rng.gen_range(0..1_000_000u32),
        };
        // In flux: the slot and the backing line are both zeros (sparse), so they stay.
        let flux = kind % 97 == 50;
        r.encode_flagged(rec, flux);
        if valid == 0 {
            continue;
        }
        flux_n += flux as u64;
        match want.get(&r.key) {
            Some((_, old)) if !seq_newer(r.seq, old.seq) => {
                dups += 1;
                // The loser was in flux: not compared, not counted.
                flux_n -= flux as u64;
            }
            Some(&(s, _)) => {
                dups += 1;
                let at = s as usize * RECORD_BYTES as usize;
                flux_n -= Record::in_flux(&area[at..at + RECORD_BYTES as usize]) as u64;
                want.insert(r.key, (slot, r));
            }
            None => {
                want.insert(r.key, (slot, r));
            }
        }
    }
    assert!(
        dups > 1000 && bad > 1000 && flux_n > 1000,
        "{dups} {bad} {flux_n}"
    );
    dev.write_at(&area, META_OFFSET).unwrap();
    dev.sync().unwrap();
    drop(dev);
    let mut expect: Vec<LineState> = want
        .values()
        .map(|&(slot, r)| LineState {
            key: r.key,
            slot,
            valid: r.valid,
            dirty: r.dirty,
        })
        .collect();
    expect.sort_by_key(|l| l.slot);
    let open = || {
        CacheVolume::open(
            Box::new(FileDev::open(&cpath).unwrap()),
            Box::new(FileDev::open(&bpath).unwrap()),
            &OpenOptions::default(),
        )
        .unwrap()
    };
    let (vol, rep) = open();
    assert!(vol.lines() == expect, "lines after the unclean open");
    assert_eq!(
        (
            rep.restored,
            rep.dropped_duplicates,
            rep.dropped_bad_checksum,
            rep.in_flux,
            rep.dropped_clean_lines
        ),
        (expect.len() as u64, dups, bad, flux_n, 0),
        "report {rep:?}"
    );
    assert_eq!(
        rep.restored_dirty,
        expect.iter().filter(|l| l.dirty != 0).count() as u64
    );
    assert_eq!(rep.sampled_clean_lines, 256);
    vol.shutdown().unwrap();
    drop(vol);
    let (vol, rep) = open();
    assert!(rep.was_clean);
    assert_eq!((rep.dropped_duplicates, rep.dropped_bad_checksum), (0, 0));
    assert!(vol.lines() == expect, "lines after a clean restart");
    vol.shutdown().unwrap();
}
