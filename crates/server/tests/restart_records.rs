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
use tiercache_server::{BlockDev, FileDev, LineState};

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
