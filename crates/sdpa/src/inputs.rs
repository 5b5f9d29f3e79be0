//! Reading Q, K and V as f32: borrowed as they are when they are f32, otherwise converted (bf16,
//! f16) or dequantized (int8 cache) into a scratch buffer of the caller's worker slice.

use crate::elem::{Element, Elems};
use crate::kernels::int8::Q16;
use crate::kernels::layout::{GroupedHeads, Strided};
use crate::kernels::row::KvRow;
use crate::kernels::Kernels;
use crate::quant::QuantizedKv;
use crate::KvCache;

/// One of K or V.
pub(crate) enum Kv<'a, T> {
    /// Stored in the element type of the call.
    Dense(&'a [T]),
    /// int8 with per-(position, head) scales and zero points.
    Int8(QuantizedKv<'a>),
}

impl<T> Kv<'_, T> {
    /// Which cache kind this is.
    pub(crate) fn cache(&self) -> KvCache {
        match self {
            Kv::Dense(_) => KvCache::Dense,
            Kv::Int8(_) => KvCache::Int8,
        }
    }
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

    /// Whether this is the int8 cache.
    pub(crate) fn is_int8(&self) -> bool {
        matches!(self, Kv::Int8(_))
    }

    /// Whether decode reads this storage with the row kernels ([`Kv::scores_row`],
    /// [`Kv::axpy_row`]): f32, bf16 and int8. f16 has no row kernels in the table and goes
    /// through [`Kv::load`] and the f32 kernels instead.
    pub(crate) fn reads_rows(&self) -> bool {
        matches!(self, Kv::Int8(_)) || T::DTYPE != crate::Dtype::F16
    }

    /// The int8 cache, if this is one.
    pub(crate) fn int8(&self) -> Option<&QuantizedKv<'_>> {
        match self {
            Kv::Int8(c) => Some(c),
            Kv::Dense(_) => None,
        }
    }

    /// Position row `t` (counted over the whole cache: `batch * kv_capacity + position`) of
    /// an int8 cache, `kv_heads` heads of `d` values, as the row kernels take it.
    #[inline]
    pub(crate) fn int8_row<'s>(
        c: &QuantizedKv<'s>,
        t: usize,
        kv_heads: usize,
        d: usize,
    ) -> KvRow<'s, i8> {
        let r = t * kv_heads;
        KvRow {
            x: &c.values[r * d..(r + kv_heads) * d],
            scales: &c.scales[r..r + kv_heads],
            zps: &c.zero_points[r..r + kv_heads],
        }
    }

    /// Scores of the query heads `q` (`heads * d` floats, `kv_heads = heads / group`)
    /// against position row `t`: `s[h * lds] = q_h . k_{t, h / group}` (`Strided(s, lds) =
    /// out`). The int8 cache takes the same query rows quantized to i16 (`q16`, required then;
    /// see [`crate::kernels::int8::scores_q16`]).
    #[inline]
    pub(crate) fn scores_row(
        &self,
        kern: &Kernels,
        q: &[f32],
        q16: Option<Q16<'_>>,
        hg: GroupedHeads,
        t: usize,
        out: Strided<&mut [f32]>,
    ) {
        let d = hg.d;
        let kvh = q.len() / d / hg.group;
        match self {
            Kv::Int8(c) => {
                let k = Self::int8_row(c, t, kvh, d);
                let q16 = q16.expect("int8 K is scored with the i16 query");
                // SAFETY: slice-based kernel (checks its lengths); set chosen for this CPU.
                unsafe { (kern.scores_q16)(q16, hg, k, out) }
            }
            Kv::Dense(x) => {
                let r = t * kvh;
                match T::elems(&x[r * d..(r + kvh) * d]) {
                    // SAFETY: as above.
                    Elems::F32(k) => unsafe { (kern.scores_f32)(q, hg, KvRow::dense(k), out) },
                    // SAFETY: as above.
                    Elems::Bf16(k) => unsafe { (kern.scores_bf16)(q, hg, KvRow::dense(k), out) },
                    // SAFETY: the portable kernel is safe to call.
                    Elems::F16(k) => unsafe {
                        crate::kernels::row::scores_row(q, hg, KvRow::dense(k), out)
                    },
                }
            }
        }
    }

    /// `acc += P . V` for the `w = t.len()` position rows `t[u]` (one to four): head `h`'s
    /// accumulator `acc[h d..][..d]` gets `sum_u p[h * ldp + u] * v_{t[u], h / group}`
    /// (`Strided(p, ldp) = weights`).
    #[inline]
    pub(crate) fn axpy_row(
        &self,
        kern: &Kernels,
        acc: &mut [f32],
        hg: GroupedHeads,
        weights: Strided<&[f32]>,
        t: &[usize],
    ) {
        let (d, w) = (hg.d, t.len());
        let kvh = acc.len() / d / hg.group;
        // Four positions for the arrays below; the kernels read only the first `w`.
        let t: [usize; 4] = core::array::from_fn(|u| t[u.min(w - 1)]);
        match self {
            Kv::Int8(c) => {
                let v = t.map(|t| Self::int8_row(c, t, kvh, d));
                // SAFETY: slice-based kernel (checks its lengths); set chosen for this CPU.
                unsafe { (kern.axpy_i8)(acc, hg, weights, &v[..w]) }
            }
            Kv::Dense(x) => {
                let v = t.map(|t| T::elems(&x[t * kvh * d..(t + 1) * kvh * d]));
                match v {
                    [Elems::F32(a), Elems::F32(b), Elems::F32(c), Elems::F32(e)] => {
                        let v = [a, b, c, e].map(KvRow::dense);
                        // SAFETY: as above.
                        unsafe { (kern.axpy_f32)(acc, hg, weights, &v[..w]) }
                    }
                    [Elems::Bf16(a), Elems::Bf16(b), Elems::Bf16(c), Elems::Bf16(e)] => {
                        let v = [a, b, c, e].map(KvRow::dense);
                        // SAFETY: as above.
                        unsafe { (kern.axpy_bf16)(acc, hg, weights, &v[..w]) }
                    }
                    [Elems::F16(a), Elems::F16(b), Elems::F16(c), Elems::F16(e)] => {
                        let v = [a, b, c, e].map(KvRow::dense);
                        // SAFETY: the portable kernel is safe to call.
                        unsafe { crate::kernels::row::axpy_row(acc, hg, weights, &v[..w]) }
                    }
                    _ => unreachable!("one element type per call"),
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
