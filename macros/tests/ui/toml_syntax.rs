sov_macros::machine!("toml_syntax.toml", base = "source");

fn main() {}
