//! LBA-ordered cleaning: the next dirty line at or after where the last pass stopped,
//! wrapping at the end (one elevator sweep of the disk per round).

use super::{Cleaner, DirtyKeys};

#[derive(Default)]
pub struct Lba {
    cursor: u64,
}

impl Cleaner for Lba {
    fn name(&self) -> &'static str {
        "lba"
    }

    fn next(&mut self, dirty: &mut DirtyKeys<'_>) -> u64 {
        match dirty.first_from(self.cursor, None) {
            Some(k) => k,
            None => dirty.first_from(0, None).expect("called with dirty lines"),
        }
    }

    fn advance(&mut self, end: u64) {
        self.cursor = end;
    }
}
