sov_macros::machine!("many_errors.toml", base = "source");

fn main() {}
