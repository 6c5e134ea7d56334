//! Chat templates: the Jinja template a model ships (`tokenizer_config.json` `chat_template` or
//! GGUF `tokenizer.chat_template`) rendered with minijinja.
//!
//! Design: rendered the way Hugging Face's `apply_chat_template` does: variables `messages`,
//! `add_generation_prompt`, `bos_token`, `eos_token`; a `raise_exception` function; Python string
//! methods (`.strip()`, `.startswith()`, ...) through minijinja-contrib's pycompat callback; no
//! whitespace trimming beyond what the template asks for.

use std::sync::Arc;

use minijinja::{Environment, ErrorKind, context};
use serde::{Deserialize, Serialize};

use super::error::LoadError;

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The message text.
    pub content: String,
}

impl ChatMessage {
    /// A message from `role` with `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template (cheap to clone: the environment is shared).
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    env: Arc<Environment<'static>>,
    source: String,
    bos_token: String,
    eos_token: String,
}

const NAME: &str = "chat";

impl ChatTemplate {
    /// Compiles `source`; `bos_token`/`eos_token` are the strings templates see as variables.
    pub fn new(source: String, bos_token: &str, eos_token: &str) -> Result<Self, LoadError> {
        let mut env = Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_template_owned(NAME, source.clone())
            .map_err(|e| LoadError::Template {
                message: format!("does not compile: {e:#}"),
            })?;
        Ok(ChatTemplate {
            env: Arc::new(env),
            source,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// The template text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages`, ending with the assistant header when `add_generation_prompt`.
    pub fn apply(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, LoadError> {
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| LoadError::Template {
                message: e.to_string(),
            })?;
        template
            .render(context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos_token,
                eos_token => self.eos_token,
            })
            .map_err(|e| LoadError::Template {
                message: format!("rendering failed: {e:#}"),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SmolLM2-135M-Instruct's template, as its GGUF and tokenizer_config.json carry it.
    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn smollm2_template_renders_like_transformers() {
        let t = ChatTemplate::new(SMOLLM2.into(), "<|im_start|>", "<|im_end|>").expect("compiles");
        let out = t
            .apply(
                &[ChatMessage::new("user", "What is the capital of France?")],
                true,
            )
            .expect("renders");
        assert_eq!(
            out,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging \
             Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n\
             <|im_start|>assistant\n"
        );
        let out = t
            .apply(
                &[
                    ChatMessage::new("system", "Be brief."),
                    ChatMessage::new("user", "Hi"),
                ],
                false,
            )
            .expect("renders");
        assert_eq!(
            out,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        );
    }

    #[test]
    fn python_methods_bos_and_raise_exception_work() {
        let src = "{{ bos_token }}{% for m in messages %}{% if m.role == 'bad' %}{{ raise_exception('bad role') }}{% endif %}{{ m.content.strip().upper() }}{% endfor %}";
        let t = ChatTemplate::new(src.into(), "<s>", "</s>").expect("compiles");
        assert_eq!(
            t.apply(&[ChatMessage::new("user", "  hi  ")], false)
                .expect("renders"),
            "<s>HI"
        );
        let err = t.apply(&[ChatMessage::new("bad", "x")], false).unwrap_err();
        assert!(err.to_string().contains("bad role"), "{err}");
        assert!(ChatTemplate::new("{% for %}".into(), "", "").is_err());
    }
}
