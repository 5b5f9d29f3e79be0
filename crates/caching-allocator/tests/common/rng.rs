//! The tests' one RNG, so they need no RNG crate and replay the same per seed: xorshift64*
//! (12, 25, 27), the generator whose sequences the fuzz replay's seeded inputs and fault
//! injection's committed seeds were chosen with.

/// Xorshift64*. The seed must not be 0.
pub struct Rng(pub u64);

impl Rng {
    /// The next value.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A value in `0..n` (`n > 0`).
    #[allow(dead_code)] // not every test takes numbers below a bound
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// `len` bytes.
    #[allow(dead_code)] // not every test takes bytes
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }
}
