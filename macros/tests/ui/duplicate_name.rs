sov_macros::machine!("duplicate_name.toml", base = "source");

fn main() {}
