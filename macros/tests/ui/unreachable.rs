sov_macros::machine!("unreachable.toml", base = "source");

fn main() {}
