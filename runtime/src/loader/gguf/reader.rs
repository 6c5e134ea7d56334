//! A GGUF reader over a byte slice (normally a memory map): header, metadata key/values, tensor
//! infos and the aligned data section.
//!
//! Design: follows the GGUF specification (ggml's docs/gguf.md), versions 2 and 3, little-endian.
//! Every read is bounds-checked against the slice and every length is checked against the bytes
//! left before anything is allocated, so a truncated or garbage file gives a [`LoadError`] naming
//! the file and never a panic or a huge allocation. The crates on crates.io that read GGUF either
//! lack the dequantizers we need, or hide the offsets we need for bounds-checked borrowing, so this
//! small reader is ours; its output is checked against the `gguf` Python package (the reference
//! writer) by the fixtures in `../fixtures`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::types::GgmlType;
use crate::loader::error::LoadError;

/// `general.alignment` when the file does not set it.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's `GGML_MAX_DIMS`.
const MAX_DIMS: u32 = 4;

/// One metadata value, as typed in the file.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    /// `GGUF_METADATA_VALUE_TYPE_UINT8`.
    U8(u8),
    /// `INT8`.
    I8(i8),
    /// `UINT16`.
    U16(u16),
    /// `INT16`.
    I16(i16),
    /// `UINT32`.
    U32(u32),
    /// `INT32`.
    I32(i32),
    /// `UINT64`.
    U64(u64),
    /// `INT64`.
    I64(i64),
    /// `FLOAT32`.
    F32(f32),
    /// `FLOAT64`.
    F64(f64),
    /// `BOOL` (one byte, 0 or 1).
    Bool(bool),
    /// `STRING` (UTF-8, length-prefixed in the file).
    String(String),
    /// `ARRAY`: values of one element type.
    Array(Vec<MetaValue>),
}

impl MetaValue {
    /// The value as an unsigned integer, if it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a signed integer, if it is an integer that fits.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::I8(v) => Some(v.into()),
            MetaValue::I16(v) => Some(v.into()),
            MetaValue::I32(v) => Some(v.into()),
            MetaValue::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// The value as a float (floats of either width, or integers).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v.into()),
            MetaValue::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    /// The value if it is a `Bool`.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// The value if it is a `String`.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The elements if the value is an `Array`.
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(v) => Some(v),
            _ => None,
        }
    }
}

/// A tensor's entry in the GGUF header.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// Tensor name as stored, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// ggml's `ne`: innermost (contiguous) dimension first.
    pub ne: Vec<u64>,
    /// Element type (possibly a quantized block type).
    pub ggml_type: GgmlType,
    /// Offset of the data from the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    /// Row-major shape, outermost first (PyTorch order): `ne` reversed.
    pub fn shape(&self) -> Vec<usize> {
        self.ne.iter().rev().map(|&d| d as usize).collect()
    }

    /// Number of elements (product of `ne`).
    pub fn numel(&self) -> u64 {
        self.ne.iter().product()
    }
}

/// A parsed GGUF file borrowing its bytes.
#[derive(Debug)]
pub struct Gguf<'a> {
    /// The file, for error messages.
    pub path: PathBuf,
    /// GGUF format version (2 or 3).
    pub version: u32,
    /// Every metadata key-value pair, by key.
    pub metadata: BTreeMap<String, MetaValue>,
    /// Tensor entries in file order.
    pub tensors: Vec<TensorInfo>,
    /// `general.alignment` (or [`DEFAULT_ALIGNMENT`]): tensor data offsets are multiples of it.
    pub alignment: u64,
    /// Absolute offset of the data section.
    pub data_offset: u64,
    bytes: &'a [u8],
}

impl<'a> Gguf<'a> {
    /// Parses the header of `bytes` (the whole file); `path` is only used in errors.
    pub fn parse(bytes: &'a [u8], path: &Path) -> Result<Self, LoadError> {
        let mut c = Cursor {
            bytes,
            pos: 0,
            path,
        };
        let magic = c.take(4, "magic")?;
        if magic != b"GGUF" {
            return Err(LoadError::metadata(
                path,
                format!("not a GGUF file (magic {magic:02x?}, expected \"GGUF\")"),
            ));
        }
        let version = c.u32("version")?;
        if version.swap_bytes() == 2 || version.swap_bytes() == 3 {
            return Err(LoadError::metadata(
                path,
                "big-endian GGUF files are not supported",
            ));
        }
        if version != 2 && version != 3 {
            return Err(LoadError::metadata(
                path,
                format!("GGUF version {version} is not supported (only 2 and 3)"),
            ));
        }
        let tensor_count = c.u64("tensor count")?;
        let kv_count = c.u64("metadata count")?;
        // Each key/value needs at least 8 (key length) + 4 (type) + 1 bytes; each tensor info at
        // least 8 + 4 + 4 + 8 bytes: reject counts the file cannot hold before allocating.
        c.check_count(kv_count, 13, "metadata count")?;
        c.check_count(tensor_count, 24, "tensor count")?;

        let mut metadata = BTreeMap::new();
        for _ in 0..kv_count {
            let key = c.string("metadata key")?;
            let ty = c.u32("metadata type")?;
            let value = c.value(ty, &key, 0)?;
            metadata.insert(key, value);
        }

        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() => a,
                _ => {
                    return Err(LoadError::metadata(
                        path,
                        format!("general.alignment {v:?} is not a power of two"),
                    ));
                }
            },
        };

        let mut tensors = Vec::with_capacity(tensor_count as usize);
        for _ in 0..tensor_count {
            tensors.push(c.tensor_info()?);
        }
        let data_offset = c.pos.div_ceil(alignment) * alignment;
        let gguf = Gguf {
            path: path.to_path_buf(),
            version,
            metadata,
            tensors,
            alignment,
            data_offset,
            bytes,
        };
        for t in &gguf.tensors {
            if !t.offset.is_multiple_of(alignment) {
                return Err(LoadError::metadata(
                    path,
                    format!(
                        "tensor {} offset {} is not aligned to {alignment}",
                        t.name, t.offset
                    ),
                ));
            }
            gguf.tensor_bytes(t)?;
        }
        Ok(gguf)
    }

    /// Metadata value `key`, if present.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    /// The tensor named `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The raw bytes of tensor `t`, bounds-checked against the file.
    pub fn tensor_bytes(&self, t: &TensorInfo) -> Result<&'a [u8], LoadError> {
        let size = t.ggml_type.byte_size(&t.ne).ok_or_else(|| {
            LoadError::metadata(
                &self.path,
                format!(
                    "tensor {}: shape {:?} does not fit {} blocks of {}",
                    t.name,
                    t.shape(),
                    t.ggml_type.name(),
                    t.ggml_type.block_elems()
                ),
            )
        })?;
        let start = self.data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(size));
        match (start, end) {
            (Some(s), Some(e)) if e <= self.bytes.len() as u64 => {
                Ok(&self.bytes[s as usize..e as usize])
            }
            _ => Err(LoadError::Truncated {
                path: self.path.clone(),
                what: format!("tensor {}", t.name),
                needed: end.unwrap_or(u64::MAX),
                len: self.bytes.len() as u64,
            }),
        }
    }
}

/// Bounds-checked little-endian reads over the header.
struct Cursor<'a, 'p> {
    bytes: &'a [u8],
    pos: u64,
    path: &'p Path,
}

/// GGUF value type ids.
const T_U8: u32 = 0;
const T_I8: u32 = 1;
const T_U16: u32 = 2;
const T_I16: u32 = 3;
const T_U32: u32 = 4;
const T_I32: u32 = 5;
const T_F32: u32 = 6;
const T_BOOL: u32 = 7;
const T_STRING: u32 = 8;
const T_ARRAY: u32 = 9;
const T_U64: u32 = 10;
const T_I64: u32 = 11;
const T_F64: u32 = 12;

/// Arrays of arrays deeper than this are rejected (the format allows nesting; real files use 1).
const MAX_NESTING: u32 = 8;

impl<'a> Cursor<'a, '_> {
    fn remaining(&self) -> u64 {
        self.bytes.len() as u64 - self.pos
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], LoadError> {
        if n > self.remaining() {
            return Err(LoadError::Truncated {
                path: self.path.to_path_buf(),
                what: what.to_string(),
                needed: self.pos.saturating_add(n),
                len: self.bytes.len() as u64,
            });
        }
        let start = self.pos as usize;
        self.pos += n;
        Ok(&self.bytes[start..start + n as usize])
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], LoadError> {
        let s = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(s);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32, LoadError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, LoadError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Fails unless `count` items of at least `min_size` bytes fit in what is left.
    fn check_count(&self, count: u64, min_size: u64, what: &str) -> Result<(), LoadError> {
        if count.saturating_mul(min_size) > self.remaining() {
            return Err(LoadError::Truncated {
                path: self.path.to_path_buf(),
                what: format!("{what} {count}"),
                needed: self.pos.saturating_add(count.saturating_mul(min_size)),
                len: self.bytes.len() as u64,
            });
        }
        Ok(())
    }

    fn string(&mut self, what: &str) -> Result<String, LoadError> {
        let len = self.u64(what)?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| {
            LoadError::metadata(
                self.path,
                format!("{what} at byte {} is not UTF-8", self.pos),
            )
        })
    }

    fn value(&mut self, ty: u32, key: &str, depth: u32) -> Result<MetaValue, LoadError> {
        Ok(match ty {
            T_U8 => MetaValue::U8(u8::from_le_bytes(self.array(key)?)),
            T_I8 => MetaValue::I8(i8::from_le_bytes(self.array(key)?)),
            T_U16 => MetaValue::U16(u16::from_le_bytes(self.array(key)?)),
            T_I16 => MetaValue::I16(i16::from_le_bytes(self.array(key)?)),
            T_U32 => MetaValue::U32(u32::from_le_bytes(self.array(key)?)),
            T_I32 => MetaValue::I32(i32::from_le_bytes(self.array(key)?)),
            T_U64 => MetaValue::U64(u64::from_le_bytes(self.array(key)?)),
            T_I64 => MetaValue::I64(i64::from_le_bytes(self.array(key)?)),
            T_F32 => MetaValue::F32(f32::from_le_bytes(self.array(key)?)),
            T_F64 => MetaValue::F64(f64::from_le_bytes(self.array(key)?)),
            T_BOOL => match self.array::<1>(key)?[0] {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                b => {
                    return Err(LoadError::metadata(
                        self.path,
                        format!("{key}: bool byte {b} is neither 0 nor 1"),
                    ));
                }
            },
            T_STRING => MetaValue::String(self.string(key)?),
            T_ARRAY => {
                if depth >= MAX_NESTING {
                    return Err(LoadError::metadata(
                        self.path,
                        format!("{key}: arrays nested deeper than {MAX_NESTING}"),
                    ));
                }
                let item_ty = self.u32(key)?;
                let count = self.u64(key)?;
                self.check_count(count, min_value_size(item_ty), key)?;
                let mut items = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    items.push(self.value(item_ty, key, depth + 1)?);
                }
                MetaValue::Array(items)
            }
            other => {
                return Err(LoadError::metadata(
                    self.path,
                    format!("{key}: unknown metadata value type {other}"),
                ));
            }
        })
    }

    fn tensor_info(&mut self) -> Result<TensorInfo, LoadError> {
        let name = self.string("tensor name")?;
        let n_dims = self.u32("tensor dimension count")?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(LoadError::metadata(
                self.path,
                format!("tensor {name}: {n_dims} dimensions (ggml allows 1..={MAX_DIMS})"),
            ));
        }
        let mut ne = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            ne.push(self.u64("tensor dimension")?);
        }
        if ne
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .is_none()
        {
            return Err(LoadError::metadata(
                self.path,
                format!("tensor {name}: dimensions {ne:?} overflow"),
            ));
        }
        let type_id = self.u32("tensor type")?;
        let ggml_type = GgmlType::from_id(type_id).ok_or_else(|| LoadError::Dtype {
            path: self.path.to_path_buf(),
            tensor: name.clone(),
            dtype: format!("ggml type id {type_id}"),
        })?;
        let offset = self.u64("tensor offset")?;
        Ok(TensorInfo {
            name,
            ne,
            ggml_type,
            offset,
        })
    }
}

/// Smallest encoding of one value of type `ty` (used to reject impossible array lengths).
fn min_value_size(ty: u32) -> u64 {
    match ty {
        T_U8 | T_I8 | T_BOOL => 1,
        T_U16 | T_I16 => 2,
        T_U32 | T_I32 | T_F32 => 4,
        T_U64 | T_I64 | T_F64 | T_STRING => 8,
        T_ARRAY => 12,
        _ => 1,
    }
}
