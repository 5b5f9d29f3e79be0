//! Reading Q, K and V as f32: borrowed as they are when they are f32, otherwise converted (bf16,
//! f16) or dequantized (int8 cache) into a scratch buffer of the caller's worker slice.

use crate::elem::{Element, Elems};
use crate::kernels::Kernels;
use crate::quant::QuantizedKv;

/// One of K or V.
pub(crate) enum Kv<'a, T> {
    /// Stored in the element type of the call.
    Dense(&'a [T]),
    /// int8 with per-(position, head) scales and zero points.
    Int8(QuantizedKv<'a>),
}

/// `src` as f32: borrowed if it already is, else widened into `buf[..src.len()]`.
#[inline]
pub(crate) fn as_f32<'s, T: Element>(
    kern: &Kernels,
    src: &'s [T],
    buf: &'s mut [f32],
) -> &'s [f32] {
    let n = src.len();
    match T::elems(src) {
        Elems::F32(x) => x,
        Elems::Bf16(x) => {
            // SAFETY: slice-based kernel (panics if `buf` is short); set chosen for this CPU.
            unsafe { (kern.widen_bf16)(x, buf) };
            &buf[..n]
        }
        Elems::F16(x) => {
            // SAFETY: as above.
            unsafe { (kern.widen_f16)(x, buf) };
            &buf[..n]
        }
    }
}

impl<T: Element> Kv<'_, T> {
    /// Whether reading this needs a conversion buffer.
    pub(crate) fn converts(&self) -> bool {
        !matches!((self, T::DTYPE), (Kv::Dense(_), crate::Dtype::F32))
    }

    /// Elements `off..off + n` (whole head vectors: `off` and `n` multiples of `d`) as f32:
    /// borrowed when f32, else converted into `buf[..n]`.
    #[inline]
    pub(crate) fn load<'s>(
        &'s self,
        kern: &Kernels,
        d: usize,
        off: usize,
        n: usize,
        buf: &'s mut [f32],
    ) -> &'s [f32] {
        match self {
            Kv::Dense(x) => as_f32(kern, &x[off..off + n], buf),
            Kv::Int8(c) => {
                debug_assert!(off.is_multiple_of(d) && n.is_multiple_of(d));
                let (vals, first) = (&c.values[off..off + n], off / d);
                for (h, (src, dst)) in vals
                    .chunks_exact(d)
                    .zip(buf[..n].chunks_exact_mut(d))
                    .enumerate()
                {
                    let (scale, zp) = (c.scales[first + h], c.zero_points[first + h]);
                    // SAFETY: slice-based kernel (equal lengths d); set chosen for this CPU.
                    unsafe { (kern.dequant)(src, scale, zp, dst) };
                }
                &buf[..n]
            }
        }
    }

    /// Whether decode's dot and axpy read this storage directly ([`Kv::dot`], [`Kv::axpy4`])
    /// rather than through a converted buffer: bf16 and int8 (f32 needs no conversion; f16
    /// has no fused kernel and goes through `load`).
    pub(crate) fn fused(&self) -> bool {
        matches!(self, Kv::Int8(_)) || T::DTYPE == crate::Dtype::Bf16
    }

    /// `q . x` for the head vector `x` number `row` (elements `row * d..(row + 1) * d`,
    /// `d = q.len()`). Taking the row, not an element offset, spares a division per call:
    /// the per-head scale and zero point are indexed by it.
    #[inline]
    pub(crate) fn dot(&self, kern: &Kernels, q: &[f32], row: usize) -> f32 {
        let d = q.len();
        let off = row * d;
        match self {
            Kv::Int8(c) => {
                // SAFETY: slice-based kernel (equal lengths d); set chosen for this CPU.
                let raw = unsafe { (kern.dot_i8)(q, &c.values[off..off + d], c.zero_points[row]) };
                c.scales[row] * raw
            }
            Kv::Dense(x) => match T::elems(&x[off..off + d]) {
                // SAFETY: as above.
                Elems::F32(k) => unsafe { (kern.dot)(q, k) },
                // SAFETY: as above.
                Elems::Bf16(k) => unsafe { (kern.dot_bf16)(q, k) },
                Elems::F16(k) => q.iter().zip(k).map(|(a, b)| a * b.to_f32()).sum(),
            },
        }
    }

    /// `acc += sum_u p[u] * x_u` for the head vectors `x_u` number `rows[u]` (`acc.len()`
    /// elements each).
    #[inline]
    pub(crate) fn axpy4(&self, kern: &Kernels, acc: &mut [f32], p: [f32; 4], rows: [usize; 4]) {
        let d = acc.len();
        match self {
            Kv::Int8(c) => {
                let w = [0, 1, 2, 3].map(|u| p[u] * c.scales[rows[u]]);
                let v = rows.map(|r| &c.values[r * d..(r + 1) * d]);
                let zp = rows.map(|r| c.zero_points[r]);
                // SAFETY: slice-based kernel (equal lengths d); set chosen for this CPU.
                unsafe { (kern.axpy4_i8)(acc, w, v, zp) };
            }
            Kv::Dense(x) => {
                let v = rows.map(|r| T::elems(&x[r * d..(r + 1) * d]));
                match v {
                    [Elems::F32(a), Elems::F32(b), Elems::F32(c), Elems::F32(e)] => {
                        // SAFETY: as above.
                        unsafe { (kern.axpy4)(acc, p, [a, b, c, e]) }
                    }
                    [Elems::Bf16(a), Elems::Bf16(b), Elems::Bf16(c), Elems::Bf16(e)] => {
                        // SAFETY: as above.
                        unsafe { (kern.axpy4_bf16)(acc, p, [a, b, c, e]) }
                    }
                    _ => {
                        for (u, &r) in rows.iter().enumerate() {
                            for (a, e) in acc.iter_mut().zip(&x[r * d..(r + 1) * d]) {
                                *a += p[u] * e.to_f32();
                            }
                        }
                    }
                }
            }
        }
    }

    /// Elements `off..off + n` (whole head vectors) as f32, always written to `dst[..n]`.
    #[inline]
    pub(crate) fn load_into(
        &self,
        kern: &Kernels,
        d: usize,
        off: usize,
        n: usize,
        dst: &mut [f32],
    ) {
        if let Kv::Dense(x) = self {
            if let Elems::F32(x) = T::elems(&x[off..off + n]) {
                dst[..n].copy_from_slice(x);
                return;
            }
        }
        self.load(kern, d, off, n, dst);
    }

    /// Prefetch hint for rows `j < n` of `d` elements at element `start + j * stride`.
    #[inline]
    pub(crate) fn prefetch(&self, kern: &Kernels, start: usize, stride: usize, n: usize, d: usize) {
        let (ptr, len, size) = match self {
            Kv::Dense(x) => (x.as_ptr().cast::<u8>(), x.len(), size_of::<T>()),
            Kv::Int8(c) => (c.values.as_ptr().cast::<u8>(), c.values.len(), 1),
        };
        // SAFETY: a hint only, for addresses the kernel checks lie inside the `len * size`
        // bytes at `ptr` (one slice); kernel set chosen for this CPU.
        unsafe { (kern.prefetch_rows)(ptr, len * size, start * size, stride * size, n, d * size) };
    }
}
