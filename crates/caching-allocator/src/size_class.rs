//! Size classes: how a requested size is rounded so that one cached block serves many sizes.
//!
//! ExecuTorch's cache keys blocks by their exact padded size, so attention decode, whose
//! scratch grows by a few bytes every token, misses on every call. Here a request is rounded up
//! to a class, and any idle block of that class serves it.
//!
//! | requested size        | classes                                  | worst waste        |
//! |-----------------------|------------------------------------------|--------------------|
//! | 1 B ..= 1 KiB         | multiples of 64 B (64, 128, ..., 1024)   | 63 B               |
//! | (2^k, 2^(k+1)], k >= 10 | 2^k + j * 2^(k-3) for j = 1..=8 (8 per doubling) | under 12.5% |
//!
//! So 1025 B rounds to 1152 B, 4097 B to 4608 B, 1 MiB + 1 B to 1.125 MiB, 3 MB to 3 MiB. The
//! waste bound follows from the step: a request just above `2^k + (j-1) * 2^(k-3)` gets
//! `2^k + j * 2^(k-3)`, so the waste is below `2^(k-3) / 2^k = 1/8`. The scheme is the one
//! mimalloc's bins and PyTorch's `roundup_power2_divisions` use: a few classes per doubling.

/// A size class: the rounded size that a request of a given size is served with.
///
/// ```
/// use caching_allocator::SizeClass;
/// let c = SizeClass::for_size(1025).unwrap();
/// assert_eq!(c.size(), 1152);
/// assert_eq!(SizeClass::for_size(1100), Some(c)); // one class serves both sizes
/// assert_eq!(SizeClass::for_size(0), None);
/// ```
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SizeClass(u16);

/// Sizes up to this many bytes round to a multiple of [`SMALL_STEP`].
const SMALL_MAX: usize = 1024;
/// The step of the small classes: one cache line.
const SMALL_STEP: usize = 64;
/// How many small classes there are (64, 128, ..., 1024).
const SMALL_CLASSES: usize = SMALL_MAX / SMALL_STEP;
/// log2 of the classes per doubling above [`SMALL_MAX`].
const DIVISIONS_LOG2: u32 = 3;
/// log2 of [`SMALL_MAX`].
const SMALL_MAX_LOG2: usize = 10;

impl SizeClass {
    /// How many classes there are; [`SizeClass::index`] is below this.
    pub const COUNT: usize =
        SMALL_CLASSES + (usize::BITS as usize - 1 - SMALL_MAX_LOG2) * (1 << DIVISIONS_LOG2);

    /// The class that serves `size` bytes, or `None` for 0 bytes or a size whose class would
    /// exceed `isize::MAX` bytes.
    #[inline]
    pub const fn for_size(size: usize) -> Option<SizeClass> {
        if size == 0 || size > LARGEST_SIZE {
            return None;
        }
        let index = if size <= SMALL_MAX {
            (size - 1) / SMALL_STEP
        } else {
            // 2^k < size <= 2^(k+1); the doubling is cut in 2^DIVISIONS_LOG2 equal steps.
            let k = (usize::BITS - 1 - (size - 1).leading_zeros()) as usize;
            let step_log2 = k - DIVISIONS_LOG2 as usize;
            let j = (size - 1 - (1 << k)) >> step_log2;
            SMALL_CLASSES + ((k - SMALL_MAX_LOG2) << DIVISIONS_LOG2) + j
        };
        Some(SizeClass(index as u16))
    }

    /// The class's size in bytes: what a block of this class holds.
    #[inline]
    pub const fn size(self) -> usize {
        CLASS_SIZES[self.0 as usize]
    }

    /// `size`, computed: fills the table that `size` reads.
    const fn compute_size(self) -> usize {
        let i = self.0 as usize;
        if i < SMALL_CLASSES {
            (i + 1) * SMALL_STEP
        } else {
            let i = i - SMALL_CLASSES;
            let k = SMALL_MAX_LOG2 + (i >> DIVISIONS_LOG2);
            let j = i & ((1 << DIVISIONS_LOG2) - 1);
            // For the top class this is 2^63, which still fits in usize; `for_size` rejects it.
            (1 << k) + ((j + 1) << (k - DIVISIONS_LOG2 as usize))
        }
    }

    /// The largest class whose size is at most `bytes` (`None` below 64 bytes).
    pub(crate) fn largest_within(bytes: usize) -> Option<SizeClass> {
        let bytes = bytes.min(LARGEST_SIZE);
        let c = SizeClass::for_size(bytes)?;
        if c.size() <= bytes {
            Some(c)
        } else {
            c.0.checked_sub(1).map(SizeClass)
        }
    }

    /// The class's position in the table, from 0 to `COUNT - 1`, smallest first.
    #[inline]
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

/// The largest size with a class: the top class (2^(BITS-1)) exceeds `isize::MAX`, the one
/// below it is the largest that fits.
const LARGEST_SIZE: usize = SizeClass(SizeClass::COUNT as u16 - 2).compute_size();

/// Every class's size, computed at compile time: the hot path reads one entry.
const CLASS_SIZES: [usize; SizeClass::COUNT] = {
    let mut sizes = [0; SizeClass::COUNT];
    let mut i = 0;
    while i < SizeClass::COUNT {
        sizes[i] = SizeClass(i as u16).compute_size();
        i += 1;
    }
    sizes
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_computed_classes() {
        let cases = [
            // Up to 1 KiB: whole cache lines.
            (1, 64),
            (64, 64),
            (65, 128),
            (1000, 1024),
            (1024, 1024),
            // Above: eight classes per power of two.
            (1025, 1152),
            (2048, 2048),
            (2049, 2304),
            (4097, 4608),
            ((1 << 20) + 1, (1 << 20) + (1 << 17)),
            (3_000_000, 3 << 20),
        ];
        for (size, class) in cases {
            assert_eq!(SizeClass::for_size(size).unwrap().size(), class, "{size}");
        }
    }

    #[test]
    fn classes_are_increasing_and_cover_every_size() {
        let mut prev = 0;
        for i in 0..SizeClass::COUNT {
            let c = SizeClass(i as u16);
            assert!(c.size() > prev, "class {i} not increasing");
            if c.size() <= isize::MAX as usize {
                assert_eq!(SizeClass::for_size(c.size()), Some(c));
                assert_eq!(SizeClass::for_size(prev + 1), Some(c));
            }
            prev = c.size();
        }
    }

    #[test]
    fn waste_is_bounded() {
        // Every size near every class boundary, and a sweep of odd sizes.
        let mut sizes: Vec<usize> = (1..5000).collect();
        for i in 0..SizeClass::COUNT - 1 {
            let s = SizeClass(i as u16).size();
            sizes.extend([s - 1, s, s + 1]);
        }
        for size in sizes {
            let Some(c) = SizeClass::for_size(size) else {
                assert!(size > isize::MAX as usize / 2, "no class for {size}");
                continue;
            };
            assert!(c.size() >= size);
            if size >= 1024 {
                let waste = c.size() as f64 / size as f64 - 1.0;
                assert!(waste <= 0.125, "size {size} -> {} wastes {waste}", c.size());
            } else {
                assert_eq!(c.size() % 64, 0);
                assert!(c.size() - size < 64);
            }
        }
    }

    #[test]
    fn the_largest_class_is_the_last_that_fits_isize() {
        assert!(LARGEST_SIZE <= isize::MAX as usize);
        assert!(SizeClass((SizeClass::COUNT - 1) as u16).compute_size() > isize::MAX as usize);
        assert_eq!(
            SizeClass::for_size(LARGEST_SIZE).unwrap().size(),
            LARGEST_SIZE
        );
        assert_eq!(SizeClass::for_size(LARGEST_SIZE + 1), None);
    }

    #[test]
    fn largest_within_is_the_last_class_that_fits() {
        assert_eq!(SizeClass::largest_within(63), None);
        // (bound, the largest class within it). Twice 4608 (the class of 4097 B) is 9216: the
        // classes there are 9216 exactly.
        for (bound, largest) in [
            (64, 64),
            (1151, 1024),
            (1152, 1152),
            (9216, 9216),
            (9215, 8192),
        ] {
            let got = SizeClass::largest_within(bound).map(SizeClass::size);
            assert_eq!(got, Some(largest), "bound {bound}");
        }
        assert!(SizeClass::largest_within(usize::MAX).is_some());
    }

    #[test]
    fn too_large_and_zero_have_no_class() {
        assert_eq!(SizeClass::for_size(0), None);
        assert_eq!(SizeClass::for_size(usize::MAX), None);
        assert_eq!(SizeClass::for_size(isize::MAX as usize), None);
        assert!(SizeClass::for_size(1 << 61).is_some());
    }
}
