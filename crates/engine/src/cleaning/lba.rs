//! LBA-ordered cleaning: the next dirty line at or after where the last pass stopped,
//! wrapping at the end (one elevator sweep of the disk per round).

use super::Cleaner;
use std::collections::BTreeSet;

#[derive(Default)]
pub struct Lba {
    cursor: u64,
}

impl Cleaner for Lba {
    fn name(&self) -> &'static str {
        "lba"
    }

    fn next(&mut self, dirty: &BTreeSet<u64>) -> u64 {
        match dirty.range(self.cursor..).next() {
            Some(&k) => k,
            None => *dirty.iter().next().expect("called with dirty lines"),
        }
    }

    fn advance(&mut self, end: u64) {
        self.cursor = end;
    }
}
