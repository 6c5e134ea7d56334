sov_macros::machine!("unknown_slot.toml", base = "source");

fn main() {}
