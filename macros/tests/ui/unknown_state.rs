sov_macros::machine!("unknown_state.toml", base = "source");

fn main() {}
