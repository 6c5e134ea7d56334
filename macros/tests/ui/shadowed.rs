sov_macros::machine!("shadowed.toml", base = "source");

fn main() {}
