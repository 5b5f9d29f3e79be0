//! GGUF files (llama.cpp's checkpoint format, versions 2 and 3, little-endian), memory-mapped:
//! metadata, tensor infos, the `llama` architecture's hyperparameters and its weights.
//!
//! Layout: magic `GGUF`, `u32` version, `u64` tensor count, `u64` metadata count; metadata as
//! `(string key, u32 type, value)`; tensor infos as `(string name, u32 n_dims, u64 dims[n_dims]
//! (innermost first), u32 ggml type, u64 offset)`; then, at the next multiple of
//! `general.alignment` (default 32), the data, each tensor at its offset from there. Strings
//! are a `u64` length and UTF-8 bytes.
//!
//! llama.cpp's converter permutes the rows of `attn_q` and `attn_k` within each head so that
//! RoPE rotates adjacent pairs `(2i, 2i + 1)`; [`load_weights`] undoes that permutation (whole
//! quantized rows move), so the model runs HF's rotate-half RoPE on GGUF and safetensors alike.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::LlamaConfig;
use crate::error::{LlmError, Result};
use crate::matrix::Matrix;
use crate::quant::format::QType;
use crate::quant::QTensor;
use crate::safetensors::{Backing, DType, Tensor};
use crate::weights::{LayerWeights, Weights};

/// The file magic, `GGUF` as bytes.
pub const MAGIC: [u8; 4] = *b"GGUF";

/// Alignment of the data section and of every tensor when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// True when `path` names a GGUF file rather than a checkpoint directory: it is not a
/// directory, and its extension is `gguf` or its first four bytes are the magic.
pub fn is_gguf_path(path: &Path) -> bool {
    if path.is_dir() {
        return false;
    }
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    {
        return true;
    }
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
        .is_ok_and(|()| magic == MAGIC)
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `u8`.
    U8(u8),
    /// `i8`.
    I8(i8),
    /// `u16`.
    U16(u16),
    /// `i16`.
    I16(i16),
    /// `u32`.
    U32(u32),
    /// `i32`.
    I32(i32),
    /// `f32`.
    F32(f32),
    /// `bool`.
    Bool(bool),
    /// UTF-8 string.
    String(String),
    /// Array of values of one type.
    Array(Vec<Value>),
    /// `u64`.
    U64(u64),
    /// `i64`.
    I64(i64),
    /// `f64`.
    F64(f64),
}

impl Value {
    /// The value as an unsigned integer, when it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float, when it is a float or an integer.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v as f64),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    /// The string, when the value is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The boolean, when the value is one.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The elements, when the value is an array.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// The ggml tensor types, by id: the name of each (for messages), and the ones this crate runs.
pub fn ggml_type_name(id: u32) -> &'static str {
    const NAMES: [&str; 40] = [
        "F32",
        "F16",
        "Q4_0",
        "Q4_1",
        "Q4_2",
        "Q4_3",
        "Q5_0",
        "Q5_1",
        "Q8_0",
        "Q8_1",
        "Q2_K",
        "Q3_K",
        "Q4_K",
        "Q5_K",
        "Q6_K",
        "Q8_K",
        "IQ2_XXS",
        "IQ2_XS",
        "IQ3_XXS",
        "IQ1_S",
        "IQ4_NL",
        "IQ3_S",
        "IQ2_S",
        "IQ4_XS",
        "I8",
        "I16",
        "I32",
        "I64",
        "F64",
        "IQ1_M",
        "BF16",
        "Q4_0_4_4",
        "Q4_0_4_8",
        "Q4_0_8_8",
        "TQ1_0",
        "TQ2_0",
        "IQ4_NL_4_4",
        "IQ4_NL_4_8",
        "IQ4_NL_8_8",
        "MXFP4",
    ];
    NAMES.get(id as usize).copied().unwrap_or("unknown")
}

/// A tensor type this crate runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorType {
    /// Dense elements.
    Dense(DType),
    /// Blocks of 32.
    Quant(QType),
}

impl TensorType {
    /// The type of ggml id `id`, if supported.
    pub fn from_ggml(id: u32) -> Option<TensorType> {
        Some(match id {
            0 => TensorType::Dense(DType::F32),
            1 => TensorType::Dense(DType::F16),
            30 => TensorType::Dense(DType::BF16),
            2 => TensorType::Quant(QType::Q4_0),
            3 => TensorType::Quant(QType::Q4_1),
            6 => TensorType::Quant(QType::Q5_0),
            7 => TensorType::Quant(QType::Q5_1),
            8 => TensorType::Quant(QType::Q8_0),
            12 => TensorType::Quant(QType::Q4_K),
            13 => TensorType::Quant(QType::Q5_K),
            14 => TensorType::Quant(QType::Q6_K),
            _ => return None,
        })
    }

    /// The ggml id.
    pub fn ggml_id(self) -> u32 {
        match self {
            TensorType::Dense(DType::F32) => 0,
            TensorType::Dense(DType::F16) => 1,
            TensorType::Dense(DType::BF16) => 30,
            TensorType::Quant(QType::Q4_0) => 2,
            TensorType::Quant(QType::Q4_1) => 3,
            TensorType::Quant(QType::Q5_0) => 6,
            TensorType::Quant(QType::Q5_1) => 7,
            TensorType::Quant(QType::Q8_0) => 8,
            TensorType::Quant(QType::Q4_K) => 12,
            TensorType::Quant(QType::Q5_K) => 13,
            TensorType::Quant(QType::Q6_K) => 14,
        }
    }

    /// Bytes of `n` elements in one row (`None` when `n` does not fill whole blocks or the
    /// size overflows).
    pub fn row_bytes(self, n: u64) -> Option<u64> {
        match self {
            TensorType::Dense(d) => n.checked_mul(d.size() as u64),
            TensorType::Quant(q) => {
                let len = q.block_len() as u64;
                let blocks = n.is_multiple_of(len).then_some(n / len)?;
                blocks.checked_mul(q.block_bytes() as u64)
            }
        }
    }
}

/// One tensor's entry in the header.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    /// The name (`blk.0.attn_q.weight`, ...).
    pub name: String,
    /// Dimensions as GGUF stores them: innermost (contiguous) first.
    pub dims: Vec<u64>,
    /// The ggml type id.
    pub ggml_type: u32,
    /// Offset of the data from the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    /// The shape outermost first (row-major, as HF and safetensors write it): a matrix
    /// `[rows, cols]` is GGUF's `[cols, rows]`.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// A memory-mapped GGUF file: its metadata and tensor infos, checked against the file length.
pub struct GgufFile {
    path: Arc<PathBuf>,
    backing: Arc<Backing>,
    version: u32,
    metadata: BTreeMap<String, Value>,
    tensors: Vec<TensorInfo>,
    data_start: u64,
}

/// Metadata nesting (arrays of arrays) allowed before a file is called malformed.
const MAX_DEPTH: usize = 4;

/// Metadata values (array elements included) a file may hold: a [`Value`] takes 32 bytes
/// however few the file spends on it (a `u8` takes one), so the count, not the file size,
/// bounds the memory parsing takes (here 128 MiB). The largest vocabularies (Gemma 3's
/// 262,144 tokens, their scores and types) take well under a fifth of it.
pub const MAX_METADATA_VALUES: u64 = 1 << 22;

/// Elements reserved up front for an array or the tensor infos: more are added as they
/// are read, so memory follows what the file holds, not what its counts claim.
const MAX_RESERVE: usize = 4096;

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
    path: &'a Path,
    /// Metadata values still allowed ([`MAX_METADATA_VALUES`] at the start).
    values_left: u64,
}

impl<'a> Reader<'a> {
    fn err(&self, message: String) -> LlmError {
        LlmError::Gguf {
            path: self.path.into(),
            tensor: None,
            message,
        }
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8]> {
        let end = (self.pos as u64).checked_add(n);
        match end {
            Some(e) if e <= self.b.len() as u64 => {
                let s = &self.b[self.pos..e as usize];
                self.pos = e as usize;
                Ok(s)
            }
            _ => Err(self.err(format!(
                "truncated: {what} needs {n} bytes at offset {} but the file has {} bytes",
                self.pos,
                self.b.len()
            ))),
        }
    }

    fn arr<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        self.arr(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        self.arr(what).map(u64::from_le_bytes)
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.u64(what)?;
        let s = self.take(n, what)?;
        String::from_utf8(s.to_vec()).map_err(|_| self.err(format!("{what} is not UTF-8")))
    }

    /// Smallest encoded size of a value of type `t` (to refuse impossible array counts before
    /// allocating for them).
    fn min_size(t: u32) -> u64 {
        match t {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            _ => 8,
        }
    }

    fn value(&mut self, t: u32, key: &str, depth: usize) -> Result<Value> {
        self.values_left = self.values_left.checked_sub(1).ok_or_else(|| {
            self.err(format!(
                "metadata `{key}`: the metadata holds more than {MAX_METADATA_VALUES} values, \
                 more than any model uses (the file is corrupt or not a model)"
            ))
        })?;
        Ok(match t {
            0 => Value::U8(self.arr::<1>(key)?[0]),
            1 => Value::I8(self.arr::<1>(key)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.arr(key)?)),
            3 => Value::I16(i16::from_le_bytes(self.arr(key)?)),
            4 => Value::U32(u32::from_le_bytes(self.arr(key)?)),
            5 => Value::I32(i32::from_le_bytes(self.arr(key)?)),
            6 => Value::F32(f32::from_le_bytes(self.arr(key)?)),
            7 => match self.arr::<1>(key)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.err(format!("metadata `{key}`: bool byte {b}"))),
            },
            8 => Value::String(self.string(key)?),
            9 => {
                if depth >= MAX_DEPTH {
                    return Err(self.err(format!("metadata `{key}`: arrays nested too deep")));
                }
                let et = self.u32(key)?;
                let n = self.u64(key)?;
                let left = (self.b.len() - self.pos) as u64;
                if et > 12 {
                    return Err(
                        self.err(format!("metadata `{key}`: unknown array element type {et}"))
                    );
                }
                if n.checked_mul(Self::min_size(et))
                    .is_none_or(|need| need > left)
                {
                    return Err(self.err(format!(
                        "truncated: metadata `{key}` claims {n} elements but only {left} bytes \
                         are left"
                    )));
                }
                if n > self.values_left {
                    return Err(self.err(format!(
                        "metadata `{key}` claims {n} elements: the metadata may hold at most \
                         {MAX_METADATA_VALUES} values, more than any model uses (the file is \
                         corrupt or not a model)"
                    )));
                }
                let mut v = Vec::with_capacity((n as usize).min(MAX_RESERVE));
                for _ in 0..n {
                    v.push(self.value(et, key, depth + 1)?);
                }
                Value::Array(v)
            }
            10 => Value::U64(u64::from_le_bytes(self.arr(key)?)),
            11 => Value::I64(i64::from_le_bytes(self.arr(key)?)),
            12 => Value::F64(f64::from_le_bytes(self.arr(key)?)),
            t => return Err(self.err(format!("metadata `{key}`: unknown value type {t}"))),
        })
    }
}

impl GgufFile {
    /// Maps and parses `path`; checks every tensor's data lies within the file.
    pub fn open(path: &Path) -> Result<GgufFile> {
        Self::parse(path, Arc::new(Backing::map(path)?))
    }

    /// Parses a GGUF image held in memory (`path` names it in messages).
    pub fn from_bytes(path: &Path, bytes: &[u8]) -> Result<GgufFile> {
        Self::parse(path, Arc::new(Backing::owned(bytes)))
    }

    fn parse(path: &Path, backing: Arc<Backing>) -> Result<GgufFile> {
        let b = backing.bytes();
        let mut r = Reader {
            b,
            pos: 0,
            path,
            values_left: MAX_METADATA_VALUES,
        };
        let magic = r.arr::<4>("the magic")?;
        if magic != MAGIC {
            return Err(r.err(format!(
                "not a GGUF file: magic {magic:02x?}, want `GGUF` (47 47 55 46)"
            )));
        }
        let version = r.u32("the version")?;
        if version != 2 && version != 3 {
            return Err(r.err(format!(
                "version {version} is not supported (only 2 and 3, little-endian; version 1 is \
                 obsolete: convert the model again with a current llama.cpp)"
            )));
        }
        let n_tensors = r.u64("the tensor count")?;
        let n_kv = r.u64("the metadata count")?;
        let left = b.len() as u64;
        // Each entry takes at least 8 (key/name length) + 4 bytes.
        if n_kv.saturating_add(n_tensors).saturating_mul(12) > left {
            return Err(r.err(format!(
                "truncated: {n_kv} metadata entries and {n_tensors} tensors cannot fit in {left} \
                 bytes"
            )));
        }
        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = r.string("a metadata key")?;
            let t = r.u32(&key)?;
            let v = r.value(t, &key, 0)?;
            metadata.insert(key, v);
        }
        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_u64() {
                Some(a) if a.is_power_of_two() => a,
                _ => return Err(r.err(format!("general.alignment {v:?} is not a power of two"))),
            },
        };
        let mut tensors = Vec::with_capacity((n_tensors as usize).min(MAX_RESERVE));
        for _ in 0..n_tensors {
            let name = r.string("a tensor name")?;
            let n_dims = r.u32(&name)?;
            if n_dims == 0 || n_dims > 4 {
                return Err(LlmError::Gguf {
                    path: path.into(),
                    tensor: Some(name),
                    message: format!("{n_dims} dimensions (ggml has 1 to 4)"),
                });
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(r.u64(&name)?);
            }
            let ggml_type = r.u32(&name)?;
            let offset = r.u64(&name)?;
            tensors.push(TensorInfo {
                name,
                dims,
                ggml_type,
                offset,
            });
        }
        let data_start = (r.pos as u64).next_multiple_of(alignment);
        let file = GgufFile {
            path: Arc::new(path.into()),
            backing: backing.clone(),
            version,
            metadata,
            tensors,
            data_start,
        };
        for t in &file.tensors {
            file.check_info(t, alignment)?;
        }
        Ok(file)
    }

    pub(crate) fn tensor_err(&self, name: &str, message: String) -> LlmError {
        LlmError::Gguf {
            path: (*self.path).clone(),
            tensor: Some(name.into()),
            message,
        }
    }

    /// An error about the file's metadata rather than one tensor.
    pub(crate) fn meta_err(&self, message: String) -> LlmError {
        LlmError::Gguf {
            path: (*self.path).clone(),
            tensor: None,
            message,
        }
    }

    /// Refuses a block count (metadata `key`) that disagrees with the tensors, before anything
    /// is sized by it: one the file's tensors cannot fill (`per_block` tensors a block), or one
    /// below a layer the file has.
    pub(crate) fn check_block_count(
        &self,
        key: &str,
        blocks: usize,
        per_block: usize,
    ) -> Result<()> {
        let extra = format!("blk.{blocks}.");
        if let Some(t) = self.tensors.iter().find(|t| t.name.starts_with(&extra)) {
            return Err(self.tensor_err(
                &t.name,
                format!("{key} is {blocks} but the file has this tensor of a later layer"),
            ));
        }
        let held = self.tensors.len() / per_block;
        if blocks > held {
            return Err(self.meta_err(format!(
                "{key} is {blocks} but the file has {} tensors, room for at most {held} blocks \
                 of {per_block}: the metadata is corrupt",
                self.tensors.len()
            )));
        }
        Ok(())
    }

    /// The byte range of `t`'s data, checked: a supported type, whole blocks, aligned, within
    /// the file.
    fn check_info(&self, t: &TensorInfo, alignment: u64) -> Result<(usize, usize)> {
        let ty = TensorType::from_ggml(t.ggml_type).ok_or_else(|| {
            self.tensor_err(
                &t.name,
                format!(
                    "type {} (ggml id {}) is not supported; supported: F32, F16, BF16, Q4_0, \
                     Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K (re-quantize the model to one of \
                     them, e.g. with llama.cpp's llama-quantize)",
                    ggml_type_name(t.ggml_type),
                    t.ggml_type
                ),
            )
        })?;
        let row_bytes = ty.row_bytes(t.dims[0]).ok_or_else(|| {
            let message = match ty {
                TensorType::Quant(q) if !t.dims[0].is_multiple_of(q.block_len() as u64) => {
                    format!(
                        "{} rows of {} elements do not fill whole blocks of {} (the file is \
                         corrupt)",
                        q.name(),
                        t.dims[0],
                        q.block_len()
                    )
                }
                _ => format!(
                    "a row of {} {} elements overflows 2^64 bytes: its dimensions {:?} are \
                     corrupt",
                    t.dims[0],
                    ggml_type_name(t.ggml_type),
                    t.dims
                ),
            };
            self.tensor_err(&t.name, message)
        })?;
        let bytes = t.dims[1..]
            .iter()
            .try_fold(row_bytes, |a, &d| a.checked_mul(d))
            .ok_or_else(|| self.tensor_err(&t.name, format!("dimensions {:?} overflow", t.dims)))?;
        if !t.offset.is_multiple_of(alignment) {
            return Err(self.tensor_err(
                &t.name,
                format!(
                    "offset {} is not a multiple of the alignment {alignment}",
                    t.offset
                ),
            ));
        }
        let len = self.backing.bytes().len() as u64;
        let begin = self.data_start.checked_add(t.offset);
        let end = begin.and_then(|b| b.checked_add(bytes));
        match (begin, end) {
            (Some(b), Some(e)) if e <= len => Ok((b as usize, e as usize)),
            _ => Err(self.tensor_err(
                &t.name,
                format!(
                    "truncated: its data needs bytes up to {} but the file has {len}",
                    end.map_or_else(|| "beyond 2^64".into(), |e| e.to_string())
                ),
            )),
        }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Every metadata entry.
    pub fn metadata(&self) -> &BTreeMap<String, Value> {
        &self.metadata
    }

    /// One metadata entry.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    /// The tensor infos, in file order.
    pub fn tensor_infos(&self) -> &[TensorInfo] {
        &self.tensors
    }

    fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    fn alignment(&self) -> u64 {
        self.get("general.alignment")
            .and_then(Value::as_u64)
            .unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// Tensor `name` as a matrix or vector (`None` when absent). Quantized tensors must be
    /// 2-dimensional.
    pub fn matrix(&self, name: &str) -> Result<Option<Matrix>> {
        let Some(t) = self.info(name) else {
            return Ok(None);
        };
        let (begin, end) = self.check_info(t, self.alignment())?;
        let shape = t.shape();
        Ok(Some(match TensorType::from_ggml(t.ggml_type) {
            Some(TensorType::Dense(d)) => Matrix::Dense(Tensor::from_shared(
                d,
                &shape,
                &self.backing,
                begin,
                end - begin,
                &self.path,
            )),
            Some(TensorType::Quant(q)) => {
                if shape.len() != 2 {
                    return Err(self.tensor_err(
                        name,
                        format!("a quantized tensor of shape {shape:?}: only matrices are run"),
                    ));
                }
                Matrix::Quant(QTensor::from_shared(
                    q,
                    shape[0],
                    shape[1],
                    &self.backing,
                    begin,
                    &self.path,
                ))
            }
            // `check_info` refused unsupported types.
            None => return Err(self.tensor_err(name, "unsupported type".into())),
        }))
    }

    /// A required string metadata value.
    pub(crate) fn meta_str(&self, key: &str) -> Result<&str> {
        self.get(key)
            .and_then(Value::as_str)
            .ok_or_else(|| self.meta_err(format!("metadata `{key}` is missing or not a string")))
    }

    pub(crate) fn meta_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(|x| Some(x as usize)).ok_or_else(|| {
                self.meta_err(format!(
                    "metadata `{key}` is {v:?}, not a non-negative integer"
                ))
            }),
        }
    }

    pub(crate) fn meta_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.meta_err(format!("metadata `{key}` is {v:?}, not a number"))),
        }
    }

    /// Metadata `{arch}.{key}`, which must be there and not 0.
    pub(crate) fn meta_required(&self, arch: &str, key: &str) -> Result<usize> {
        match self.meta_usize(&format!("{arch}.{key}"))? {
            Some(v) if v > 0 => Ok(v),
            Some(_) => Err(self.meta_err(format!("metadata `{arch}.{key}` is 0"))),
            None => Err(self.meta_err(format!("metadata `{arch}.{key}` is missing"))),
        }
    }

    /// The model width and attention heads from the `{arch}.*` keys every Llama-like
    /// architecture shares, checked: query heads a multiple of the KV heads, and an even,
    /// non-zero head dimension (`attention.key_length`, else the width over the heads).
    pub(crate) fn head_shape(&self, arch: &str) -> Result<HeadShape> {
        let hidden = self.meta_required(arch, "embedding_length")?;
        let heads = self.meta_required(arch, "attention.head_count")?;
        let kv_heads = self
            .meta_usize(&format!("{arch}.attention.head_count_kv"))?
            .unwrap_or(heads);
        if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(self.meta_err(format!(
                "{arch}.attention.head_count ({heads}) is not a multiple of \
                 {arch}.attention.head_count_kv ({kv_heads})"
            )));
        }
        let head_dim = match self.meta_usize(&format!("{arch}.attention.key_length"))? {
            Some(d) => d,
            None if hidden.is_multiple_of(heads) => hidden / heads,
            None => {
                return Err(self.meta_err(format!(
                    "{arch}.embedding_length ({hidden}) is not a multiple of the head count \
                     ({heads}) and no {arch}.attention.key_length is given"
                )))
            }
        };
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(self.meta_err(format!(
                "head dimension {head_dim} must be even and non-zero"
            )));
        }
        Ok(HeadShape {
            hidden,
            heads,
            kv_heads,
            head_dim,
        })
    }

    /// The architecture's hyperparameters from the `llama.*` keys (only `general.architecture
    /// = llama` is supported).
    pub fn llama_config(&self) -> Result<LlamaConfig> {
        let arch = self.meta_str("general.architecture")?;
        if arch != "llama" {
            return Err(self.meta_err(format!(
                "architecture `{arch}` is not supported (llama and gemma3 are)"
            )));
        }
        let need = |k: &str| self.meta_required("llama", k);
        let HeadShape {
            hidden,
            heads,
            kv_heads,
            head_dim,
        } = self.head_shape("llama")?;
        if let Some(rot) = self.meta_usize("llama.rope.dimension_count")? {
            if rot != head_dim {
                return Err(self.meta_err(format!(
                    "llama.rope.dimension_count {rot} differs from the head dimension \
                     {head_dim}: partial rotary embeddings are not supported"
                )));
            }
        }
        if self.info("rope_freqs.weight").is_some() {
            return Err(self.meta_err(
                "the file has `rope_freqs.weight` (Llama 3 frequency scaling), which the GGUF \
                 loader does not apply yet: use the safetensors checkpoint"
                    .into(),
            ));
        }
        let vocab = match self.meta_usize("llama.vocab_size")? {
            Some(v) => v,
            None => self
                .get("tokenizer.ggml.tokens")
                .and_then(Value::as_array)
                .map(<[Value]>::len)
                .or_else(|| self.info("token_embd.weight").map(|t| t.shape()[0]))
                .ok_or_else(|| self.meta_err("no llama.vocab_size and no token list".into()))?,
        };
        let rope_theta = self.meta_f64("llama.rope.freq_base")?.unwrap_or(10000.0);
        if !(rope_theta.is_finite() && rope_theta > 0.0) {
            return Err(self.meta_err(format!("llama.rope.freq_base {rope_theta} is not positive")));
        }
        let eps = self
            .meta_f64("llama.attention.layer_norm_rms_epsilon")?
            .unwrap_or(1e-5);
        if !(eps.is_finite() && eps >= 0.0) {
            return Err(self.meta_err(format!("rms epsilon {eps} is not a non-negative number")));
        }
        let id = |k: &str| -> Result<Option<u32>> {
            Ok(self
                .meta_usize(&format!("tokenizer.ggml.{k}"))?
                .map(|v| v as u32))
        };
        let config = LlamaConfig {
            model_type: "llama".into(),
            arch: crate::arch::Architecture::Llama,
            hidden_size: hidden,
            intermediate_size: need("feed_forward_length")?,
            num_layers: need("block_count")?,
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim,
            vocab_size: vocab,
            rms_norm_eps: eps as f32,
            rope_theta,
            rope_scaling: None,
            max_position_embeddings: self
                .meta_usize("llama.context_length")?
                .unwrap_or(2048)
                .max(1),
            tie_word_embeddings: self.info("output.weight").is_none(),
            qkv_bias: false,
            o_bias: false,
            bos_token_id: id("bos_token_id")?,
            eos_token_ids: id("eos_token_id")?.into_iter().collect(),
        };
        config
            .check_sizes()
            .map_err(|m| self.meta_err(format!("the llama.* metadata: {m}")))?;
        Ok(config)
    }
}

/// What an architecture module reads from a file: the architecture's name, and tensors of
/// the shapes its metadata implies.
impl GgufFile {
    /// `general.architecture`, when it is a string.
    pub fn architecture(&self) -> Option<&str> {
        self.get("general.architecture").and_then(Value::as_str)
    }

    /// The bytes of tensor `name` as the file stores them (checked to lie within the file),
    /// when the file has it: for readers independent of this crate's decoders.
    pub fn tensor_bytes(&self, name: &str) -> Result<Option<&[u8]>> {
        let Some(t) = self.info(name) else {
            return Ok(None);
        };
        let (begin, end) = self.check_info(t, self.alignment())?;
        Ok(Some(&self.backing.bytes()[begin..end]))
    }

    /// The shape (outermost first) of tensor `name`, when the file has it.
    pub fn tensor_shape(&self, name: &str) -> Option<Vec<usize>> {
        self.info(name).map(TensorInfo::shape)
    }

    /// Tensor `name`, which must exist with shape `shape` (rows, columns).
    pub fn require_matrix(&self, name: &str, shape: &[usize]) -> Result<Matrix> {
        let m = self.matrix(name)?.ok_or_else(|| LlmError::MissingTensor {
            tensor: name.into(),
            path: self.path().into(),
        })?;
        if m.shape() != shape {
            return Err(self.tensor_err(
                name,
                format!(
                    "shape {:?} (rows, columns) contradicts the metadata, which implies {shape:?}",
                    m.shape()
                ),
            ));
        }
        Ok(m)
    }

    /// Vector `name` of `len` dense elements, widened to f32.
    pub fn require_vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        match self.require_matrix(name, &[len])? {
            Matrix::Dense(t) => Ok(t.to_f32()),
            Matrix::Quant(_) => Err(self.tensor_err(name, "a quantized vector".into())),
        }
    }
}

/// The row order that undoes llama.cpp's Q/K permutation for `heads` heads of `head_dim`:
/// GGUF row `h * head_dim + 2i + j` is HF row `h * head_dim + j * head_dim / 2 + i`, so HF row
/// `h * head_dim + j * half + i` is read from GGUF row `h * head_dim + 2i + j`.
pub fn unpermute_order(heads: usize, head_dim: usize) -> Vec<usize> {
    let half = head_dim / 2;
    let mut order = Vec::with_capacity(heads * head_dim);
    for h in 0..heads {
        for j in 0..2 {
            for i in 0..half {
                order.push(h * head_dim + 2 * i + j);
            }
        }
    }
    order
}

/// `m` with its rows reordered by `order` (see [`unpermute_order`]).
fn permute_rows(m: &Matrix, order: &[usize]) -> Result<Matrix> {
    Ok(match m {
        Matrix::Quant(q) => Matrix::Quant(q.permute_rows(order)?),
        Matrix::Dense(t) => {
            let shape = t.shape();
            let es = t.dtype().size();
            let rb = shape.get(1).copied().unwrap_or(0) * es;
            let src = t.bytes();
            let mut out = Vec::with_capacity(src.len());
            for &r in order {
                out.extend_from_slice(&src[r * rb..(r + 1) * rb]);
            }
            Matrix::Dense(Tensor::from_bytes(t.dtype(), shape, &out)?)
        }
    })
}

/// Tensors of one llama block: two norms, four attention and three MLP matrices.
const TENSORS_PER_BLOCK: usize = 9;

/// Loads the weights of a llama-architecture GGUF file: hyperparameters from its metadata,
/// tensors under llama.cpp's names, shapes checked against the metadata, Q/K rows restored to
/// HF's order, and the embedding reused as the head when there is no `output.weight`.
pub fn load_weights(path: &Path) -> Result<Weights> {
    let f = GgufFile::open(path)?;
    weights_from(&f)
}

/// [`load_weights`] on a parsed file.
pub fn weights_from(f: &GgufFile) -> Result<Weights> {
    if f.architecture() == Some("gemma3") {
        return crate::arch::gemma3::weights_from_gguf(f);
    }
    let c = f.llama_config()?;
    let (h, hd) = (c.hidden_size, c.head_dim);
    let (qd, kvd, ffn) = (c.num_heads * hd, c.num_kv_heads * hd, c.intermediate_size);
    let get = |name: &str, shape: &[usize]| -> Result<Matrix> {
        let m = f.matrix(name)?.ok_or_else(|| LlmError::MissingTensor {
            tensor: name.into(),
            path: f.path().into(),
        })?;
        if m.shape() != shape {
            return Err(f.tensor_err(
                name,
                format!(
                    "shape {:?} (rows, columns) contradicts the metadata, which implies {shape:?}",
                    m.shape()
                ),
            ));
        }
        Ok(m)
    };
    let vec = |name: &str, n: usize| -> Result<Vec<f32>> {
        match get(name, &[n])? {
            Matrix::Dense(t) => Ok(t.to_f32()),
            Matrix::Quant(_) => Err(f.tensor_err(name, "a quantized vector".into())),
        }
    };
    // Nine tensors a block.
    f.check_block_count("llama.block_count", c.num_layers, TENSORS_PER_BLOCK)?;
    let embed = get("token_embd.weight", &[c.vocab_size, h])?;
    let mut layers = Vec::with_capacity(c.num_layers);
    // The row orders are built once the first q and k matrices have the shapes they
    // imply, so their sizes are ones the file holds.
    let (mut q_order, mut k_order) = (Vec::new(), Vec::new());
    for i in 0..c.num_layers {
        let n = |s: &str| format!("blk.{i}.{s}");
        let q = get(&n("attn_q.weight"), &[qd, h])?;
        let k = get(&n("attn_k.weight"), &[kvd, h])?;
        if i == 0 {
            q_order = unpermute_order(c.num_heads, hd);
            k_order = unpermute_order(c.num_kv_heads, hd);
        }
        layers.push(LayerWeights {
            input_norm: vec(&n("attn_norm.weight"), h)?,
            q: permute_rows(&q, &q_order)?,
            k: permute_rows(&k, &k_order)?,
            v: get(&n("attn_v.weight"), &[kvd, h])?,
            o: get(&n("attn_output.weight"), &[h, qd])?,
            q_bias: None,
            k_bias: None,
            v_bias: None,
            o_bias: None,
            post_norm: vec(&n("ffn_norm.weight"), h)?,
            gate: get(&n("ffn_gate.weight"), &[ffn, h])?,
            up: get(&n("ffn_up.weight"), &[ffn, h])?,
            down: get(&n("ffn_down.weight"), &[h, ffn])?,
            q_norm: None,
            k_norm: None,
            attn_out_norm: None,
            mlp_out_norm: None,
        });
    }
    let norm = vec("output_norm.weight", h)?;
    let head = if c.tie_word_embeddings {
        embed.clone()
    } else {
        get("output.weight", &[c.vocab_size, h])?
    };
    Ok(Weights {
        config: c,
        embed,
        layers,
        norm,
        head,
    })
}

/// The model width and attention heads an architecture's metadata gives
/// ([`GgufFile::head_shape`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct HeadShape {
    pub(crate) hidden: usize,
    pub(crate) heads: usize,
    pub(crate) kv_heads: usize,
    pub(crate) head_dim: usize,
}
