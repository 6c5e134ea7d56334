sov_macros::machine!("guard_parse.toml", base = "source");

fn main() {}
