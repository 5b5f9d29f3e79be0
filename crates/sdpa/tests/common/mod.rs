//! Shared test helpers: a poisoning temp allocator, a failing one, data and an f64 reference.
#![allow(dead_code)]

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::Mutex;

use caching_allocator::{AllocError, TempAllocator};
use sdpa::{Params, Shape};

/// Mallocs every request, fills it with 0xFF bytes (NaN as f32) and frees on reset / drop.
/// Records each request's (size, align).
#[derive(Default)]
pub struct PoisonAlloc {
    live: Mutex<Vec<(usize, Layout)>>,
    pub requests: Mutex<Vec<(usize, usize)>>,
}

// SAFETY: each block is a fresh `std::alloc` allocation of `size` (at least 1) bytes aligned to
// `align`, freed only by `reset`.
unsafe impl TempAllocator for PoisonAlloc {
    fn allocate(&self, size: usize, align: usize) -> Result<NonNull<u8>, AllocError> {
        self.requests.lock().unwrap().push((size, align));
        let layout = Layout::from_size_align(size.max(1), align)
            .map_err(|_| AllocError::InvalidAlignment { align })?;
        // SAFETY: `layout` has a non-zero size.
        let p = unsafe { std::alloc::alloc(layout) };
        let p = NonNull::new(p).ok_or(AllocError::OutOfMemory { size, align })?;
        // SAFETY: `p` is valid for `layout.size()` bytes.
        unsafe { p.as_ptr().write_bytes(0xFF, layout.size()) };
        self.live
            .lock()
            .unwrap()
            .push((p.as_ptr() as usize, layout));
        Ok(p)
    }
}

// SAFETY: the reset takes back exactly what this type's `allocate` handed out, as the
// `TempAllocator` impl above describes.
unsafe impl caching_allocator::TempReset for PoisonAlloc {
    unsafe fn reset_unchecked(&self) {
        for (p, layout) in self.live.lock().unwrap().drain(..) {
            // SAFETY: `p` came from `alloc(layout)` and is freed once (drained).
            unsafe { std::alloc::dealloc(p as *mut u8, layout) };
        }
    }
}

impl Drop for PoisonAlloc {
    fn drop(&mut self) {
        // SAFETY: we own the allocator; nothing it handed out is used after drop.
        unsafe { caching_allocator::TempReset::reset_unchecked(self) };
    }
}

/// Refuses every request.
pub struct FailingAlloc;

// SAFETY: it hands out nothing.
unsafe impl TempAllocator for FailingAlloc {
    fn allocate(&self, size: usize, align: usize) -> Result<NonNull<u8>, AllocError> {
        Err(AllocError::OutOfMemory { size, align })
    }
}

// SAFETY: the reset takes back exactly what this type's `allocate` handed out, as the
// `TempAllocator` impl above describes.
unsafe impl caching_allocator::TempReset for FailingAlloc {
    unsafe fn reset_unchecked(&self) {}
}

/// Deterministic pseudo-random floats in `[-amp, amp)` (xorshift64*).
pub fn data(n: usize, seed: u64, amp: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            let r = s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40; // 24 bits
            (r as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * amp
        })
        .collect()
}

/// Naive attention in f64, with the masking rule written out directly: row `i` (position
/// `p = start_pos + i`) sees `..=p` (causal) or everything, and with a window `w` only
/// positions `> p - w`.
pub fn reference(q: &[f32], k: &[f32], v: &[f32], sh: &Shape, p: &Params) -> Vec<f32> {
    let d = sh.head_dim;
    let g = sh.heads / sh.kv_heads;
    let scale = p.scale.map_or(1.0 / (d as f64).sqrt(), f64::from);
    let kv_len = sh.start_pos + sh.q_len;
    let mut out = vec![0f32; sh.batch * sh.q_len * sh.heads * d];
    let mut w = vec![0f64; kv_len];
    for b in 0..sh.batch {
        for i in 0..sh.q_len {
            let n = if p.causal {
                sh.start_pos + i + 1
            } else {
                kv_len
            };
            // A sliding window keeps the last `w` positions up to the row's own.
            let lo = p
                .window
                .map_or(0, |w| (sh.start_pos + i + 1).saturating_sub(w.get()));
            for h in 0..sh.heads {
                let kvh = h / g;
                let qo = ((b * sh.q_len + i) * sh.heads + h) * d;
                let mut mx = f64::NEG_INFINITY;
                for (t, wt) in w[..n].iter_mut().enumerate().skip(lo) {
                    let ko = ((b * sh.kv_capacity + t) * sh.kv_heads + kvh) * d;
                    let dot: f64 = (0..d).map(|x| q[qo + x] as f64 * k[ko + x] as f64).sum();
                    *wt = dot * scale;
                    mx = mx.max(*wt);
                }
                let mut sum = 0.0;
                for wt in &mut w[lo..n] {
                    *wt = (*wt - mx).exp();
                    sum += *wt;
                }
                for x in 0..d {
                    let mut acc = 0.0;
                    for (t, wt) in w[..n].iter().enumerate().skip(lo) {
                        let vo = ((b * sh.kv_capacity + t) * sh.kv_heads + kvh) * d;
                        acc += wt * v[vo + x] as f64;
                    }
                    out[qo + x] = (acc / sum) as f32;
                }
            }
        }
    }
    out
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            if x.is_nan() || y.is_nan() {
                f32::INFINITY
            } else {
                (x - y).abs()
            }
        })
        .fold(0.0, f32::max)
}

/// Inputs for a shape: q with amplitude `amp` (larger = sharper softmax), K/V in [-1, 1). The
/// unused tail of the cache (positions >= start_pos + q_len) is filled with NaN, so reading it
/// would show in the output.
pub fn inputs(sh: &Shape, seed: u64, amp: f32) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let q = data(sh.batch * sh.q_len * sh.heads * sh.head_dim, seed, amp);
    let mut k = data(
        sh.batch * sh.kv_capacity * sh.kv_heads * sh.head_dim,
        seed + 1,
        1.0,
    );
    let mut v = data(
        sh.batch * sh.kv_capacity * sh.kv_heads * sh.head_dim,
        seed + 2,
        1.0,
    );
    let row = sh.kv_heads * sh.head_dim;
    for b in 0..sh.batch {
        for t in sh.start_pos + sh.q_len..sh.kv_capacity {
            let o = (b * sh.kv_capacity + t) * row;
            k[o..o + row].fill(f32::NAN);
            v[o..o + row].fill(f32::NAN);
        }
    }
    (q, k, v)
}

pub fn shape(
    batch: usize,
    q_len: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    start_pos: usize,
) -> Shape {
    Shape {
        batch,
        q_len,
        heads,
        kv_heads,
        head_dim,
        kv_capacity: start_pos + q_len + 3,
        start_pos,
    }
}

/// Hands out memory one byte past a 64-byte boundary (from a [`PoisonAlloc`]).
pub struct MisalignedAlloc(pub PoisonAlloc);

// SAFETY: NOT upheld on purpose for alignment: the pointer is one byte past an aligned block,
// which sdpa must detect (`MisalignedScratch`) before any use; the tests using this check it
// does. The block is still valid for `size` bytes (`size + align` were allocated).
unsafe impl TempAllocator for MisalignedAlloc {
    fn allocate(&self, size: usize, align: usize) -> Result<NonNull<u8>, AllocError> {
        let p = self.0.allocate(size + align, align)?;
        // SAFETY: `p + 1` is inside the `size + align` bytes just allocated.
        Ok(unsafe { p.add(1) })
    }
}

// SAFETY: the reset takes back exactly what this type's `allocate` handed out, as the
// `TempAllocator` impl above describes.
unsafe impl caching_allocator::TempReset for MisalignedAlloc {
    unsafe fn reset_unchecked(&self) {
        // SAFETY: forwarded under the caller's guarantee.
        unsafe { self.0.reset_unchecked() }
    }
}
