//! How a kernel's result meets its output buffer: written over it, or added to it (a
//! residual add fused into the kernel).

/// How a kernel's result meets its output buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// `out = result`.
    Overwrite,
    /// `out += result` (a residual add fused into the kernel).
    AddTo,
}

impl Output {
    /// `v` written over, or added to, `out`.
    #[inline(always)]
    pub fn apply(self, out: f32, v: f32) -> f32 {
        match self {
            Output::Overwrite => v,
            Output::AddTo => out + v,
        }
    }
}
