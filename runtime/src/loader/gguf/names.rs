//! llama.cpp tensor names to Hugging Face names, and the inverse of llama.cpp's Q/K row permutation.
//!
//! Design: the name table is `gguf.constants.TENSOR_NAMES` / `tensor_mapping.py` of the `gguf`
//! Python package for the `llama` architecture. llama.cpp's converter (`convert_hf_to_gguf.py`,
//! `LlamaModel.permute`) reorders the rows of `q_proj`/`k_proj` (weights and biases) from
//! Hugging Face's "rotate half" RoPE layout to ggml's interleaved-pairs layout:
//! `w.reshape(n_head, 2, rows / n_head / 2, *rest).swapaxes(1, 2).reshape(w.shape)`.
//! [`unpermute_rows`] applies the inverse so the model sees Hugging Face's layout.

/// The Hugging Face name of llama.cpp tensor `name`, or `None` for a tensor sov does not use.
pub fn hf_name(name: &str) -> Option<String> {
    let fixed = match name {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(f.to_string());
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (part, suffix) = rest.rsplit_once('.')?;
    if suffix != "weight" && suffix != "bias" {
        return None;
    }
    let hf = match part {
        "attn_norm" => "input_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "ffn_norm" => "post_attention_layernorm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}.{suffix}"))
}

/// Which projection a llama.cpp tensor is, for the Q/K un-permutation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permuted {
    /// `attn_q`: permuted with `n_head` heads.
    Query,
    /// `attn_k`: permuted with `n_kv_head` heads.
    Key,
}

/// Whether llama.cpp permuted the rows of tensor `name`.
pub fn permuted(name: &str) -> Option<Permuted> {
    let part = name.strip_prefix("blk.")?.split('.').nth(1)?;
    match part {
        "attn_q" => Some(Permuted::Query),
        "attn_k" => Some(Permuted::Key),
        _ => None,
    }
}

/// Undoes `permute(w, n_head)` on a row-major `[rows, cols]` buffer (`cols` = 1 for a bias).
/// GGUF row `h*hd + i*2 + j` holds Hugging Face row `h*hd + j*(hd/2) + i`, where `hd = rows /
/// n_head`. Returns `None` when `rows` is not a multiple of `2 * n_head` or the buffer is not
/// `rows * cols` long.
pub fn unpermute_rows<T: Copy>(
    data: &[T],
    rows: usize,
    cols: usize,
    n_head: usize,
) -> Option<Vec<T>> {
    if n_head == 0 || !rows.is_multiple_of(2 * n_head) || data.len() != rows.checked_mul(cols)? {
        return None;
    }
    let head_rows = rows / n_head;
    let half = head_rows / 2;
    let mut out = Vec::with_capacity(data.len()); // [rows, cols], Hugging Face row order
    for h in 0..n_head {
        for j in 0..2 {
            for i in 0..half {
                let src = h * head_rows + i * 2 + j;
                out.extend_from_slice(&data[src * cols..(src + 1) * cols]);
            }
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_cpp_names_map_to_hugging_face_names() {
        let cases = [
            ("token_embd.weight", "model.embed_tokens.weight"),
            ("output.weight", "lm_head.weight"),
            ("output_norm.weight", "model.norm.weight"),
            (
                "blk.0.attn_norm.weight",
                "model.layers.0.input_layernorm.weight",
            ),
            (
                "blk.12.attn_q.weight",
                "model.layers.12.self_attn.q_proj.weight",
            ),
            ("blk.3.attn_k.bias", "model.layers.3.self_attn.k_proj.bias"),
            (
                "blk.3.attn_v.weight",
                "model.layers.3.self_attn.v_proj.weight",
            ),
            (
                "blk.3.attn_output.weight",
                "model.layers.3.self_attn.o_proj.weight",
            ),
            (
                "blk.29.ffn_norm.weight",
                "model.layers.29.post_attention_layernorm.weight",
            ),
            (
                "blk.1.ffn_gate.weight",
                "model.layers.1.mlp.gate_proj.weight",
            ),
            ("blk.1.ffn_up.weight", "model.layers.1.mlp.up_proj.weight"),
            (
                "blk.1.ffn_down.weight",
                "model.layers.1.mlp.down_proj.weight",
            ),
        ];
        for (gguf, hf) in cases {
            assert_eq!(hf_name(gguf).as_deref(), Some(hf), "{gguf}");
        }
        assert_eq!(hf_name("rope_freqs.weight"), None);
        assert_eq!(hf_name("blk.x.attn_q.weight"), None);
        assert_eq!(hf_name("blk.0.attn_q.scale"), None);
        assert_eq!(permuted("blk.7.attn_q.weight"), Some(Permuted::Query));
        assert_eq!(permuted("blk.7.attn_k.bias"), Some(Permuted::Key));
        assert_eq!(permuted("blk.7.attn_v.weight"), None);
    }

    /// A direct transcription of convert_hf_to_gguf.py's `permute` (reshape, swapaxes(1, 2),
    /// reshape) on row indices, written independently of `unpermute_rows`'s index formula.
    fn permute_like_llama_cpp(rows: usize, n_head: usize) -> Vec<usize> {
        let half = rows / n_head / 2;
        // Source tensor indexed [h][j][i] (shape n_head, 2, half); swapaxes gives [h][i][j].
        let mut out = Vec::new();
        for h in 0..n_head {
            for i in 0..half {
                for j in 0..2 {
                    out.push((h * 2 + j) * half + i);
                }
            }
        }
        out
    }

    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        for (rows, cols, n_head) in [(8, 3, 2), (24, 5, 3), (64, 1, 4), (12, 2, 1)] {
            let hf: Vec<u32> = (0..(rows * cols) as u32).collect();
            let permuted: Vec<u32> = permute_like_llama_cpp(rows, n_head)
                .into_iter()
                .flat_map(|r| hf[r * cols..(r + 1) * cols].to_vec())
                .collect();
            assert_ne!(
                permuted, hf,
                "permutation is not the identity for {rows}x{cols}"
            );
            let back = unpermute_rows(&permuted, rows, cols, n_head).expect("valid shape");
            assert_eq!(back, hf, "rows {rows} cols {cols} heads {n_head}");
        }
        assert!(unpermute_rows(&[0u8; 12], 6, 2, 2).is_none());
        assert!(unpermute_rows(&[0u8; 11], 4, 3, 2).is_none());
        assert!(unpermute_rows(&[0u8; 8], 4, 2, 0).is_none());
    }
}
