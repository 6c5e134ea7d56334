sov_macros::interface!("iface_overlap.toml", base = "source");

fn main() {}
