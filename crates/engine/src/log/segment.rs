//! Segments (Nitro's Write-Evict Units): filled in memory, written whole, reclaimed whole.

/// Where a segment is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegState {
    /// Holds nothing; may be opened.
    Free,
    /// Being filled in RAM (NVRAM for dirty data); reads of its extents are RAM hits.
    Open,
    /// Written to the SSD; a reclamation candidate.
    Sealed,
}

/// One extent as the segment header describes it (the base entry).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HdrEntry {
    /// Line key (volume and line number) the extent was stored for.
    pub key: u64,
    pub fp: u64,
    /// Byte offset inside the segment and stored (possibly compressed) length.
    pub off: u32,
    pub len: u32,
    /// Stored compressed (false: raw, because compression was off or did not shrink it).
    pub compressed: bool,
    pub dirty: bool,
    /// Hits since insertion (saturating), for the reinsertion policy.
    pub hits: u16,
}

/// A segment: its generation number (bumped on every reclamation, so entries that remember an
/// older generation are known stale), its fill and its header.
#[derive(Clone, Debug)]
pub struct Segment {
    pub gen: u32,
    pub state: SegState,
    /// Bytes appended (stored bytes, live or not).
    pub used: u32,
    /// Stored bytes of header extents still mapped by their base entry.
    pub live: u32,
    /// Request tick when the segment was sealed (age for cost-benefit).
    pub sealed_at: u64,
    /// Request tick of the last hit.
    pub last_hit: u64,
    pub hdr: Vec<HdrEntry>,
}

impl Segment {
    pub fn new() -> Self {
        Segment {
            gen: 0,
            state: SegState::Free,
            used: 0,
            live: 0,
            sealed_at: 0,
            last_hit: 0,
            hdr: Vec::new(),
        }
    }

    /// Bytes a header with this many extents takes on the SSD: magic, version, generation,
    /// count and checksum (24 B), then per extent key, fingerprint (32 B BLAKE3 live),
    /// offset, length and flags (56 B).
    pub fn header_bytes(extents: usize) -> u64 {
        24 + 56 * extents as u64
    }
}

impl Default for Segment {
    fn default() -> Self {
        Self::new()
    }
}
