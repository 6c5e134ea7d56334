//! Tensors from `.safetensors` files (one file, or the shards an index names), memory-mapped and
//! copied into [`HostTensor`]s.
//!
//! Design: the `safetensors` crate validates the header and offsets over an mmap; we convert F32,
//! F16 and BF16 (little-endian, as the format defines), keep F8_E4M3 codes apart until their
//! scales are attached (`crate::loader::fp8`), and name every other dtype in the error.
//! A file shorter than its header promises is reported as truncated with the byte count it needs.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use indicatif::ProgressBar;
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensorError, SafeTensors};
use serde_json::Value;

use crate::loader::error::LoadError;
use crate::loader::fp8::Fp8Codes;
use crate::loader::tensor::{HostData, HostTensor};

/// The safetensors files of a model folder: the shards listed by `model.safetensors.index.json`
/// (in first-use order), else `model.safetensors`.
pub fn weight_files(dir: &Path) -> Result<Vec<PathBuf>, LoadError> {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let text = std::fs::read_to_string(&index).map_err(|e| LoadError::io(&index, e))?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| LoadError::metadata(&index, format!("not valid JSON: {e}")))?;
        let map = v
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| LoadError::metadata(&index, "no weight_map object"))?;
        let mut files: Vec<PathBuf> = Vec::new();
        for (tensor, file) in map {
            let file = file.as_str().ok_or_else(|| {
                LoadError::metadata(&index, format!("weight_map[{tensor:?}] is not a file name"))
            })?;
            if file.contains('/') || file.contains('\\') || file.contains("..") {
                return Err(LoadError::metadata(
                    &index,
                    format!("weight_map[{tensor:?}] = {file:?} is not a plain file name"),
                ));
            }
            let path = dir.join(file);
            if !files.contains(&path) {
                files.push(path);
            }
        }
        return Ok(files);
    }
    let single = dir.join("model.safetensors");
    if single.is_file() {
        Ok(vec![single])
    } else {
        Err(LoadError::Missing { path: single })
    }
}

/// Total bytes of `files` (for the progress bar).
pub fn total_bytes(files: &[PathBuf]) -> u64 {
    files
        .iter()
        .filter_map(|f| std::fs::metadata(f).ok())
        .map(|m| m.len())
        .sum()
}

/// Reads every tensor of `path` into `out`, F8_E4M3 ones into `fp8` (their scales may sit in
/// another shard), advancing `bar` by the bytes read.
pub fn read_safetensors(
    path: &Path,
    out: &mut HashMap<String, HostTensor>,
    fp8: &mut HashMap<String, Fp8Codes>,
    bar: &ProgressBar,
) -> Result<(), LoadError> {
    let file = File::open(path).map_err(|e| LoadError::io(path, e))?;
    // SAFETY: the map is read-only and sov never writes the file. If another process truncates
    // or rewrites it while it is mapped, reads may fault or see new bytes; that is memmap2's
    // documented caveat, accepted here as by every mmap-based model loader. Tensors are copied
    // out before the map is dropped at the end of this function.
    let mmap = unsafe { Mmap::map(&file) }.map_err(|e| LoadError::io(path, e))?;
    let st = SafeTensors::deserialize(&mmap).map_err(|e| safetensors_error(path, &mmap, e))?;
    for (name, view) in st.iter() {
        let bytes = view.data();
        let data = match view.dtype() {
            Dtype::F32 => HostData::F32(
                bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
            ),
            Dtype::F16 => HostData::F16(
                bytes
                    .chunks_exact(2)
                    .map(|b| f16::from_le_bytes([b[0], b[1]]))
                    .collect(),
            ),
            Dtype::BF16 => HostData::BF16(
                bytes
                    .chunks_exact(2)
                    .map(|b| bf16::from_le_bytes([b[0], b[1]]))
                    .collect(),
            ),
            Dtype::F8_E4M3 => {
                let codes = Fp8Codes {
                    shape: view.shape().to_vec(),
                    codes: bytes.to_vec(),
                };
                fp8.insert(name.to_string(), codes);
                bar.inc(bytes.len() as u64);
                continue;
            }
            other => {
                return Err(LoadError::Dtype {
                    path: path.to_path_buf(),
                    tensor: name.to_string(),
                    dtype: format!("{other:?}"),
                });
            }
        };
        bar.inc(bytes.len() as u64);
        out.insert(
            name.to_string(),
            HostTensor {
                shape: view.shape().to_vec(),
                data,
            },
        );
    }
    Ok(())
}

/// A `LoadError` for a safetensors parse failure, naming truncation as such.
fn safetensors_error(path: &Path, bytes: &[u8], e: SafeTensorError) -> LoadError {
    let len = bytes.len() as u64;
    let truncated = |needed: u64, what: &str| LoadError::Truncated {
        path: path.to_path_buf(),
        what: what.to_string(),
        needed,
        len,
    };
    match e {
        SafeTensorError::HeaderTooSmall => truncated(8, "safetensors header length"),
        SafeTensorError::InvalidHeaderLength | SafeTensorError::MetadataIncompleteBuffer => {
            match declared_size(bytes) {
                Some(needed) if needed > len => truncated(needed, "safetensors data"),
                _ => LoadError::metadata(path, format!("invalid safetensors file: {e}")),
            }
        }
        other => LoadError::metadata(path, format!("invalid safetensors file: {other}")),
    }
}

/// The file size a safetensors header declares (8 + header + the largest data offset), when the
/// header itself is readable.
fn declared_size(bytes: &[u8]) -> Option<u64> {
    let n = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
    let header_end = 8u64.checked_add(n)?;
    let Some(header) = bytes.get(8..usize::try_from(header_end).ok()?) else {
        return Some(header_end);
    };
    let v: Value = serde_json::from_slice(header).ok()?;
    let data_end = v
        .as_object()?
        .values()
        .filter_map(|t| t.get("data_offsets")?.get(1)?.as_u64())
        .max()
        .unwrap_or(0);
    header_end.checked_add(data_end)
}
