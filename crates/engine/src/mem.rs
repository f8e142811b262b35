//! Heap-size estimates of the standard containers the engine and the live volume keep per
//! line, for `index_bytes` / `ram_index_bytes`: what the allocator holds, not what the
//! entries are worth. Estimates, not exact (the containers do not expose their nodes); the
//! live volume's total is checked against a counting allocator in
//! `crates/server/tests/ram_accounting.rs`.

/// Bytes of a `hashbrown` (and so `std`) hash map or set with `capacity` usable entries of
/// `entry` bytes each: buckets are a power of two at most 7/8 full, one control byte each.
/// Given a map's length instead, the smallest table that holds its entries (what the state
/// needs, not what a past peak left allocated).
pub fn hash_bytes(capacity: usize, entry: usize) -> usize {
    if capacity == 0 {
        return 0;
    }
    let buckets = if capacity < 8 {
        if capacity < 4 {
            4
        } else {
            8
        }
    } else {
        (capacity * 8 / 7).next_power_of_two()
    };
    buckets * (entry + 1) + 16
}

/// Bytes of a `std` B-tree map or set of `len` entries of `entry` bytes (key plus value): a
/// leaf holds up to 11 entries behind 12 bytes of header, leaves are about two thirds full
/// (half full after ascending inserts, fuller after random ones), and internal nodes add
/// about a tenth.
pub fn btree_bytes(len: usize, entry: usize) -> usize {
    if len == 0 {
        return 0;
    }
    let leaves = len.div_ceil(7);
    leaves * (12 + 11 * entry) * 11 / 10
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimates_grow_with_entries() {
        assert_eq!(hash_bytes(0, 8), 0);
        assert!(hash_bytes(1000, 8) >= 1000 * 9);
        assert!(btree_bytes(1000, 8) >= 1000 * 8);
        assert!(btree_bytes(1000, 8) < 1000 * 20);
    }
}
