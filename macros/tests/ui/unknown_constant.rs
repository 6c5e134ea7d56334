sov_macros::machine!("unknown_constant.toml", base = "source");

fn main() {}
