//! GGUF models (the llama.cpp / Ollama file format): one memory-mapped file holding metadata,
//! tokenizer and (possibly quantized) weights, turned into a [`LoadedModel`].
//!
//! Design: [`reader`] parses the header over the mmap, [`config`] and [`tokenizer`] read the
//! metadata, [`dequant`] turns each tensor into host data (quantized blocks stay blocks, see
//! [`quant`]), [`names`] maps llama.cpp names to Hugging Face names and undoes the Q/K row
//! permutation (on whole rows of blocks for quantized tensors), so the model code sees the same
//! tensors as from a Hugging Face folder.

pub mod blocks;
pub mod config;
pub mod dequant;
pub mod kquants;
pub mod names;
pub mod quant;
pub mod reader;
pub mod spm;
#[cfg(test)]
mod spm_tests;
pub mod tokenizer;
pub mod types;

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

use memmap2::Mmap;

use self::names::{Permuted, hf_name, permuted, unpermute_rows};
use self::quant::QuantData;
use self::reader::{Gguf, MetaValue, TensorInfo};
use super::chat_template::ChatTemplate;
use super::error::LoadError;
use super::tensor::{HostData, HostTensor};
use super::{LoadedModel, progress, validate};
use crate::loader::config::LlamaConfig;

/// Loads the GGUF file at `path`; `progress` shows a progress bar on stderr.
pub fn load_gguf(path: &Path, progress: bool) -> Result<LoadedModel, LoadError> {
    let file = File::open(path).map_err(|e| LoadError::io(path, e))?;
    // SAFETY: the map is read-only and sov never writes the file. If another process truncates
    // or rewrites it while it is mapped, reads may fault or see new bytes; that is memmap2's
    // documented caveat, accepted here as by every mmap-based model loader. The map lives only
    // for this function; tensors are copied out of it.
    let mmap = unsafe { Mmap::map(&file) }.map_err(|e| LoadError::io(path, e))?;
    let g = Gguf::parse(&mmap, path)?;

    let has_output = g.tensor("output.weight").is_some();
    let has_bias = g.tensor("blk.0.attn_q.bias").is_some();
    let mut config = config::llama_config(&g, has_output, has_bias)?;
    config.rope_scaling = rope_scaling(&g, &config)?;
    let (tokenizer, special) = tokenizer::tokenizer_from_gguf(&g)?;

    let used: Vec<(&TensorInfo, String)> = g
        .tensors
        .iter()
        .filter_map(|t| hf_name(&t.name).map(|hf| (t, hf)))
        .collect();
    let total: u64 = used
        .iter()
        .filter_map(|(t, _)| t.ggml_type.byte_size(&t.ne))
        .sum();
    let label = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let bar = progress::bytes_bar(total, &label, progress);
    let mut tensors = HashMap::with_capacity(used.len());
    for (info, hf) in used {
        let tensor = load_tensor(&g, info, &config)?;
        bar.inc(g.tensor_bytes(info)?.len() as u64);
        tensors.insert(hf, tensor);
    }
    bar.finish_and_clear();
    validate::check_tensors(path, &config, &tensors)?;

    let token_text = |id: Option<u32>| {
        id.and_then(|i| tokenizer.id_to_token(i))
            .unwrap_or_default()
    };
    let chat_template = match g.get("tokenizer.chat_template") {
        None => None,
        Some(MetaValue::String(src)) => Some(ChatTemplate::new(
            src.clone(),
            &token_text(special.bos),
            &token_text(special.eos),
        )?),
        Some(other) => {
            return Err(LoadError::metadata(
                path,
                format!("tokenizer.chat_template is not a string: {other:?}"),
            ));
        }
    };

    let mut eos_token_ids: Vec<u32> = special.eos.into_iter().collect();
    for key in ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
        if let Some(id) = g.get(key).and_then(MetaValue::as_u64) {
            let id = u32::try_from(id).map_err(|_| {
                LoadError::metadata(path, format!("{key} = {id} is not a token id"))
            })?;
            if !eos_token_ids.contains(&id) {
                eos_token_ids.push(id);
            }
        }
    }
    let name = g
        .get("general.name")
        .and_then(MetaValue::as_str)
        .map(str::to_string)
        .or_else(|| path.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .unwrap_or_default();

    Ok(LoadedModel {
        config,
        tensors,
        tokenizer,
        chat_template,
        eos_token_ids,
        bos_token_id: special.bos,
        add_bos: special.add_bos,
        source_files: vec![path.to_path_buf()],
        name,
    })
}

/// Reads one tensor and, for Q and K projections, restores Hugging Face's row order.
fn load_tensor(
    g: &Gguf<'_>,
    info: &TensorInfo,
    config: &LlamaConfig,
) -> Result<HostTensor, LoadError> {
    let dtype_error = || LoadError::Dtype {
        path: g.path.clone(),
        tensor: info.name.clone(),
        dtype: info.ggml_type.name().to_string(),
    };
    if !info.ggml_type.is_supported() {
        return Err(dtype_error());
    }
    let bytes = g.tensor_bytes(info)?;
    let numel = usize::try_from(info.numel()).map_err(|_| dtype_error())?;
    let data = dequant::dequantize(info.ggml_type, bytes, numel).ok_or_else(dtype_error)?;
    let shape = info.shape();
    let data = match permuted(&info.name) {
        None => data,
        Some(which) => {
            let heads = match which {
                Permuted::Query => config.num_attention_heads,
                Permuted::Key => config.num_key_value_heads,
            };
            let rows = shape[0];
            let cols = shape.get(1).copied().unwrap_or(1);
            unpermute(data, rows, cols, heads).ok_or_else(|| {
                LoadError::metadata(
                    &g.path,
                    format!(
                        "tensor {}: shape {shape:?} cannot hold {heads} heads of even size",
                        info.name
                    ),
                )
            })?
        }
    };
    Ok(HostTensor { shape, data })
}

fn unpermute(data: HostData, rows: usize, cols: usize, heads: usize) -> Option<HostData> {
    Some(match data {
        HostData::F32(v) => HostData::F32(unpermute_rows(&v, rows, cols, heads)?),
        HostData::F16(v) => HostData::F16(unpermute_rows(&v, rows, cols, heads)?),
        HostData::BF16(v) => HostData::BF16(unpermute_rows(&v, rows, cols, heads)?),
        HostData::Quant(q) => {
            // Blocks run along rows, so a row of `cols` values is `row_bytes` contiguous bytes.
            let row_bytes = q.ty.bytes_for(cols)?;
            HostData::Quant(QuantData {
                ty: q.ty,
                bytes: unpermute_rows(&q.bytes, rows, row_bytes, heads)?,
            })
        }
        // GGUF has no FP8 type; kept total so every `HostData` unpermutes.
        HostData::Fp8(q) => HostData::Fp8(crate::loader::fp8::Fp8Rows {
            codes: unpermute_rows(&q.codes, rows, cols, heads)?,
            scales: unpermute_rows(&q.scales, rows, 1, heads)?,
        }),
    })
}

/// RoPE scaling from the `rope_freqs` tensor (Llama 3.1) or `{arch}.rope.scaling.type` keys.
fn rope_scaling(
    g: &Gguf<'_>,
    config: &LlamaConfig,
) -> Result<Option<crate::loader::config::RopeScaling>, LoadError> {
    let scaling_type = g
        .get("llama.rope.scaling.type")
        .and_then(MetaValue::as_str)
        .unwrap_or("none");
    if scaling_type != "none" && scaling_type != "llama3" {
        return Err(LoadError::metadata(
            &g.path,
            format!("llama.rope.scaling.type {scaling_type:?} is not supported"),
        ));
    }
    let Some(info) = g.tensor("rope_freqs.weight") else {
        return Ok(None);
    };
    let bytes = g.tensor_bytes(info)?;
    let numel = usize::try_from(info.numel()).unwrap_or(usize::MAX);
    let freqs = dequant::dequantize(info.ggml_type, bytes, numel)
        .map(|d| {
            HostTensor {
                shape: vec![numel],
                data: d,
            }
            .to_f32()
        })
        .ok_or_else(|| LoadError::Dtype {
            path: g.path.clone(),
            tensor: info.name.clone(),
            dtype: info.ggml_type.name().to_string(),
        })?;
    config::rope_scaling_from_freqs(&g.path, &freqs, config.head_dim, config.rope_theta).map(Some)
}

#[cfg(test)]
mod tests;
