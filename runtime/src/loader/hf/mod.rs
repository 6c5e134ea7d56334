//! Hugging Face model folders: `config.json`, `model.safetensors` (or the shards of
//! `model.safetensors.index.json`), `tokenizer.json`, `tokenizer_config.json`,
//! `generation_config.json`, turned into a [`LoadedModel`]. Weights are bf16, f16 or f32, or FP8
//! in the compressed-tensors format ([`quant_config`], `crate::loader::fp8`).

pub mod config;
pub mod quant_config;
pub mod special;
pub mod weights;

#[cfg(test)]
mod fp8_tests;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::path::Path;

use super::chat_template::ChatTemplate;
use super::error::LoadError;
use super::tokenizer::Tokenizer;
use super::{LoadedModel, fp8, progress, validate};

/// Loads the Hugging Face folder `dir`; `progress` shows a progress bar on stderr.
pub fn load_hf(dir: &Path, progress: bool) -> Result<LoadedModel, LoadError> {
    let config_path = dir.join("config.json");
    let text = std::fs::read_to_string(&config_path).map_err(|e| LoadError::io(&config_path, e))?;
    let config = config::parse_config(&config_path, &text)?;

    let tokenizer_path = dir.join("tokenizer.json");
    let tokenizer = Tokenizer::from_file(&tokenizer_path)?;
    let special = special::read_special(dir, &tokenizer)?;

    let files = weights::weight_files(dir)?;
    let label = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let bar = progress::bytes_bar(weights::total_bytes(&files), &label, progress);
    let (mut tensors, mut fp8_codes) = (HashMap::new(), HashMap::new());
    for f in &files {
        weights::read_safetensors(f, &mut tensors, &mut fp8_codes, &bar)?;
    }
    bar.finish_and_clear();
    fp8::attach_scales(dir, fp8_codes, &mut tensors)?;
    validate::check_tensors(dir, &config, &tensors)?;

    let chat_template = special
        .chat_template
        .map(|src| {
            ChatTemplate::new(
                src,
                special.bos_token.as_deref().unwrap_or(""),
                special.eos_token.as_deref().unwrap_or(""),
            )
        })
        .transpose()?;
    let add_bos = special
        .bos_token_id
        .is_some_and(|bos| tokenizer.adds_bos(bos));
    let mut source_files = vec![config_path, tokenizer_path];
    for optional in ["tokenizer_config.json", "generation_config.json"] {
        let p = dir.join(optional);
        if p.is_file() {
            source_files.push(p);
        }
    }
    source_files.extend(files);

    Ok(LoadedModel {
        config,
        tensors,
        tokenizer,
        chat_template,
        eos_token_ids: special.eos_token_ids,
        bos_token_id: special.bos_token_id,
        add_bos,
        source_files,
        name: label,
    })
}
