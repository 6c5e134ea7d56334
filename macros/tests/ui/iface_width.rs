sov_macros::interface!("iface_width.toml", base = "source");

fn main() {}
