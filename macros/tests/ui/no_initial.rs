sov_macros::machine!("no_initial.toml", base = "source");

fn main() {}
