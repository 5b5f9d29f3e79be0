//! A tiny xorshift, so the tests need no RNG crate and replay the same per seed (the stress
//! and v2 tests; the fuzz replay and fault injection use the xorshift* of `star_rng.rs`, whose
//! sequences their committed seeds were chosen with).

/// Xorshift64 (13, 7, 17). The seed must not be 0.
pub struct Rng(pub u64);

impl Rng {
    /// The next value.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}
