//! The sampling filters `sov generate` and `sov bench` share (top-p, top-k, min-p): one set of
//! flags, flattened into each command's arguments.

/// Which tokens a sampled request may draw from (`sov bench --url` sends each one that is set).
#[derive(clap::Args, Debug, Clone, Copy, PartialEq)]
pub struct FilterArgs {
    /// Nucleus sampling: keep the fewest most likely tokens whose probabilities reach this
    /// (1 = disabled).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Keep the K most likely tokens (0 = disabled).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Drop tokens less likely than this fraction of the most likely one (0 = disabled).
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
}

impl Default for FilterArgs {
    /// Every filter off.
    fn default() -> Self {
        Self {
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
        }
    }
}
