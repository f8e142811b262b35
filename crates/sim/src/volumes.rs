//! Several volumes in one pool (`docs/design-pool.md`): traces merged into one request stream,
//! one volume each, and the per-volume figures of a run.

use crate::Input;
use anyhow::{Context, Result};
use serde::Serialize;
use std::sync::Arc;
use tiercache_engine::{Counters, Engine, Request, VolumeConfig, VolumeStats};

/// One volume of a merged run: its name and where its requests come from.
#[derive(Clone, Debug)]
pub struct VolumeInput {
    pub name: String,
    pub input: Input,
}

/// Merges the volumes' inputs into one stream by arrival time: volume i of the list becomes
/// volume id i, each input's own order is kept (a trace need not be sorted by time), and a
/// tie goes to the earlier volume. Each trace's clock starts at its first record (as every
/// reader gives it), so the traces are replayed as if started together. An input whose
/// requests name several volumes of their own (a volume column) is refused: its volumes
/// would fold into one. Returns the merged input (in memory) and the volume table.
pub fn merge_volumes(vols: &[VolumeInput]) -> Result<(Input, Vec<VolumeConfig>)> {
    anyhow::ensure!(!vols.is_empty(), "no volumes to merge");
    let mut streams: Vec<Vec<Request>> = Vec::with_capacity(vols.len());
    let mut table = Vec::with_capacity(vols.len());
    for (i, v) in vols.iter().enumerate() {
        let id = i as u32;
        anyhow::ensure!(
            id <= tiercache_engine::engine::MAX_VOLUME,
            "too many volumes ({}; at most {})",
            vols.len(),
            tiercache_engine::engine::MAX_VOLUME + 1
        );
        if let Some(o) = vols[..i].iter().find(|o| o.name == v.name) {
            anyhow::bail!(
                "volume name '{}' is given twice ({} and {}); names must be unique",
                v.name,
                o.input,
                v.input
            );
        }
        let mut reqs = Vec::new();
        let mut own: Option<u32> = None;
        v.input
            .for_each(|r| {
                match own {
                    None => own = Some(r.volume),
                    Some(o) if o != r.volume => anyhow::bail!(
                        "{}: request {} is of volume {} but the first was of volume {o}: a trace \
                     with a volume column of several volumes cannot be one volume of a merge \
                     (replay it alone: its volumes are kept apart and reported with \
                     --per-volume)",
                        v.input,
                        reqs.len() + 1,
                        r.volume
                    ),
                    Some(_) => {}
                }
                let mut r = *r;
                r.volume = id;
                reqs.push(r);
                Ok(())
            })
            .with_context(|| format!("volume '{}'", v.name))?;
        streams.push(reqs);
        table.push(VolumeConfig::new(id, v.name.clone()));
    }
    let total = streams.iter().map(Vec::len).sum();
    let mut merged = Vec::with_capacity(total);
    let mut pos = vec![0usize; streams.len()];
    // A k-way merge of the heads (k is small: a scan per request is cheaper than a heap).
    while merged.len() < total {
        let (i, _) = streams
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.get(pos[i]).map(|r| (i, r.time_ns)))
            .min_by_key(|&(i, t)| (t, i))
            .expect("requests left");
        merged.push(streams[i][pos[i]]);
        pos[i] += 1;
    }
    let name = vols
        .iter()
        .map(|v| format!("{}={}", v.name, v.input.label()))
        .collect::<Vec<_>>()
        .join(" + ");
    Ok((
        Input::Memory {
            name,
            requests: Arc::new(merged),
        },
        table,
    ))
}

/// What one volume did in a run (`SimResult::volumes`).
#[derive(Clone, Debug, Serialize)]
pub struct VolumeFigures {
    pub id: u32,
    pub name: String,
    pub mode: String,
    pub admission: String,
    pub requests: u64,
    pub line_accesses: u64,
    pub hit_ratio: f64,
    pub read_hit_ratio: f64,
    pub write_hit_ratio: f64,
    /// Cached lines of the volume at the end, and their share of the pool's capacity.
    pub lines: u64,
    pub pool_share: f64,
    pub dirty_lines: u64,
    pub counters: Counters,
}

impl VolumeFigures {
    /// Per volume of `e` (empty when the engine has no volume table).
    pub fn of(e: &Engine) -> Vec<VolumeFigures> {
        Self::of_stats(e.volume_stats(), e.capacity_lines())
    }

    /// Per volume of `stats` ([`Engine::volume_stats`] or a sharded engine's) in a pool of
    /// `capacity_lines`.
    pub fn of_stats(stats: Vec<VolumeStats>, capacity_lines: u64) -> Vec<VolumeFigures> {
        let cap = capacity_lines.max(1) as f64;
        stats
            .into_iter()
            // `--per-volume` alone lists volume 0 to switch counting on: left out unless it
            // is named, was used or holds lines.
            .filter(|v| v.counters.requests > 0 || v.lines > 0 || v.name != v.id.to_string())
            .map(|v| VolumeFigures {
                id: v.id,
                name: v.name,
                mode: v.mode.to_string(),
                admission: v.admission.to_string(),
                requests: v.counters.requests,
                line_accesses: v.counters.line_accesses,
                hit_ratio: v.counters.hit_ratio(),
                read_hit_ratio: v.counters.read_hit_ratio(),
                write_hit_ratio: v.counters.write_hit_ratio(),
                lines: v.lines,
                pool_share: v.lines as f64 / cap,
                dirty_lines: v.dirty_lines,
                counters: v.counters,
            })
            .collect()
    }
}
