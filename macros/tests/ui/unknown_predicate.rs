sov_macros::machine!("unknown_predicate.toml", base = "source");

fn main() {}
