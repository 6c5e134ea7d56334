//! The loading progress bar (indicatif on stderr), or nothing when progress is off.

use indicatif::{ProgressBar, ProgressStyle};

/// A progress bar counting bytes of tensor data converted.
pub fn bytes_bar(total_bytes: u64, label: &str, enabled: bool) -> ProgressBar {
    if !enabled {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total_bytes);
    let style = ProgressStyle::with_template(
        "{prefix} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {msg}",
    )
    .map(|s| s.progress_chars("=> "))
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar.set_prefix(format!("loading {label}"));
    bar
}
