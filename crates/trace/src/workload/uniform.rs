//! `uniform`: uniformly random aligned offsets over the working set.

use super::Space;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

#[derive(Clone, Debug)]
pub(crate) struct Uniform {
    space: Space,
}

impl Uniform {
    pub fn new(space: Space) -> Self {
        Uniform { space }
    }

    /// A uniformly random aligned offset where `len` bytes fit.
    #[inline]
    pub fn next(&mut self, len: u64, rng: &mut ChaCha8Rng) -> u64 {
        rng.gen_range(0..=self.space.max_slot(len)) * self.space.align
    }
}
