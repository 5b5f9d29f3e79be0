//! Safetensors files, memory-mapped: one file or shards listed by
//! `model.safetensors.index.json`. A small reader (and a writer, for tests and tools) of the
//! format: 8 bytes little-endian header length, a JSON header
//! `{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}`, then the
//! data; offsets are relative to the end of the header.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{LlmError, Result};

/// Element types the kernels read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE single precision.
    F32,
    /// bfloat16: the top half of an f32.
    BF16,
    /// IEEE half precision.
    F16,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::BF16 | DType::F16 => 2,
        }
    }

    /// The name in a safetensors header.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::BF16 => "BF16",
            DType::F16 => "F16",
        }
    }

    fn parse(s: &str) -> Option<DType> {
        match s {
            "F32" => Some(DType::F32),
            "BF16" => Some(DType::BF16),
            "F16" => Some(DType::F16),
            _ => None,
        }
    }
}

/// Bytes a tensor's data lives in: a memory-mapped file or an owned, 8-aligned buffer.
pub(crate) enum Backing {
    Mmap(memmap2::Mmap),
    Owned { words: Vec<u64>, len: usize },
}

impl Backing {
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mmap(m) => m,
            Backing::Owned { words, len } => {
                // SAFETY: `words` holds `words.len() * 8 >= len` initialised bytes (the
                // constructor's invariant); u8 has no alignment or validity requirement.
                unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), *len) }
            }
        }
    }

    /// The file at `path`, memory-mapped read-only (an empty file: an empty owned buffer,
    /// which cannot be mapped).
    pub(crate) fn map(path: &Path) -> Result<Backing> {
        let io = |source| LlmError::Io {
            path: path.into(),
            source,
        };
        let f = std::fs::File::open(path).map_err(io)?;
        if f.metadata().map_err(io)?.len() == 0 {
            return Ok(Backing::owned(&[]));
        }
        // SAFETY: the mapping is read-only and private; a file changed by another process
        // while mapped could change what we read (the caveat of every runtime that maps
        // weights) but not invalidate the mapping, which stays valid until dropped.
        let map = unsafe { memmap2::Mmap::map(&f) }.map_err(io)?;
        Ok(Backing::Mmap(map))
    }

    /// Gives the pages wholly inside `bytes()[offset..offset + len]` back to the system, for
    /// a range no reader needs again (a quantized matrix once packed): on Linux and Android
    /// a mapping's resident pages of it are dropped, so they stop counting in the process's
    /// memory. A later read still sees the file's bytes (faulted in again). Owned buffers,
    /// other systems and failures: nothing happens (the pages merely stay resident).
    pub(crate) fn release(&self, offset: usize, len: usize) {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        if let Backing::Mmap(map) = self {
            // SAFETY: sysconf has no preconditions.
            let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
            let Ok(page) = usize::try_from(page) else {
                return;
            };
            if page == 0 || offset.saturating_add(len) > map.len() {
                return;
            }
            // The mapping starts on a page boundary: the interior pages of the range.
            let begin = offset.next_multiple_of(page);
            let end = (offset + len) / page * page;
            if end > begin {
                // SAFETY: `begin..end` lies inside the mapping (checked above). The mapping
                // is private and read-only, so it has never held a page that differs from
                // the file: MADV_DONTNEED only unmaps pages, and any read through a borrow
                // of these bytes (none is expected) faults the same file contents back in.
                // The bytes a borrow observes do not change.
                let _ = unsafe {
                    map.unchecked_advise_range(
                        memmap2::UncheckedAdvice::DontNeed,
                        begin,
                        end - begin,
                    )
                };
            }
        }
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        let _ = (offset, len);
    }

    /// An owned copy of `bytes`, 8-byte aligned.
    pub(crate) fn owned(bytes: &[u8]) -> Backing {
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        // SAFETY: `words` has room for `words.len() * 8 >= bytes.len()` bytes; the regions are
        // distinct allocations, so they do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                words.as_mut_ptr().cast::<u8>(),
                bytes.len(),
            )
        };
        Backing::Owned {
            words,
            len: bytes.len(),
        }
    }

    /// An owned zeroed buffer of `len` bytes, to be filled through [`Backing::bytes_mut`].
    pub(crate) fn zeroed(len: usize) -> Backing {
        Backing::Owned {
            words: vec![0u64; len.div_ceil(8)],
            len,
        }
    }

    /// The bytes of an owned buffer (`None` for a mapping).
    pub(crate) fn bytes_mut(&mut self) -> Option<&mut [u8]> {
        match self {
            Backing::Mmap(_) => None,
            Backing::Owned { words, len } => {
                // SAFETY: as in `bytes`, and `&mut self` makes the borrow unique.
                Some(unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast(), *len) })
            }
        }
    }
}

/// One tensor: dtype, shape and a view of its bytes (aligned to its element size).
#[derive(Clone)]
pub struct Tensor {
    dtype: DType,
    shape: Vec<usize>,
    backing: Arc<Backing>,
    offset: usize,
    len: usize,
    path: Arc<PathBuf>,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tensor")
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field("path", &self.path)
            .finish()
    }
}

/// A typed view of a tensor's elements (bf16 and f16 as their raw bits).
#[derive(Clone, Copy, Debug)]
pub enum TensorData<'a> {
    /// f32 elements.
    F32(&'a [f32]),
    /// bf16 bits.
    BF16(&'a [u16]),
    /// f16 bits.
    F16(&'a [u16]),
}

impl Tensor {
    /// Builds a tensor from owned bytes (copied into an aligned buffer).
    ///
    /// # Errors
    /// [`LlmError::InvalidArgument`] when `bytes` does not hold `shape.product()` elements.
    pub fn from_bytes(dtype: DType, shape: &[usize], bytes: &[u8]) -> Result<Tensor> {
        Self::from_backing(dtype, shape, Backing::owned(bytes), "<memory>")
    }

    pub(crate) fn from_backing(
        dtype: DType,
        shape: &[usize],
        backing: Backing,
        origin: &str,
    ) -> Result<Tensor> {
        let len = backing.bytes().len();
        let numel: usize = shape.iter().product();
        if numel.checked_mul(dtype.size()) != Some(len) {
            return Err(LlmError::InvalidArgument {
                message: format!("{len} bytes for a {dtype:?} tensor of shape {shape:?}"),
            });
        }
        Ok(Tensor {
            dtype,
            shape: shape.to_vec(),
            backing: Arc::new(backing),
            offset: 0,
            len,
            path: Arc::new(PathBuf::from(origin)),
        })
    }

    /// A view of `len` bytes at `offset` of a shared backing (a GGUF file's mapping, or an
    /// aligned copy when the data is misaligned for `dtype`).
    pub(crate) fn from_shared(
        dtype: DType,
        shape: &[usize],
        backing: &Arc<Backing>,
        offset: usize,
        len: usize,
        path: &Arc<PathBuf>,
    ) -> Tensor {
        let addr = backing.bytes().as_ptr() as usize + offset;
        let (backing, offset) = if addr.is_multiple_of(dtype.size()) {
            (backing.clone(), offset)
        } else {
            let b = Backing::owned(&backing.bytes()[offset..offset + len]);
            (Arc::new(b), 0)
        };
        Tensor {
            dtype,
            shape: shape.to_vec(),
            backing,
            offset,
            len,
            path: path.clone(),
        }
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The file the tensor comes from (`<memory>` for generated weights).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Raw little-endian bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.backing.bytes()[self.offset..self.offset + self.len]
    }

    /// The elements, typed.
    pub fn data(&self) -> TensorData<'_> {
        let b = self.bytes();
        let p = b.as_ptr();
        if self.dtype == DType::F32 {
            // SAFETY: construction guarantees `p` is aligned to the element size (misaligned
            // data is copied into an aligned owned buffer) and `b.len()` is a multiple of it;
            // the bytes live as long as `&self` (the backing is kept alive by the Arc), and
            // every bit pattern is a valid f32.
            let x = unsafe { std::slice::from_raw_parts(p.cast::<f32>(), b.len() / 4) };
            return TensorData::F32(x);
        }
        // SAFETY: as above, for the 2-byte types (every bit pattern is a valid u16).
        let x = unsafe { std::slice::from_raw_parts(p.cast::<u16>(), b.len() / 2) };
        if self.dtype == DType::BF16 {
            TensorData::BF16(x)
        } else {
            TensorData::F16(x)
        }
    }

    /// All elements widened to f32 (for small tensors: norms, biases).
    pub fn to_f32(&self) -> Vec<f32> {
        match self.data() {
            TensorData::F32(x) => x.to_vec(),
            TensorData::BF16(x) => x.iter().map(|&b| bf16_to_f32(b)).collect(),
            TensorData::F16(x) => x.iter().map(|&b| f16_to_f32(b)).collect(),
        }
    }
}

/// bf16 bits to f32 (exact).
#[inline]
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// f32 to bf16 bits, rounding to nearest even (NaN stays NaN).
pub fn f32_to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) | 0x40) as u16;
    }
    let round = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(round) >> 16) as u16
}

/// f16 bits to f32 (exact, subnormals included).
#[inline]
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = match exp {
        0 => {
            if man == 0 {
                sign
            } else {
                // Subnormal: value = man * 2^-24.
                let v = man as f32 * f32::from_bits(0x3380_0000); // 2^-24
                return if sign != 0 { -v } else { v };
            }
        }
        0x1f => sign | 0x7f80_0000 | (man << 13),
        e => sign | ((e + 127 - 15) << 23) | (man << 13),
    };
    f32::from_bits(bits)
}

/// f32 to f16 bits, rounding to nearest even (for tests and tools; not on a hot path).
pub fn f32_to_f16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    if x.is_nan() {
        return sign | 0x7e00;
    }
    let a = x.abs();
    if a >= 65520.0 {
        return sign | 0x7c00;
    }
    if a < f32::from_bits(0x3880_0000) {
        // Below 2^-14: subnormal f16, value = round(a * 2^24) * 2^-24.
        let m = (a * 16_777_216.0).round_ties_even() as u16;
        return sign | m;
    }
    let e = ((bits >> 23) & 0xff) as i32 - 127 + 15;
    let man = bits & 0x7f_ffff;
    let mut h = ((e as u32) << 10) | (man >> 13);
    let rest = man & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && (h & 1) == 1) {
        h += 1;
    }
    sign | h as u16
}

/// A header entry, checked against the file length.
struct Entry {
    dtype: String,
    shape: Vec<usize>,
    /// Absolute byte range in the file.
    begin: usize,
    end: usize,
}

/// One mapped safetensors file.
struct File {
    path: Arc<PathBuf>,
    backing: Arc<Backing>,
    entries: HashMap<String, Entry>,
}

impl File {
    fn open(path: &Path) -> Result<File> {
        let backing = Backing::map(path)?;
        let bytes = backing.bytes();
        let len = bytes.len() as u64;
        let trunc = |needed: u64, tensor: Option<String>| LlmError::Truncated {
            path: path.into(),
            tensor,
            needed,
            len,
        };
        if bytes.len() < 8 {
            return Err(trunc(8, None));
        }
        let mut n8 = [0u8; 8];
        n8.copy_from_slice(&bytes[..8]);
        let n = u64::from_le_bytes(n8);
        let data_start = n.checked_add(8).ok_or_else(|| trunc(u64::MAX, None))?;
        if data_start > len {
            return Err(trunc(data_start, None));
        }
        let data_start = data_start as usize;
        let bad = |message: String| LlmError::BadHeader {
            path: path.into(),
            message,
        };
        let header: BTreeMap<String, serde_json::Value> =
            serde_json::from_slice(&bytes[8..data_start])
                .map_err(|e| bad(format!("not a JSON object: {e}")))?;
        #[derive(serde::Deserialize)]
        struct RawEntry {
            dtype: String,
            shape: Vec<usize>,
            data_offsets: [usize; 2],
        }
        let mut entries = HashMap::new();
        for (name, v) in header {
            if name == "__metadata__" {
                continue;
            }
            let e: RawEntry =
                serde_json::from_value(v).map_err(|e| bad(format!("entry `{name}`: {e}")))?;
            let [b, en] = e.data_offsets;
            if b > en {
                return Err(bad(format!(
                    "entry `{name}`: data_offsets [{b}, {en}] reversed"
                )));
            }
            let end = data_start
                .checked_add(en)
                .ok_or_else(|| bad(format!("entry `{name}`: offset overflow")))?;
            if end as u64 > len {
                return Err(trunc(end as u64, Some(name)));
            }
            if let Some(dt) = DType::parse(&e.dtype) {
                let numel = e.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
                if numel.and_then(|n| n.checked_mul(dt.size())) != Some(en - b) {
                    return Err(bad(format!(
                        "entry `{name}`: {} bytes for {} of shape {:?}",
                        en - b,
                        e.dtype,
                        e.shape
                    )));
                }
            }
            entries.insert(
                name,
                Entry {
                    dtype: e.dtype,
                    shape: e.shape,
                    begin: data_start + b,
                    end,
                },
            );
        }
        Ok(File {
            path: Arc::new(path.into()),
            backing: Arc::new(backing),
            entries,
        })
    }

    fn tensor(&self, name: &str) -> Option<Result<Tensor>> {
        let e = self.entries.get(name)?;
        let Some(dtype) = DType::parse(&e.dtype) else {
            return Some(Err(LlmError::UnsupportedDtype {
                path: (*self.path).clone(),
                tensor: name.into(),
                dtype: e.dtype.clone(),
            }));
        };
        let addr = self.backing.bytes().as_ptr() as usize + e.begin;
        let t = if addr.is_multiple_of(dtype.size()) {
            Tensor {
                dtype,
                shape: e.shape.clone(),
                backing: self.backing.clone(),
                offset: e.begin,
                len: e.end - e.begin,
                path: self.path.clone(),
            }
        } else {
            // Misaligned data (a header whose length is not a multiple of the element size):
            // copy it once into an aligned buffer.
            Tensor {
                dtype,
                shape: e.shape.clone(),
                backing: Arc::new(Backing::owned(&self.backing.bytes()[e.begin..e.end])),
                offset: 0,
                len: e.end - e.begin,
                path: self.path.clone(),
            }
        };
        Some(Ok(t))
    }
}

/// The weights of a model directory: every safetensors file, mapped, with their tensor names.
pub struct Checkpoint {
    dir: PathBuf,
    files: Vec<File>,
    /// Tensor name -> index in `files`.
    index: HashMap<String, usize>,
}

impl Checkpoint {
    /// Opens `dir/model.safetensors`, or every shard named by
    /// `dir/model.safetensors.index.json`.
    pub fn open(dir: &Path) -> Result<Checkpoint> {
        let single = dir.join("model.safetensors");
        let index_path = dir.join("model.safetensors.index.json");
        if single.exists() {
            let f = File::open(&single)?;
            let index = f.entries.keys().map(|k| (k.clone(), 0)).collect();
            return Ok(Checkpoint {
                dir: dir.into(),
                files: vec![f],
                index,
            });
        }
        if !index_path.exists() {
            return Err(LlmError::NoWeights { dir: dir.into() });
        }
        let text = std::fs::read_to_string(&index_path).map_err(|source| LlmError::Io {
            path: index_path.clone(),
            source,
        })?;
        #[derive(serde::Deserialize)]
        struct Index {
            weight_map: BTreeMap<String, String>,
        }
        let idx: Index = serde_json::from_str(&text).map_err(|e| LlmError::Config {
            path: index_path.clone(),
            message: e.to_string(),
        })?;
        let mut shard_ids: BTreeMap<String, usize> = BTreeMap::new();
        let mut files = Vec::new();
        let mut index = HashMap::new();
        for (name, shard) in idx.weight_map {
            if shard.contains('/') || shard.contains('\\') || shard.contains("..") {
                return Err(LlmError::Config {
                    path: index_path.clone(),
                    message: format!("shard name `{shard}` for `{name}` is not a plain file name"),
                });
            }
            let id = match shard_ids.get(&shard) {
                Some(&id) => id,
                None => {
                    files.push(File::open(&dir.join(&shard))?);
                    shard_ids.insert(shard.clone(), files.len() - 1);
                    files.len() - 1
                }
            };
            if !files[id].entries.contains_key(&name) {
                return Err(LlmError::MissingTensor {
                    tensor: name,
                    path: dir.join(&shard),
                });
            }
            index.insert(name, id);
        }
        Ok(Checkpoint {
            dir: dir.into(),
            files,
            index,
        })
    }

    /// The tensor `name`, or `None` when the checkpoint has no such tensor.
    ///
    /// # Errors
    /// [`LlmError::UnsupportedDtype`] when it exists with a dtype the kernels cannot read.
    pub fn get(&self, name: &str) -> Result<Option<Tensor>> {
        match self.index.get(name) {
            None => Ok(None),
            Some(&i) => self.files[i].tensor(name).transpose(),
        }
    }

    /// The tensor `name`; [`LlmError::MissingTensor`] when absent.
    pub fn require(&self, name: &str) -> Result<Tensor> {
        self.get(name)?.ok_or_else(|| LlmError::MissingTensor {
            tensor: name.into(),
            path: if self.files.len() == 1 {
                (*self.files[0].path).clone()
            } else {
                self.dir.clone()
            },
        })
    }

    /// Every tensor name in the checkpoint.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.index.keys().map(String::as_str)
    }

    /// The file a tensor lives in (the directory when the tensor is absent).
    pub fn path_of(&self, name: &str) -> PathBuf {
        match self.index.get(name) {
            Some(&i) => (*self.files[i].path).clone(),
            None => self.dir.clone(),
        }
    }
}

/// Writes a safetensors file of `tensors` (name, dtype, shape, little-endian bytes).
///
/// # Errors
/// [`LlmError::InvalidArgument`] when a tensor's byte length does not match its shape;
/// [`LlmError::Io`] when writing fails.
pub fn write(path: &Path, tensors: &[(&str, DType, &[usize], &[u8])]) -> Result<()> {
    let mut header = serde_json::Map::new();
    let mut offset = 0usize;
    for (name, dtype, shape, bytes) in tensors {
        let numel: usize = shape.iter().product();
        if numel * dtype.size() != bytes.len() {
            return Err(LlmError::InvalidArgument {
                message: format!("`{name}`: {} bytes for shape {shape:?}", bytes.len()),
            });
        }
        header.insert(
            (*name).into(),
            serde_json::json!({
                "dtype": dtype.name(),
                "shape": shape,
                "data_offsets": [offset, offset + bytes.len()],
            }),
        );
        offset += bytes.len();
    }
    let mut h = serde_json::Value::Object(header).to_string().into_bytes();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + h.len() + offset);
    out.extend_from_slice(&(h.len() as u64).to_le_bytes());
    out.extend_from_slice(&h);
    for (_, _, _, bytes) in tensors {
        out.extend_from_slice(bytes);
    }
    std::fs::write(path, out).map_err(|source| LlmError::Io {
        path: path.into(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Resident kB of the mapping that starts at `addr`, from `/proc/self/smaps`.
    #[cfg(target_os = "linux")]
    fn mapping_rss_kb(addr: usize) -> usize {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let start = format!("{addr:x}-");
        let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&start));
        assert!(lines.next().is_some(), "no mapping at {start}");
        let rss = lines.find(|l| l.starts_with("Rss:")).unwrap();
        rss.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// Releasing a range of a mapped file drops its resident pages (all but the partial
    /// pages at its ends) and leaves its bytes readable and unchanged.
    #[cfg(target_os = "linux")]
    #[test]
    fn release_drops_a_mappings_pages_and_keeps_its_bytes() {
        let path = std::env::temp_dir().join(format!("llm-release-{}.bin", std::process::id()));
        let file: Vec<u8> = (0..4u32 << 20).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &file).unwrap();
        let b = Backing::map(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let addr = b.bytes().as_ptr() as usize;
        assert_eq!(b.bytes(), &file[..], "mapped bytes");
        let before = mapping_rss_kb(addr);
        assert!(
            before >= 4 << 10,
            "all 4 MiB resident after reading: {before} kB"
        );
        // An unaligned range: its first and last partial pages stay.
        b.release(100, file.len() - 200);
        let after = mapping_rss_kb(addr);
        assert!(after <= 2 * 64, "{after} kB still resident after release");
        assert_eq!(b.bytes(), &file[..], "bytes after release");
    }

    #[test]
    fn half_conversions_round_trip() {
        for x in [0.0f32, 1.0, -2.5, 0.1, 65504.0, 6.1e-5, 3.0e-7, -1.0e-6] {
            let h = f32_to_f16(x);
            let back = f16_to_f32(h);
            assert!((back - x).abs() <= x.abs() * 1e-3 + 6e-8, "{x} -> {back}");
            let b = bf16_to_f32(f32_to_bf16(x));
            assert!((b - x).abs() <= x.abs() * 4e-3, "{x} -> {b}");
        }
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        assert_eq!(bf16_to_f32(0x4049), 3.140625);
    }
}
