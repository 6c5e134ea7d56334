sov_macros::interface!("iface_duplicate.toml", base = "source");

fn main() {}
