sov_macros::machine!("enum_outside.toml", base = "source");

fn main() {}
