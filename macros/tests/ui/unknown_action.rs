sov_macros::machine!("unknown_action.toml", base = "source");

fn main() {}
