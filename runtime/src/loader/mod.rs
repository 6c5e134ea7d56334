//! Model loading: Hugging Face folders (safetensors, config.json, tokenizer.json) and GGUF files.

pub mod tensor;
