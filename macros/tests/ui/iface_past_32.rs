sov_macros::interface!("iface_past_32.toml", base = "source");

fn main() {}
